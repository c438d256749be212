"""Nothing an inventory holds makes resolve() crash: wrong types and edge values for every variable of the schema
(pdinfra's own, the model's and an instance's fields, and the roles' variables) end as problems naming the variable,
or resolve, never as an exception. Hypothesis generates the values; the inventories are the local CPU one and the
HGX GPU one of test_cluster_resolve.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cluster_resolve import CPU, GPU, GPU_GROUPS, GROUPS

from pdinfra.cluster import resolve as R
from pdinfra.cluster import schema

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63),
    st.sampled_from([0, -1, 1, 65535, 65536, 1023, 2**31]), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.sampled_from(["", " ", "8", "-1", "1e3", "15000:16999", "a-b", "yes", "no", "auto",
                                           "198.18.0.0/24", "::1/128", "/", "../x", "{{ x }}", "None"]),
)  # fmt: skip
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)  # fmt: skip

PDINFRA_NAMES = sorted(schema.PDINFRA)
MODEL_KEYS = [f.name for f in schema.MODEL_FIELDS]
INSTANCE_KEYS = [f.name for f in schema.INSTANCE_FIELDS]
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
@given(key=st.sampled_from(MODEL_KEYS + INSTANCE_KEYS), value=VALUES, gpu=st.booleans())
def test_any_value_of_a_model_or_instance_field(key: str, value: Any, gpu: bool) -> None:
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        first = next(iter(hv))
        if key in MODEL_KEYS:
            for h in hv.values():
                h["pdinfra_model"] = dict(h["pdinfra_model"], **{key: copy.deepcopy(value)})
        else:
            hv[first]["pdinfra_instances"][0][key] = copy.deepcopy(value)

    _resolve(base, groups, mutate)


@FUZZ
@given(name=st.sampled_from(ROLE_NAMES), value=VALUES, gpu=st.booleans())
def test_any_value_of_a_role_variable(name: str, value: Any, gpu: bool) -> None:
    base, groups = (GPU, GPU_GROUPS) if gpu else (CPU, GROUPS)

    def mutate(hv):
        for h in hv.values():
            h[name] = copy.deepcopy(value)

    _resolve(base, groups, mutate)


def test_an_unexpected_exception_is_a_problem_not_a_traceback(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(R, "_monitoring", broken)
    res = R.resolve(copy.deepcopy(CPU), copy.deepcopy(GROUPS))
    assert not res.ok and [str(p) for p in res.problems] == [
        "pdinfra: resolving the inventory failed inside pdinfra (RuntimeError: boom); this is a pdinfra bug: report "
        "it with the inventory"]
