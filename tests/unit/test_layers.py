"""The package is split by layer, and data flows one way: no module imports a later layer.

inventory -> cluster model -> host facts and checks -> transfer -> serving -> bench -> test hosts -> CLI.
``paths`` and ``playbook`` (run Ansible with the project's configuration) are the base every layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "pdinfra"
LAYERS = ["base", "cluster", "host", "transfer", "serving", "bench", "testhosts", "cli"]
BASE_MODULES = {"paths", "playbook", "__init__", "__main__"}


def layer_of(module: str) -> str:
    """pdinfra.cluster.model -> cluster; pdinfra.paths -> base."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in BASE_MODULES:
        return "base" if parts[-1] != "__main__" else "cli"
    return parts[1]


def imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pdinfra"):
            if node.module == "pdinfra":
                out += [(f"pdinfra.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("pdinfra")]
    return out


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def test_every_module_belongs_to_a_known_layer():
    unknown = {m: layer_of(m) for m, _ in modules() if layer_of(m) not in LAYERS}
    assert not unknown, f"modules outside the layers {LAYERS}: {unknown}"


def test_no_module_imports_a_later_layer():
    bad = []
    for module, path in modules():
        mine = LAYERS.index(layer_of(module))
        for target, line in imports(path):
            theirs = LAYERS.index(layer_of(target)) if layer_of(target) in LAYERS else None
            if theirs is not None and theirs > mine:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: {module} ({LAYERS[mine]}) imports {target} "
                           f"({LAYERS[theirs]})")  # fmt: skip
    assert not bad, "\n".join(bad)


FACT_PARTS = ("facts", "facts_base", "facts_gpu", "facts_net")


def test_host_facts_stay_free_of_pdinfra_imports():
    """facts.py and its parts are also the Ansible module pdinfra_facts (module_utils links to them): they import
    each other and the standard library only."""
    for part in FACT_PARTS:
        others = {t for t, _line in imports(PKG / "host" / f"{part}.py")}
        assert others <= {f"pdinfra.host.{p}" for p in FACT_PARTS}, (part, others)


def test_the_checker_sees_a_violation(tmp_path):
    """The rule can fail: a cluster module importing the bench is reported."""
    bad = tmp_path / "pdinfra" / "cluster" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from pdinfra.bench import plan\n")
    (target,) = imports(bad)
    assert LAYERS.index(layer_of(target[0])) > LAYERS.index(layer_of("pdinfra.cluster.bad"))


def test_the_architecture_document_states_the_enforced_layer_order():
    """docs/architecture.md's layer table: its rows in LAYERS' order, and each layer may import exactly the layers
    before it (the rule test_no_module_imports_a_later_layer enforces)."""
    import re

    text = (PKG.parent / "docs" / "architecture.md").read_text()
    table = text.split("| layer | may import | touches |", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:] if line.startswith("|")]
    names = [re.match(r"`(\w+)`", r[0]).group(1) for r in rows]
    assert names == LAYERS, names
    for i, (name, (_, may, _touches)) in enumerate(zip(names, rows, strict=True)):
        if may == "base only" or may == "every layer":
            allowed = ["base"] if may == "base only" else LAYERS[:i]
        elif m := re.fullmatch(r"base to (\w+)", may):
            allowed = LAYERS[: LAYERS.index(m.group(1)) + 1]
        else:
            allowed = [x.strip() for x in may.split(",")]
        assert allowed == (LAYERS[:i] or ["base"]), (name, may)
