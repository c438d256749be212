"""Resolve the cluster description on the controller, before any host is touched (pdinfra.cluster.resolve).

Reads every host's pdinfra and role variables as Ansible resolved them (inventory, group_vars, host_vars and
-e extra vars alike), templates them, and resolves the cluster model. On success it returns ``cluster`` (the
whole model, without secrets) for playbooks/cluster.yml to publish; with ``secrets: true`` it returns ``secrets``
instead (run that task with no_log). ``output`` writes {problems, cluster} as JSON on the
controller (``pdinfra check-config`` and the Python consumers read the model that way). ``scope`` (full | host)
comes from the argument, else from the play variable ``__pdinfra_scope``, else ``full``.
"""

from __future__ import annotations

import json
import os

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            from pdinfra.cluster import resolve, schema
        except ImportError as exc:
            raise AnsibleError(f"pdinfra is not importable by the controller's Python: {exc}") from exc
        args = self._task.args
        groups = {k: list(v) for k, v in task_vars.get("groups", {}).items()}
        groups.setdefault(resolve.CLUSTER_GROUP, [])
        if args.get("cluster_group"):
            groups[resolve.CLUSTER_GROUP] = groups.get(args["cluster_group"], [])
        if args.get("router_group"):
            groups[resolve.ROUTER_GROUP] = groups.get(args["router_group"], [])
        hostvars = task_vars["hostvars"]
        wanted = tuple(schema.ROLE_PREFIXES.values())
        resolved: dict[str, dict] = {}
        template_problems = []
        sources = task_vars.get("ansible_inventory_sources", []) or []
        from pathlib import Path as _P

        from pdinfra.cluster.inventory import secrets_in_inventory

        # Before any value is templated: a key file Ansible parsed as hosts must not be read, nor a new key made
        # for the "hosts" it became (their inventory_dir is the key's directory).
        leaks = secrets_in_inventory([_P(s) for s in sources if _P(s).exists()])
        if leaks:
            return self._finish(result, args, leaks, sources)
        for host in groups.get("all", []):
            try:
                hv = hostvars[host]
                keys = list(hv)
            except Exception as exc:  # a group_vars/host_vars file that does not parse: say which, and where
                from pathlib import Path as _P

                from pdinfra.cluster.inventory import yaml_errors

                where = yaml_errors([_P(s) for s in sources]) or [str(exc)]
                result.update(failed=True, changed=False, msg="the inventory does not parse:\n  " + "\n  ".join(where))
                return result
            resolved[host] = {}
            for key in keys:
                if not isinstance(key, str) or key in ("pdinfra_cluster", "pdinfra_node", "pdinfra_secrets"):
                    continue
                if key.startswith("pdinfra_") or key.startswith(wanted) or key == "ansible_host":
                    try:
                        resolved[host][key] = self._templar.template(hv[key])
                    except Exception as exc:  # an undefined variable or a Jinja error inside the value
                        template_problems.append(resolve.Problem(key, f"cannot be templated: {exc}", host))
        # playbooks/host.yml imports cluster.yml with __pdinfra_scope: host; everything else resolves in full.
        scope = str(args.get("scope") or task_vars.get("__pdinfra_scope") or "full")
        if scope not in ("full", "host"):
            raise AnsibleError(f"scope must be full or host, not {scope!r}")
        res = resolve.resolve(resolved, groups, sources, scope)
        from pdinfra.cluster.inventory import orphan_vars

        hosts = list(task_vars.get("groups", {}).get("all", []))
        orphans = orphan_vars([_P(s) for s in sources], list(task_vars.get("groups", {})), hosts)
        problems = template_problems + orphans + res.problems
        return self._finish(result, args, problems, sources, res)

    @staticmethod
    def _finish(result, args, problems, sources, res=None):
        from pdinfra.cluster.checker import format_problems

        result["changed"] = False
        if args.get("output"):
            data = {
                "problems": [{"variable": p.variable, "message": p.message, "host": p.host} for p in problems],
                "cluster": res.cluster.to_dict() if res and res.cluster is not None and not problems else None,
            }
            if args.get("output_secrets") and data["cluster"] is not None:
                data["secrets"] = {"api_key": res.cluster.secrets.api_key, "hf_token": res.cluster.secrets.hf_token}
            # Owner-only: it may hold the secrets (output_secrets).
            fd = os.open(args["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(data))
        if problems:
            result["failed"] = True
            result["problems"] = [str(p) for p in problems]
            result["msg"] = format_problems(problems, ", ".join(sources) or None)
            return result
        cluster = res.cluster
        if args.get("secrets"):
            result["secrets"] = {"api_key": cluster.secrets.api_key, "hf_token": cluster.secrets.hf_token}
            result["msg"] = "secrets resolved"
            return result
        result["cluster"] = cluster.to_dict()
        pd = [h.name for h in cluster.pd_hosts]
        if cluster.model is None:
            result["msg"] = f"host layer only: {len(cluster.hosts)} hosts, no PD cluster"
            return result
        result["msg"] = (
            f"cluster OK: {len(pd)} PD hosts ({', '.join(pd)}), {len(cluster.instances)} instances, "
            f"router {cluster.router.url if cluster.routers else 'none'}, block size {cluster.block_size}, "
            f"layout {cluster.layout}; model limits "
            + (f"from {cluster.model.catalog}" if cluster.model.catalog else "not checked (a model not in the catalog)")
        )
        return result
