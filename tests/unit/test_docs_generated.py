"""Docs and roles follow the schema: generated variable docs do not drift, roles read only the resolved model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pdinfra.cluster import docs, schema
from pdinfra.host import checks
from pdinfra.host import docs as host_docs

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = {"pdinfra_cluster", "pdinfra_node", "pdinfra_secrets", "pdinfra_host"}
JINJA = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}", re.S)
BARE_KEYS = ("when", "that", "until", "changed_when", "failed_when", "loop")


def test_variables_md_and_role_readmes_are_generated_from_the_schema():
    drifted = [str(p.relative_to(REPO)) for p, text in docs.targets().items() if p.read_text() != text]
    assert not drifted, f"regenerate with `python -m pdinfra.cluster.docs --write`: {drifted}"


def test_validation_md_catalog_is_generated_from_the_checks():
    """docs/validation.md's catalog table is the registry's: every check (and fleet check) with its title and the
    Reads/Rule/Remedy of its docstring, in catalog order."""
    targets = host_docs.targets()
    assert set(docs.targets()) < set(targets)
    drifted = [str(p.relative_to(REPO)) for p, text in targets.items() if p.read_text() != text]
    assert not drifted, f"regenerate with `python -m pdinfra.host.docs --write`: {drifted}"
    text = host_docs.VALIDATION_MD.read_text()
    table = text[text.index(host_docs.BEGIN) : text.index(host_docs.END)]
    ids = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert ids == [c.id for c in checks.CATALOG] + [cid for cid, _ in checks.FLEET_CHECKS]


def test_the_drift_check_sees_a_change(tmp_path, monkeypatch):
    stale = tmp_path / "variables.md"
    stale.write_text("# stale\n")
    monkeypatch.setattr(docs, "VARIABLES_MD", stale)
    assert docs.main(["--check"]) == 1


def test_the_runs_index_names_every_record_with_its_heading(tmp_path):
    """docs/runs/README.md lists each record of docs/runs and docs/reports (the files sharing a stem as one), with
    the record's own heading; a new record is a drift until the index is regenerated."""
    index = docs.RUNS_INDEX_MD.read_text()
    stems = {
        p.name.split(".", 1)[0]
        for sub in docs.RECORD_DIRS
        for p in (docs.DOCS_DIR / sub).iterdir()
        if p.name != "README.md"
    }
    assert all(f"[{s}](" in index for s in stems), sorted(s for s in stems if f"[{s}](" not in index)
    assert "(no heading)" not in index
    for sub in docs.RECORD_DIRS:
        (tmp_path / sub).mkdir()
    (tmp_path / "runs" / "2031-01-01-new.md").write_text("# A new record (2031-01-01)\n")
    (tmp_path / "runs" / "2031-01-01-new").mkdir()
    assert (
        "| 2031-01-01 | [2031-01-01-new](2031-01-01-new.md) | A new record (2031-01-01) | [dir](2031-01-01-new/) |"
        in docs.runs_index_md(tmp_path)
    )


def test_the_catalog_drift_check_sees_a_change(tmp_path, monkeypatch):
    """A stale catalog row is noticed, and the hand-written text around the markers is kept when regenerating."""
    current = host_docs.VALIDATION_MD.read_text()
    stale = tmp_path / "validation.md"
    stale.write_text(current.replace("| `os.iommu` | os |", "| `os.iommu` | stale |").replace("## Fixtures", "## Fix"))
    monkeypatch.setattr(host_docs, "VALIDATION_MD", stale)
    monkeypatch.setattr(docs, "targets", dict)  # only the stale file: --write must not touch the repository
    assert host_docs.main(["--check"]) == 1
    assert host_docs.main(["--write"]) == 0
    assert stale.read_text() == current.replace("## Fixtures", "## Fix")


def test_a_check_without_its_doc_paragraphs_is_refused():
    def undocumented(facts, expect):
        """Reads: something

        Remedy: fix it"""

    with pytest.raises(ValueError, match="lacks a Rule: paragraph"):
        host_docs.check_doc(undocumented)


def _expressions(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    out = [a or b for a, b in JINJA.findall(text)]
    if path.suffix == ".yml":

        def walk(node):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k in BARE_KEYS:
                        out.extend(x for x in (v if isinstance(v, list) else [v]) if isinstance(x, str))
                    walk(v)
            elif isinstance(node, list):
                for x in node:
                    walk(x)

        walk(yaml.safe_load(text))
    return out


FILTERS = ("pdinfra_kv_transfer_config", "pdinfra_kv")  # filter_plugins/pdinfra_kv.py


def test_roles_and_playbooks_read_cluster_variables_only_from_the_resolved_model():
    """Every default of a cluster variable is applied once (pdinfra.cluster.resolve): no role re-reads the raw
    pdinfra_* inventory variables, and none defaults them with `| default(...)`."""
    files = [p for p in (REPO / "roles").rglob("*") if p.suffix in (".yml", ".j2") and "README" not in p.name]
    files += list((REPO / "playbooks").glob("*.yml")) + [REPO / "site.yml"]
    bad = []
    for path in files:
        for expr in _expressions(path):
            # pdinfra's filters (filter_plugins/) are not variables
            expr = re.sub(rf"\|\s*({'|'.join(FILTERS)})\b", "|", expr)
            # a variable, not an attribute (x.pdinfra_src) or a quoted file name ('pdinfra_cpu_amx.pth')
            for name in set(re.findall(r"(?<![.\w'\"])pdinfra_[a-z_]+\b(?![.\w]*['\"])", expr)) - PUBLISHED:
                bad.append(f"{path.relative_to(REPO)}: {name} in {expr.strip()[:80]!r}")
            if re.search(r"\bpdinfra_\w+(\.\w+)*\s*\|\s*default\(", expr):
                bad.append(f"{path.relative_to(REPO)}: default() on a cluster variable: {expr.strip()[:80]!r}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_role_reader_sees_a_raw_variable(tmp_path):
    role = tmp_path / "defaults.yml"
    role.write_text('x: "{{ pdinfra_block_size | default(64) }}"\n')
    assert "pdinfra_block_size | default(64)" in _expressions(role)[0]


def test_every_role_variable_is_declared_in_its_argument_spec():
    """defaults/main.yml is the public API and argument_specs describes all of it (docs come from both)."""
    missing = []
    for role, rs in schema.role_schemas().items():
        defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        missing += [f"{role}: {k}" for k in defaults if k not in rs.variables]
    assert not missing, missing


def test_vllm_instance_spec_lists_every_field_of_a_resolved_instance():
    from dataclasses import fields

    from pdinfra.cluster.model import Instance

    spec = schema.role_schemas()["vllm_instance"].variables["vllm_instance_list"].spec["options"]
    assert set(spec) == {f.name for f in fields(Instance)}


def test_the_roles_play_time_ranges_agree_with_the_schema():
    """The roles keep their own range asserts (they can run alone); the schema checks the same ranges before any
    host is touched. The two must not drift apart."""
    found = {}
    for path in (REPO / "roles").glob("*/tasks/*.yml"):
        for name, lo, name2, hi in re.findall(
            r"([a-z_]+) \| int >= (\d+) and ([a-z_]+) \| int <= (\d+)", path.read_text()
        ):
            if name == name2:
                found[name] = (int(lo), int(hi))
    assert found, "no range asserts found in the roles"
    assert {k: schema.ROLE_RANGES.get(k) for k in found} == found
