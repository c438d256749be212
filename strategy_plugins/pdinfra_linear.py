"""Ansible's linear strategy, run through Mitogen for Ansible when it is installed (the controller extras pin it).

Why: ansible-core 2.21 starts a fresh Python on the node for every module call and imports
ansible.module_utils.basic there (about 0.15 s on a test host, 0.25-0.35 s a task with the SSH round trip). A
converged site.yml is about 200 tasks, so a re-run that changes nothing took 74 s on the local cluster; Mitogen keeps
one interpreter per host and runs the modules in it: 28 s, the same ok/changed/skipped counts
(docs/runs/2026-12-04-mitogen/). Plays, tasks, output and results are Ansible's own: only where the module runs changes.

Opt out for one run with ANSIBLE_STRATEGY=linear (Ansible's own linear strategy, nothing else changes). Without the
``mitogen`` package this is Ansible's linear strategy with a warning (a controller installed without the extras).
"""

from __future__ import annotations

from ansible.plugins.strategy.linear import StrategyModule as _Linear
from ansible.utils.display import Display

try:  # Mitogen's own strategy module, as its docs' strategy_plugins path would load it
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule as _Mitogen
except ImportError as exc:  # pragma: no cover - the controller extras install mitogen
    _Mitogen = None
    _WHY = str(exc)

if _Mitogen is None:

    class StrategyModule(_Linear):
        def __init__(self, tqm):
            Display().warning(
                f"pdinfra_linear: mitogen is not importable ({_WHY}); running Ansible's linear strategy (about 2.5x "
                "slower). Install the controller extras: pip install 'pdinfra[controller]'"
            )
            super().__init__(tqm)

else:

    def _local_user_is_the_controllers() -> None:
        """Shim: Mitogen stacks `sudo` onto a local connection with become_user root even when the controller already
        runs as root, because the local connection's remote_user is unset and compares unequal to root; Ansible's
        own local connection skips that become. On a controller without sudo (CI's) every `become: true` play on
        localhost then fails with "No such file or directory: 'sudo'". Here an unset remote_user of a local
        connection is the controller's user, as in Ansible. tests/unit/test_strategy_shim.py tells when Mitogen no
        longer needs it."""
        import getpass

        from ansible_mitogen import transport_config

        spec = transport_config.PlayContextSpec
        if getattr(spec.remote_user, "_pdinfra_shim", False):
            return
        unpatched = spec.remote_user

        def remote_user(self):
            user = unpatched(self)
            return getpass.getuser() if user is None and self.transport() == "local" else user

        remote_user._pdinfra_shim = True
        remote_user.unpatched = unpatched
        spec.remote_user = remote_user

    _local_user_is_the_controllers()

    class StrategyModule(_Mitogen):
        pass
