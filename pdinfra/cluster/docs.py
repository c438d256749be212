"""Docs generated from the schema: docs/variables.md and the variable table of every role's README.

``python -m pdinfra.cluster.docs --write`` rewrites them; ``--check`` (and tests/unit/test_docs_generated.py)
fails when a file drifted from the schema, the roles' argument specs or their defaults. The check catalog of
docs/validation.md belongs to the host layer, which this one may not import: ``python -m pdinfra.host.docs``
rewrites these files and that one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from pdinfra import paths
from pdinfra.cluster import kvshape, models, profiles, schema
from pdinfra.cluster.schema import Var

BEGIN = "<!-- variables: generated from meta/argument_specs.yml and defaults/main.yml by pdinfra.cluster.docs -->"
END = "<!-- /variables -->"
VARIABLES_MD = paths.REPO / "docs" / "variables.md"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _code(value: object) -> str:
    if isinstance(value, str):
        text = value
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
    if len(text) > 70:
        text = text[:67] + "..."
    return f"`{_cell(text)}`" if text != "" else '`""`'


def _allowed(var: Var) -> str:
    parts = []
    if var.choices:
        parts.append(", ".join(f"`{c}`" for c in var.choices))
    if var.type == "port":
        parts.append("1..65535")
    elif var.min is not None or var.max is not None:
        parts.append(f"{var.min if var.min is not None else ''}..{var.max if var.max is not None else ''}")
    if var.unit is not None and var.unit not in ("count", "number", "port"):
        parts.append(schema.UNITS[var.unit])
    if var.strict and var.type in ("int", "bool"):
        parts.append("unquoted")
    if var.format:
        parts.append(schema.FORMATS[var.format][1].split(" (")[0])
    if var.secret:
        parts.append("secret")
    return "; ".join(parts)


def _var_table(variables: tuple[Var, ...], with_scope: bool = True) -> list[str]:
    head = "| variable | type | default | allowed | " + ("scope | " if with_scope else "") + "meaning |"
    lines = [head, "|" + " --- |" * (5 + with_scope)]
    for v in variables:
        default = v.default_doc
        lines.append(
            f"| `{v.name}` | {v.type} | {_cell(default)} | {_cell(_allowed(v))} | "
            + (f"{v.scope} | " if with_scope else "")
            + f"{_cell(v.description)} |"
        )
    return lines


def role_table(role: str) -> str:
    rs = schema.role_schemas()[role]
    lines = ["| variable | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, rv in rs.variables.items():
        if rv.has_default:
            default = _code(rv.default)
        elif "default" in rv.spec:
            default = _code(rv.spec["default"])
        else:
            default = "required" if rv.spec.get("required") else "-"
        meaning = rv.description
        if rv.spec.get("choices"):
            meaning += " One of " + ", ".join(f"`{c}`" for c in rv.spec["choices"]) + "."
        if name in schema.ROLE_RULES:
            meaning += " " + schema.ROLE_RULES[name].describe()
        if name in schema.DERIVED_ROLE_VARS:
            meaning += f" From the cluster model: set `{schema.DERIVED_ROLE_VARS[name]}` instead."
        lines.append(f"| `{name}` | {rv.type} | {default} | {_cell(meaning)} |")
    return "\n".join([BEGIN, *lines, END])


def variables_md() -> str:
    out = [
        "# Inventory variables",
        "",
        "Generated from the schema (`pdinfra/cluster/schema.py`), the hardware profiles and each role's",
        "`meta/argument_specs.yml` and `defaults/main.yml` by `python -m pdinfra.cluster.docs --write`; a test fails",
        "when this file drifts. `pdinfra check-config -i INVENTORY` resolves and checks all of them before any host",
        "is touched (the first play of `site.yml` runs the same check); every default is applied once, there.",
        "",
        "Scope: `cluster` values must be the same on every PD host (set them in `group_vars`); `host` values are per",
        "host (`host_vars`); `router` values are read on the router host.",
        "",
        "## pdinfra",
        "",
        *_var_table(schema.PDINFRA_VARS),
        "",
    ]
    for var in schema.PDINFRA_VARS:
        if var.fields:
            what = "each item of" if var.type == "list" else "keys of"
            out += [f"### {what} `{var.name}`", "", *_var_table(var.fields, with_scope=False), ""]
    out += [
        "## Hardware profiles (`pdinfra_hardware`)",
        "",
        "What the validator and the preflight role expect of a host; `pdinfra_expect` overrides single keys. The",
        "rails' MTU comes from `rdma_roce_mtu`, the driver version from `nvidia_driver_version`. The price is an",
        "indicative public list price (its source beside it), not a quote: `pdinfra_price` replaces it.",
        "",
        "| profile | expectations | rails | meaning | indicative price |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in profiles.PROFILES.values():
        rails = f"{p.rail_count} x {p.rail_speed_mbps // 1000} Gb/s" if p.rail_speed_mbps and p.rail_count else "-"
        price = _cell(p.price.describe()) if p.price else "none (set `pdinfra_price`)"
        out.append(f"| `{p.name}` | {_code(p.expect)} | {rails} | {_cell(p.description)} | {price} |")
    out += [
        "",
        "## Model shapes (`pdinfra_model.shape`)",
        "",
        "| shape | layers | KV heads | attention heads | head dim | dtype |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in kvshape.PRESETS.values():
        out.append(
            f"| `{s.name}` | {s.num_layers} | {s.num_kv_heads} | {s.num_attention_heads} | {s.head_dim} | {s.dtype} |"
        )
    out += [
        "",
        "## Model catalog (`pdinfra.cluster.models`)",
        "",
        "`pdinfra check-config` finds the model by `pdinfra_model.hf_id`, else by `shape` (source `tiny`: the tiny",
        "model; source `controller_dir`: its own `config.json` on the controller), and compares",
        "`pdinfra_max_model_len` with its context, each instance's `tensor_parallel_size` with its heads, `shape` with",
        "its geometry and the chat template the smoke needs. A model it does not know is said to be unknown, not",
        "guessed from its name.",
        "",
        "| model | id | context (tokens) | layers | attention heads | KV heads | head dim | chat template | source |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in models.CATALOG.values():
        chat = "yes" if m.chat_template else "no"
        out.append(
            f"| `{m.name}` | {_cell(m.hf_id)} | {m.context_length} | {m.num_layers} | {m.num_attention_heads} | "
            f"{m.num_kv_heads} | {m.head_dim} | {chat} | {_cell(m.source)} |"
        )
    for role in schema.ROLES:
        out += ["", f"## Role `{role}` (roles/{role}/README.md)", "", *role_table(role).splitlines()[1:-1]]
    return "\n".join(out) + "\n"


def readme_with_table(role: str, text: str) -> str:
    table = role_table(role)
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        return text[:start] + table + text[end:]
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("## Variables"))
    first = next(i for i in range(head + 1, len(lines)) if lines[i].startswith("|"))
    last = first
    while last + 1 < len(lines) and lines[last + 1].startswith("|"):
        last += 1
    return "\n".join([*lines[:first], table, *lines[last + 1 :]]) + "\n"


RECORD_DIRS = ("runs", "reports")  # under docs/: dated run records and benchmark reports, raw and kept as run
DOCS_DIR = paths.REPO / "docs"
RUNS_INDEX_MD = DOCS_DIR / "runs" / "README.md"


def _heading(path: Path) -> str:
    """The first Markdown heading of a file, else its first non-empty line (a .txt record), else ""."""
    try:
        lines = [x.strip() for x in path.read_text(encoding="utf-8", errors="replace").splitlines()[:40]]
    except OSError:
        return ""
    for line in lines:
        if line.startswith("# "):
            return line[2:].strip()
    if path.suffix == ".txt":  # a console record: its first line says what ran
        first = next((x for x in lines if x), "")
        return first if len(first) <= 140 else first[:137] + "..."
    return ""


def record_entries(docs: Path) -> list[tuple[str, str, list[str], str]]:
    """(date, name, files relative to docs/runs, title) per record: the files and directory sharing one stem."""
    out = []
    for sub in RECORD_DIRS:
        base = docs / sub
        stems: dict[str, list[Path]] = {}
        for p in sorted(base.iterdir()):
            if p.name == "README.md" or p.name.startswith("."):
                continue
            stem = p.name if p.is_dir() else p.name.split(".", 1)[0]
            stems.setdefault(stem, []).append(p)
        for stem, group in stems.items():
            group.sort(key=lambda p: (p.suffix != ".md", p.suffix != ".txt", not p.is_dir(), p.name))  # .md leads
            candidates = [p for p in group if p.suffix in (".md", ".txt")]
            for d in (p for p in group if p.is_dir()):
                candidates += [d / "README.md", d / "report.md", *sorted(d.glob("*.md"))]
            title = next((t for t in map(_heading, candidates) if t), "")
            rel = [("" if sub == "runs" else "../reports/") + p.name + ("/" if p.is_dir() else "") for p in group]
            out.append((stem[:10], stem, rel, title))
    return sorted(out, key=lambda e: (e[0], e[1]))


def runs_index_md(docs: Path | None = None) -> str:
    docs = docs or DOCS_DIR
    lines = [
        "# Run records",
        "",
        "Every figure the README and the guides quote comes from one of these: the command, the date, the machine and",
        "the raw output, kept as they were recorded (docs/reports holds the benchmark reports, which `pdinfra bench",
        "report` can rebuild from their runs). Generated by `python -m pdinfra.cluster.docs --write` from the records'",
        "own headings; a test fails when it drifts. Newest last.",
        "",
        "| date | record | what | files |",
        "| --- | --- | --- | --- |",
    ]
    for date, name, files, title in record_entries(docs):
        first = files[0]
        link = f"[{name}]({first})"
        others = ", ".join(f"[{f.rsplit('.', 1)[-1] if not f.endswith('/') else 'dir'}]({f})" for f in files[1:])
        what = title.replace("|", "/").replace("<", "&lt;") or "(no heading)"
        lines.append(f"| {date} | {link} | {what} | {others} |")
    return "\n".join(lines) + "\n"


def targets() -> dict[Path, str]:
    out = {VARIABLES_MD: variables_md(), RUNS_INDEX_MD: runs_index_md()}  # the index: issue 27, item 2
    for role in schema.ROLES:
        readme = schema.roles_dir() / role / "README.md"
        out[readme] = readme_with_table(role, readme.read_text(encoding="utf-8"))
    return out


def main(
    argv: list[str] | None = None, generate: Callable[[], dict[Path, str]] | None = None, description: str = ""
) -> int:
    """``generate`` (default: :func:`targets`) gives each generated file's text; a later layer passes its own
    (:mod:`pdinfra.host.docs` adds docs/validation.md)."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the files")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = parser.parse_args(argv)
    drifted = []
    for path, text in (generate or targets)().items():
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            drifted.append(path)
            if args.write:
                path.write_text(text, encoding="utf-8")
    for p in drifted:
        print(f"{'rewrote' if args.write else 'differs'}: {p}")
    return 1 if drifted and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
