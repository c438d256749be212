"""pdinfra.serving.nixl_tuning: the import hook that sets NIXL's progress-thread delay / switch for vLLM's agents."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from pdinfra.serving import nixl_tuning as nt


class FakeConfig:
    pthrDelay = 0  # noqa: N815 - NIXL's attribute name
    useProgThread = True  # noqa: N815


def fake_api():
    made = []
    bind = types.SimpleNamespace(nixlAgent=lambda name, cfg: made.append((name, cfg.pthrDelay, cfg.useProgThread)))
    return types.SimpleNamespace(nixlBind=bind), made


def test_env_parsing():
    assert nt.from_env({}) == nt.Tuning(None, None) and not nt.from_env({}).active
    assert nt.from_env({nt.ENV_DELAY: "500"}) == nt.Tuning(500, None)
    assert nt.from_env({nt.ENV_PROG: "0"}) == nt.Tuning(None, False)
    assert nt.from_env({nt.ENV_DELAY: "x", nt.ENV_PROG: "1"}) == nt.Tuning(None, True)


def test_patch_sets_delay_and_switch_on_new_agents_only_once():
    mod, made = fake_api()
    assert nt.patch_module(mod, nt.Tuning(500, False))
    assert not nt.patch_module(mod, nt.Tuning(1, True))  # already patched
    mod.nixlBind.nixlAgent("a", FakeConfig())
    assert made == [("a", 500, False)]


def test_real_nixl_agent_is_created_through_the_hook():
    pytest.importorskip("nixl_cu13")
    code = (
        "from pdinfra.serving import nixl_tuning; nixl_tuning.install();"
        "from nixl._api import nixl_agent, nixl_agent_config;"
        "import nixl_cu13._api as api; print(type(api.nixlBind).__name__);"
        "nixl_agent('t', nixl_agent_config(backends=[]))"
    )
    env = dict(os.environ, **{nt.ENV_DELAY: "500"})
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "_BindProxy" in res.stdout
