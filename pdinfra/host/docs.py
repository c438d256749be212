"""Docs generated from the host layer: the check catalog of docs/validation.md, and every file of
:mod:`pdinfra.cluster.docs` (docs/variables.md, the roles' variable tables).

``python -m pdinfra.host.docs --write`` rewrites them all; ``--check`` (and tests/unit/test_docs_generated.py)
fails when one drifted. The catalog table comes from the check registry (:mod:`pdinfra.host.checks`): each
check's id, layer and title, and the ``Reads:``, ``Rule:`` and ``Remedy:`` paragraphs of its function's docstring.
The rest of docs/validation.md, outside the markers, is written by hand.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdinfra import paths
from pdinfra.cluster import docs as cluster_docs
from pdinfra.host import checks

BEGIN = "<!-- checks: generated from the check catalog (pdinfra/host/checks/) by pdinfra.host.docs -->"
END = "<!-- /checks -->"
VALIDATION_MD = paths.REPO / "docs" / "validation.md"
FIELDS = ("Reads", "Rule", "Remedy")


def check_doc(fn: Callable[..., Any]) -> dict[str, str]:
    """The ``Reads:``, ``Rule:`` and ``Remedy:`` paragraphs of a check function's docstring, each on one line.
    Other paragraphs (a rationale) are for the code's readers and are left out."""
    paragraphs = inspect.cleandoc(fn.__doc__ or "").split("\n\n")
    out = {}
    for para in paragraphs:
        label, sep, text = para.partition(": ")
        if sep and label in FIELDS:
            out[label] = " ".join(text.split())
    missing = [f for f in FIELDS if not out.get(f)]
    if missing:
        where = f"{fn.__module__}.{getattr(fn, '__qualname__', fn)}"
        raise ValueError(f"{where}: the docstring lacks a {', '.join(m + ':' for m in missing)} paragraph")
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def catalog_rows() -> list[tuple[str, str, str, dict[str, str]]]:
    """(id, layer, title, docstring fields) of every check: the catalog in its order, then the fleet checks."""
    rows = [(c.id, c.layer, c.title, check_doc(c.fn)) for c in checks.CATALOG]
    fleet = zip(checks.FLEET_CHECKS, checks.FLEET_FUNCTIONS, strict=True)
    return rows + [(cid, "fleet", title, check_doc(fn)) for (cid, title), fn in fleet]


def catalog_table() -> str:
    lines = [
        BEGIN,
        "In the order `pdinfra validate` reports them, the fleet checks last. Generated from the check functions",
        "(their title and the `Reads:`, `Rule:` and `Remedy:` paragraphs of their docstrings) by",
        "`python -m pdinfra.host.docs --write`; a test fails when this table drifts from the code.",
        "",
        "| id | layer | checks | reads | pass / fail rule | remedy on failure |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cid, layer, title, doc in catalog_rows():
        cells = [f"`{cid}`", layer, title, doc["Reads"], doc["Rule"], doc["Remedy"]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join([*lines, END])


def validation_md(text: str) -> str:
    """docs/validation.md with the generated catalog between its markers (the rest is kept as it is)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{VALIDATION_MD}: no {BEGIN} ... {END} markers for the check catalog")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + catalog_table() + text[end:]


def targets() -> dict[Path, str]:
    out = cluster_docs.targets()
    out[VALIDATION_MD] = validation_md(VALIDATION_MD.read_text(encoding="utf-8"))
    return out


def main(argv: list[str] | None = None) -> int:
    return cluster_docs.main(argv, targets, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
