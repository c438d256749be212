"""Commands without -i follow the inventory the running local cluster was deployed from (`pdinfra up -i ...`)."""

from __future__ import annotations

from typer.testing import CliRunner

from pdinfra import paths
from pdinfra.cli import common, main

ONE_P_ONE_D = paths.REPO / "inventory" / "local-1p1d" / "hosts.yml"


def test_a_command_without_i_uses_the_deployed_inventory_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PDINFRA_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(common, "_said", set())
    runner = CliRunner()
    base = runner.invoke(main.app, ["check-config", "--json"])
    assert base.exit_code == 0 and '"prefill0"' in base.stdout and '"decode0"' in base.stdout, base.output
    common.remember(ONE_P_ONE_D)
    res = runner.invoke(main.app, ["check-config", "--json"])
    assert res.exit_code == 0, res.output
    assert f"inventory {ONE_P_ONE_D} (the local cluster was deployed from it by pdinfra up" in res.output
    assert '"decode0"' not in res.stdout.split("deployed from it")[-1]  # local-1p1d drops node2's instance
    explicit = runner.invoke(main.app, ["check-config", "--json", "-i", str(common.DEFAULT_INV)])
    assert '"decode0"' in explicit.stdout and "deployed from it" not in explicit.output
    common.deployed_record().unlink()
    assert common.effective_inventory(common.DEFAULT_INV) == common.DEFAULT_INV
