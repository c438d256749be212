"""`pdinfra deploy` passes its other arguments to ansible-playbook, and says what a --limit leaves out: the router,
the other nodes' firewalls and Prometheus keep their lists of hosts (docs/runbooks/add-node.md)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pdinfra.cli import deploy, main


@pytest.mark.parametrize(
    ("args", "limit"),
    [
        ([], None),
        (["--tags", "serving"], None),
        (["-l", "node2"], "node2"),
        (["--limit", "node2,node3"], "node2,node3"),
        (["--limit=node2"], "node2"),
        (["-lnode2"], "node2"),
        (["--check", "-l"], ""),
    ],
)
def test_the_limit_among_ansible_playbooks_arguments(args, limit):
    assert deploy.limit_of(args) == limit


def test_deploy_with_a_limit_says_what_it_leaves_out_and_passes_it_on(monkeypatch):
    ran: list[list[str]] = []
    monkeypatch.setattr(deploy, "run_playbook", lambda inventory, extra, check: ran.append(extra) or 0)
    runner = CliRunner()
    res = runner.invoke(main.app, ["deploy", "-i", "inventory/local/hosts.yml", "-l", "node2"])
    assert res.exit_code == 0, res.output
    assert ran == [["-l", "node2"]]
    out = " ".join(res.output.split())
    assert "--limit node2: only these hosts are converged" in out and "run pdinfra deploy without --limit" in out
    res = runner.invoke(main.app, ["deploy", "-i", "inventory/local/hosts.yml", "--tags", "serving"])
    assert res.exit_code == 0 and ran[-1] == ["--tags", "serving"] and "--limit" not in res.output, res.output
