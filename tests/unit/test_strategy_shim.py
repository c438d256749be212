"""strategy_plugins/pdinfra_linear.py: site.yml runs through Mitogen, and its shim for local become still matters.

Real Ansible and Mitogen on this machine (localhost, local connection, no sudo on PATH); no test host needed."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

import pytest

from pdinfra import paths
from pdinfra.playbook import PlaybookResult, run_playbook

pytestmark = pytest.mark.slow
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
PLAY = """- hosts: localhost
  connection: local
  gather_facts: false
  become: true
  tasks:
    - name: A module under become, as host.yml runs them on the controller
      ansible.builtin.command: id -un
      register: who
      changed_when: false
    - name: Show who ran it
      ansible.builtin.debug:
        msg: "ran as {{ who.stdout }}"
"""


def _play(tmp_path: Path, **env: str) -> PlaybookResult:
    book = tmp_path / "play.yml"
    book.write_text(PLAY)
    # PATH without sudo, as on CI's machine: only this venv and the basic system directories
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    full = dict(os.environ, ANSIBLE_CONFIG=str(paths.REPO / "ansible.cfg"), PATH=path, ANSIBLE_NOCOLOR="1", **env)
    if os.path.exists("/usr/bin/sudo") or os.path.exists("/bin/sudo"):
        pytest.skip("sudo is installed here: the shim's case needs a controller without it")
    return run_playbook("localhost,", book, log=tmp_path / "play.log", timeout_s=120, env=full)


def test_site_runs_through_mitogen_with_become_on_the_controller(tmp_path):
    res = _play(tmp_path, ANSIBLE_STRATEGY="pdinfra_linear")
    assert res.rc == 0, res.summary()
    assert not any("mitogen is not importable" in line for line in res.output), res.output  # the extras install it
    assert res.mentions(f"ran as {getpass.getuser()}"), res.tasks


def test_mitogen_unshimmed_still_stacks_sudo_on_a_local_become(tmp_path):
    """Mitogen's own strategy on the same play. When this fails (the play passes), Mitogen skips the same-user
    become itself: remove _local_user_is_the_controllers from strategy_plugins/pdinfra_linear.py and this test."""
    import ansible_mitogen

    strategy_dir = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    res = _play(tmp_path, ANSIBLE_STRATEGY="mitogen_linear", ANSIBLE_STRATEGY_PLUGINS=str(strategy_dir))
    assert res.rc != 0 and any("sudo" in f.msg for f in res.failures), res.summary()
