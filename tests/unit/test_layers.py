"""The package is split by layer, and data flows one way: no module imports a later layer.

inventory -> cluster model -> host facts and checks -> transfer -> serving -> bench -> test hosts -> CLI.
``paths`` and ``playbook`` (run Ansible with the project's configuration) are the base every layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "pdinfra"
LAYERS = ["base", "cluster", "host", "transfer", "serving", "bench", "testhosts", "cli"]
BASE_MODULES = {"paths", "playbook", "collection", "__init__", "__main__"}


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
                bad.append(
                    f"{path.relative_to(PKG.parent)}:{line}: {module} ({LAYERS[mine]}) imports {target} "
                    f"({LAYERS[theirs]})"
                )
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


# ------------------------------------------------------------------ one import path per name (issue 41)
def _graph() -> dict[str, set[str]]:
    """Module -> the pdinfra modules it imports (at any depth of the file: a lazy import is still an edge)."""
    mods = dict(modules())

    def target(name: str) -> str | None:
        for cand in (name, f"{name}.__init__"):
            if cand in mods:
                return cand
        return None

    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pdinfra"):
                for a in node.names:
                    t = target(f"{node.module}.{a.name}") or target(node.module)
                    if t:
                        edges.add(t)
            elif isinstance(node, ast.Import):
                edges |= {t for a in node.names if (t := target(a.name))}
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    found = cycles(_graph())
    assert not found, f"modules that import each other: {found}"


def test_the_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def private_imports(path: Path, module: str, root: Path = PKG.parent) -> list[str]:
    """``from pdinfra.x import _name`` of another module's private name (a test may; the product may not)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != module:
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{path.relative_to(root)}:{node.lineno}: {a.name} from {node.module}")
    return out


def test_no_private_name_crosses_a_module():
    bad = [line for module, path in modules() for line in private_imports(path, module)]
    for plugin in (*PKG.parent.glob("filter_plugins/*.py"), *PKG.parent.glob("action_plugins/*.py")):
        bad += private_imports(plugin, "")
    assert not bad, "\n".join(bad)


def test_the_private_import_check_sees_one(tmp_path):
    bad = tmp_path / "pdinfra" / "x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from pdinfra.cluster.resolve_hosts import _secret\n")
    (found,) = private_imports(bad, "pdinfra.x", root=tmp_path)
    assert found == "pdinfra/x.py:1: _secret from pdinfra.cluster.resolve_hosts"


CLI_FUNCTION_LINES = 60  # docs/architecture.md: a command parses its options, calls a workflow and prints


def long_functions(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > CLI_FUNCTION_LINES:
                out.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    return out


def test_cli_functions_are_short():
    bad = [x for path in sorted((PKG / "cli").glob("*.py")) for x in long_functions(path)]
    assert not bad, f"over {CLI_FUNCTION_LINES} lines (move the work into its layer): {bad}"


def test_the_length_check_sees_a_long_function(tmp_path):
    f = tmp_path / "long.py"
    f.write_text("def f():\n" + "    x = 1\n" * CLI_FUNCTION_LINES)
    assert long_functions(f) == [f"long.py:1 f: {CLI_FUNCTION_LINES + 1} lines"]


# Modules split by size that once re-exported each other's names: each name now has one import path.
SPLIT_MODULES = (
    "cluster/resolve.py",
    "transfer/acceptance/__init__.py",
    "bench/analysis.py",
    "bench/report.py",
    "bench/plan.py",
)


def test_no_re_export_shims():
    """No ``# noqa: F401`` import (a name imported only to be offered again) in the modules that were split."""
    bad = [m for m in SPLIT_MODULES if "noqa: F401" in (PKG / m).read_text(encoding="utf-8")]
    assert not bad, bad
