"""Wrong values are refused, naming the variable, and nothing an inventory holds makes resolve() crash.

- Refusal: every variable an operator can set (pdinfra's own, the model's and an instance's fields, the keys of
  pdinfra_expect, the roles' variables) gets each value its type rules out, on every host (an instance field: on
  the last instance of the last host), and resolve must refuse it with a problem that names the variable. A role
  variable's type is what Ansible's role argument validation accepts: it converts 12 to "12" and "a,b" to a list,
  so those are not wrong; a mapping for a string or a list, a list for a string, true for a number and a relative
  path are. Beyond its type, each role variable with a rule in schema.ROLE_RULES gets the values its unit, range
  or format rules out: a duration without a unit, a percentage for a fraction, seconds written with a unit, a value
  past either end of its range, a string outside its format.
- No crash: Hypothesis generates wrong types and edge values for the same variables (the roles' and the
  expectations' too), on any host and instance; they end as problems or resolve, never as an exception.

The inventories are the local CPU one and the HGX GPU one of test_cluster_resolve.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cluster_resolve import CPU, GPU, GPU_GROUPS, GROUPS

from pdinfra.cluster import resolve as R
from pdinfra.cluster import schema

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.sampled_from([0, -1, 1, 65535, 65536, 1023, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "",
            " ",
            "8",
            "-1",
            "1e3",
            "15000:16999",
            "a-b",
            "yes",
            "no",
            "auto",
            "198.18.0.0/24",
            "::1/128",
            "/",
            "../x",
            "{{ x }}",
            "None",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)

PDINFRA_NAMES = sorted(schema.PDINFRA)
MODEL_KEYS = [f.name for f in schema.MODEL_FIELDS]
INSTANCE_KEYS = [f.name for f in schema.INSTANCE_FIELDS]
EXPECT_KEYS = [f.name for f in schema.EXPECT_FIELDS]
ROLE_NAMES = sorted({name for rs in schema.role_schemas().values() for name in rs.variables})


def _resolve(base: dict, groups: dict, mutate) -> R.Resolution:
    hv = copy.deepcopy(base)
    mutate(hv)
    try:
        res = R._resolve(hv, copy.deepcopy(groups))  # without resolve()'s last-resort net
    except Exception as exc:  # the point of the test: report the input that crashed it
        raise AssertionError(f"resolve raised {type(exc).__name__}: {exc}") from exc
    assert all(p.variable != R.INTERNAL for p in res.problems)
    return res


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(name=st.sampled_from(PDINFRA_NAMES), value=VALUES, everywhere=st.booleans(), gpu=st.booleans())
def test_any_value_of_a_pdinfra_variable(name: str, value: Any, everywhere: bool, gpu: bool) -> None:
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        for h in list(hv)[: None if everywhere else 1]:
            hv[h][name] = copy.deepcopy(value)

    _resolve(base, groups, mutate)


@FUZZ
@given(key=st.sampled_from(MODEL_KEYS + INSTANCE_KEYS), value=VALUES, gpu=st.booleans(), pick=st.integers(0, 99))
def test_any_value_of_a_model_or_instance_field(key: str, value: Any, gpu: bool, pick: int) -> None:
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        if key in MODEL_KEYS:
            for h in hv.values():
                h["pdinfra_model"] = dict(h["pdinfra_model"], **{key: copy.deepcopy(value)})
        else:  # any instance of any host
            insts = [i for h in hv.values() for i in h.get("pdinfra_instances", [])]
            insts[pick % len(insts)][key] = copy.deepcopy(value)

    _resolve(base, groups, mutate)


@FUZZ
@given(name=st.sampled_from(ROLE_NAMES), value=VALUES, gpu=st.booleans())
def test_any_value_of_a_role_variable(name: str, value: Any, gpu: bool) -> None:
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        for h in hv.values():
            h[name] = copy.deepcopy(value)

    _resolve(base, groups, mutate)


@FUZZ
@given(key=st.sampled_from(EXPECT_KEYS), value=VALUES, gpu=st.booleans(), pick=st.integers(0, 1))
def test_any_value_of_an_expectation(key: str, value: Any, gpu: bool, pick: int) -> None:
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        list(hv.values())[pick]["pdinfra_expect"] = {key: copy.deepcopy(value)}

    _resolve(base, groups, mutate)


@FUZZ
@given(name=st.sampled_from(sorted(schema.ROLE_RULES)), value=VALUES, gpu=st.booleans(), pick=st.integers(0, 1))
def test_any_value_of_a_role_variable_with_a_rule_on_one_host(name: str, value: Any, gpu: bool, pick: int) -> None:
    """The rules' own checks (units, fractions, against the rails and the scrape interval) on one host's value."""
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        list(hv.values())[pick][name] = copy.deepcopy(value)

    _resolve(base, groups, mutate)


def test_an_unexpected_exception_is_a_problem_not_a_traceback(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(R, "resolve_monitoring", broken)
    res = R.resolve(copy.deepcopy(CPU), copy.deepcopy(GROUPS))
    assert not res.ok and [str(p) for p in res.problems] == [
        "pdinfra: resolving the inventory failed inside pdinfra (RuntimeError: boom); this is a pdinfra bug: report "
        "it with the inventory"
    ]


# ----------------------------------------------------------------------------- every wrong value is refused, named
# Values each type rules out (see the module docstring for the roles' conversions).
WRONG = {
    "int": ["abc", [1], {"a": 1}, True, 1.5], "port": ["abc", [1], True, 0, 70000], "bool": ["maybe", 3, [True]],
    "str": [[1], {"a": 1}], "list": [3, "x", {"a": 1}], "dict": [3, "x", [1]], "cidr": ["not-an-address", [1], 7],
}  # fmt: skip
ROLE_WRONG = {
    "int": ["abc", [1], {"a": 1}, True], "float": ["abc", [1.0], True], "bool": ["maybe", 3, [True]],
    "str": [[1], {"a": 1}], "path": [[1], {"a": 1}, "relative/dir"], "list": [{"a": 1}], "dict": [3, "x", [1]],
    # the two raw variables take "auto" or a value of one type (fabric manager: a boolean; GID index: a number)
    "raw": ["maybe", [1], {"a": 1}],
}  # fmt: skip


# Values a strict expectation key rules out (the validator reads them as typed JSON: a quoted number is refused).
EXPECT_WRONG = {
    "int": ["8", "eight", True, -1, [1]], "bool": ["yes", 1, [True]], "str": [5, [1]], "list": ["x", 3],
    "dict": ["x", [1]], "raw": ["four"],
}  # fmt: skip


def _rule_wrong(rule: schema.Rule) -> list[Any]:
    """Values a role variable's rule rules out beyond its type."""
    if rule.unit == "duration":
        return [30, "30", "5 minutes"]
    if rule.unit == "fraction":
        return [90, "90%", -0.5]
    if rule.pattern is not None:
        return ["not valid at all!"]
    out: list[Any] = []
    if rule.max is not None:
        out.append(int(rule.max) + 1)
    if rule.min is not None:
        out.append(int(rule.min) - 1)
    if rule.unit in ("s", "ms", "us"):
        out.append("30s")
    return out


