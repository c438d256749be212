"""Validate the whole cluster description on the controller before any host is touched.

Runs pdinfra.config.check over every host of the PD cluster, with the variables as Ansible
resolved them (inventory, group_vars, host_vars and -e extra vars alike).
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            from pdinfra import config
        except ImportError as exc:
            raise AnsibleError(f"pdinfra is not importable by the controller's Python: {exc}") from exc
        args = self._task.args
        cluster_group = args.get("cluster_group", "pd_cluster")
        router_group = args.get("router_group", "router")
        groups = task_vars.get("groups", {})
        hostvars = task_vars["hostvars"]
        cluster = list(groups.get(cluster_group, []))
        routers = list(groups.get(router_group, []))
        resolved: dict[str, dict] = {}
        for host in sorted(set(cluster) | set(routers)):
            hv = hostvars[host]
            resolved[host] = {}
            for key in config.VARIABLES:
                if key in hv:
                    resolved[host][key] = self._templar.template(hv[key])
        problems = config.check(resolved, cluster, routers)
        result["changed"] = False
        result["problems"] = [str(p) for p in problems]
        if problems:
            sources = ", ".join(task_vars.get("ansible_inventory_sources", []) or [])
            result["failed"] = True
            result["msg"] = config.format_problems(problems, sources or None)
        else:
            result["msg"] = f"cluster description OK: {len(cluster)} hosts, routers: {', '.join(routers)}"
        return result
