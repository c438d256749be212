"""pdinfra.serving.wheelhouse: what `pdinfra hosts prepare` builds ahead is the wheelhouse the pd_runtime role asks
for, so the first `up` finds it cached (a prepared wheelhouse under another key would be a download for nothing)."""

from __future__ import annotations

import jinja2
import pytest
import yaml

from pdinfra import paths
from pdinfra.serving import wheelhouse as wh

TASKS = paths.REPO / "roles" / "pd_runtime" / "tasks" / "main.yml"


def _role_install(profile: str, connector: str) -> list[str]:
    """The role's own ``__pd_runtime_install`` expression, rendered with its defaults (Jinja, as Ansible would)."""
    tasks = yaml.safe_load(TASKS.read_text())
    expr = next(
        t["ansible.builtin.set_fact"]["__pd_runtime_install"]
        for t in tasks
        if "__pd_runtime_install" in (t.get("ansible.builtin.set_fact") or {})
    )
    defaults = yaml.safe_load(wh.ROLE_DEFAULTS.read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["bool"] = bool
    values = {**defaults, "pd_runtime_profile": profile, "pd_runtime_lmcache": connector == "lmcache"}
    return list(env.compile_expression(expr.strip().removeprefix("{{").removesuffix("}}"))(**values))


@pytest.mark.parametrize(("profile", "connector"), [("cpu", "nixl"), ("cpu", "mooncake"), ("gpu", "lmcache")])
def test_the_prepared_package_list_is_the_roles(profile, connector):
    assert wh.role_packages(profile, connector) == _role_install(profile, connector)


def test_the_key_ignores_the_order_of_the_packages():
    a = wh._key(["b==1", "a==2"], "3.11", "2.36", "x86_64", [])
    assert a == wh._key(["a==2", "b==1"], "3.11", "2.36", "x86_64", [])
    assert a != wh._key(["a==2", "b==1"], "3.12", "2.36", "x86_64", [])