def _cases() -> list[tuple[str, str, str, Any]]:
    """(kind, variable, type, wrong value) for every operator-settable variable and every value its type rules out."""
    out = [
        ("pdinfra", n, schema.PDINFRA[n].type, v) for n in PDINFRA_NAMES for v in WRONG.get(schema.PDINFRA[n].type, [])
    ]
    out += [("model", f.name, f.type, v) for f in schema.MODEL_FIELDS for v in WRONG.get(f.type, [])]
    out += [("instance", f.name, f.type, v) for f in schema.INSTANCE_FIELDS for v in WRONG.get(f.type, [])]
    role_vars = {n: rv for rs in schema.role_schemas().values() for n, rv in rs.variables.items()}
    out += [
        ("role", n, role_vars[n].type, v)
        for n in ROLE_NAMES
        if n not in schema.DERIVED_ROLE_VARS
        for v in ROLE_WRONG.get(role_vars[n].type, [])
    ]
    out += [
        ("rule", n, role_vars[n].type, v) for n, rule in sorted(schema.ROLE_RULES.items()) for v in _rule_wrong(rule)
    ]
    out += [("expect", f.name, f.type, v) for f in schema.EXPECT_FIELDS for v in EXPECT_WRONG[f.type]]
    return out


CASES = _cases()


def test_the_refusal_cases_reach_every_operator_settable_variable():
    """Every variable of the schema and of the roles' argument_specs has a wrong value below, except the roles'
    variables that pdinfra derives from the cluster model (set by the operator, they are refused as such)."""
    reached = {(k, n) for k, n, _, _ in CASES}
    settable = (
        {("pdinfra", n) for n in PDINFRA_NAMES}
        | {("model", k) for k in MODEL_KEYS}
        | {("instance", k) for k in INSTANCE_KEYS}
        | {("expect", k) for k in EXPECT_KEYS}
        | {("role", n) for n in ROLE_NAMES if n not in schema.DERIVED_ROLE_VARS}
        | {("rule", n) for n in schema.ROLE_RULES}
    )
    unreached = sorted(settable - reached)
    types = {schema.PDINFRA[n].type for k, n in unreached if k == "pdinfra"}
    assert not unreached, f"no wrong value for these variables (types {types}): {unreached}"


@pytest.mark.parametrize(
    ("kind", "name", "type_", "value"), CASES, ids=[f"{k}-{n}-{i}" for i, (k, n, _, _) in enumerate(CASES)]
)
@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "gpu"])
def test_every_wrong_value_is_refused_naming_the_variable(kind: str, name: str, type_: str, value: Any, gpu: bool):
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        if kind == "model":
            for h in hv.values():
                h["pdinfra_model"] = dict(h["pdinfra_model"], **{name: copy.deepcopy(value)})
        elif kind == "instance":
            last = [h for h in hv.values() if h.get("pdinfra_instances")][-1]
            last["pdinfra_instances"][-1][name] = copy.deepcopy(value)
        elif kind == "expect":
            for h in hv.values():
                h["pdinfra_expect"] = {name: copy.deepcopy(value)}
        else:
            for h in hv.values():
                h[name] = copy.deepcopy(value)

    res = _resolve(base, groups, mutate)
    named = [str(p) for p in res.problems if name in str(p)]
    assert named, f"{kind} {name} ({type_}) = {value!r} was accepted: {[str(p) for p in res.problems]}"
