"""Every role variable an operator can set is in the one schema (issue 40): its type in the role's
meta/argument_specs.yml, and its unit, range or format in pdinfra.cluster.schema.ROLE_RULES, or it is a value the
cluster model sets (DERIVED_ROLE_VARS). The two agree, and every default passes its own rule.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pdinfra.cluster import schema
from pdinfra.cluster.resolve_roles import rule_problem, unit_problem

REPO = Path(__file__).resolve().parents[2]
MODEL_FACTS = re.compile(r"\bpdinfra_(cluster|node|secrets)\b")
# Types that say all there is to say (true/false, a list or mapping the argument spec describes, an absolute path).
SELF_DESCRIBED = ("bool", "list", "dict", "path")
# The argument spec types each unit goes with.
UNIT_TYPES = {"duration": ("str",), "fraction": ("float",), "count": ("int", "float"), None: ("str", "raw")}


def _defaults() -> dict[str, tuple[str, object]]:
    out = {}
    for role in schema.ROLES:
        data = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        out.update({k: (role, v) for k, v in data.items()})
    return out


def test_every_role_variable_in_defaults_is_in_the_schema():
    missing = []
    for name, (role, _) in _defaults().items():
        rv = schema.role_var(name)
        if rv is None:
            missing.append(f"{role}: {name} is not in roles/{role}/meta/argument_specs.yml")
        elif not (
            name in schema.ROLE_RULES
            or name in schema.DERIVED_ROLE_VARS
            or name in schema.OVERRIDABLE_MODEL_DEFAULTS
            or rv.spec.get("choices")
            or rv.type in SELF_DESCRIBED
        ):
            missing.append(f"{role}: {name} ({rv.type}) has no unit, range or format in schema.ROLE_RULES")
    assert not missing, "\n".join(missing)


def test_the_rules_name_role_variables_of_the_matching_type():
    bad = []
    for name, rule in schema.ROLE_RULES.items():
        rv = schema.role_var(name)
        if rv is None:
            bad.append(f"{name}: no role has it")
            continue
        want = UNIT_TYPES.get(rule.unit if rule.pattern is None else None, ("int",))
        if rv.type not in want:
            bad.append(f"{name}: unit {rule.unit}, pattern {rule.pattern!r} wants type {want}, the spec says {rv.type}")
        if name in schema.DERIVED_ROLE_VARS:
            bad.append(f"{name}: derived from the model, yet given a rule")
    assert not bad, "\n".join(bad)


def test_every_default_passes_its_own_rule():
    bad = []
    for name, (_, default) in _defaults().items():
        if name not in schema.ROLE_RULES or (isinstance(default, str) and "{{" in default):
            continue
        why = unit_problem(name, default) or rule_problem(name, default, default)
        if why:
            bad.append(f"{name}: default {default!r}: {why}")
    assert not bad, "\n".join(bad)


def test_every_default_that_reads_the_model_is_derived_or_declared_overridable():
    """A role variable whose default takes a value of the cluster model, set in the inventory, would bypass the
    model's checks (vllm_instance_max_model_len past the model's context): resolve refuses it, naming what to set."""
    defaults = {n: yaml.safe_dump(v) for n, (_, v) in _defaults().items()}
    reads = {n for n, text in defaults.items() if MODEL_FACTS.search(text)}
    # computed from a derived one alone: whether this host runs the store master
    assert "pd_kv_store_config" in defaults["pd_kv_store_here"] and "pdinfra_" not in defaults["pd_kv_store_here"]
    reads.add("pd_kv_store_here")
    declared = set(schema.DERIVED_ROLE_VARS) | set(schema.OVERRIDABLE_MODEL_DEFAULTS)
    assert sorted(reads - declared) == [] and sorted(declared - reads) == []
    for name, source in schema.DERIVED_ROLE_VARS.items():
        head = source.split()[0].split(".")[0].split("[")[0]
        assert head in schema.PDINFRA or schema.role_var(head) is not None, (name, source)


def test_role_readmes_show_the_rules():
    readme = (REPO / "roles" / "pd_monitoring" / "README.md").read_text()
    assert "Must be a fraction 0-1." in readme and "Must be a Prometheus duration with its unit" in readme
    assert "Unit: seconds. Range 5..86400." in (REPO / "roles" / "pd_router" / "README.md").read_text()
