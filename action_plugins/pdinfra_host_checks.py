"""Run a named subset of the host check catalog (pdinfra.host.checks) on a managed host.

Facts are gathered once on the host by the ``pdinfra_facts`` module (pdinfra/host/facts.py shipped as
module_utils), then judged on the controller by the same check functions ``pdinfra validate`` runs, against the
host's expectations from the cluster model (``pdinfra_node.expect``). One catalog serves the validator and the
pre-flight role: no check logic is re-written in Jinja.

Options: ``checks`` (ids, required), ``expect`` (dict, required), ``warn_only`` (ids whose fail is reported as
warn), ``fail_on`` (ids whose warn is reported as fail), ``fail_on_fail`` (fail the task, naming each failed check,
its evidence and remedy). Returns ``results`` (id, verdict, evidence, remedy) and
``facts`` (what pdinfra_facts gathered, for later tasks that register the result).
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        try:
            from pdinfra.host import checks
        except ImportError as exc:
            raise AnsibleError(f"pdinfra is not importable by the controller's Python: {exc}") from exc
        args = self._task.args
        wanted = list(args.get("checks") or [])
        unknown = sorted(set(wanted) - {c.id for c in checks.CATALOG})
        if unknown:
            raise AnsibleError(f"checks: unknown check id(s) {', '.join(unknown)}; see docs/validation.md")
        try:
            expect = checks.Expect.from_dict(args.get("expect") or {})
        except ValueError as exc:
            raise AnsibleError(f"expect: {exc}") from exc
        # the module beside this plugin, in the plugin's own namespace: ansible.legacy.pdinfra_facts in a checkout
        # (library/), pdinfra.pd.pdinfra_facts in the collection
        collection = str(self._task.resolved_action or self._task.action).rpartition(".")[0]
        module = f"{collection}.pdinfra_facts" if collection else "pdinfra_facts"
        gathered = self._execute_module(module_name=module, module_args={"root": "/"}, task_vars=task_vars)
        if gathered.get("failed"):
            result.update(failed=True, msg=f"pdinfra_facts failed: {gathered.get('msg')}")
            return result
        facts = gathered["ansible_facts"]["pdinfra"]
        warn_only, fail_on = set(args.get("warn_only") or []), set(args.get("fail_on") or [])
        out = []
        for r in checks.run_checks(facts, expect):
            if r.id not in wanted:
                continue
            verdict = r.verdict
            if verdict == checks.FAIL and r.id in warn_only:
                verdict = checks.WARN
            elif verdict == checks.WARN and r.id in fail_on:
                verdict = checks.FAIL
            out.append({"check": r.id, "status": verdict, "detail": r.evidence, "remedy": r.remedy})
        result["changed"] = False
        result["results"] = out
        failed = [r for r in out if r["status"] == checks.FAIL]
        if failed and args.get("fail_on_fail"):
            result["failed"] = True
            result["msg"] = "; ".join(f"{r['check']}: {r['detail']} - {r['remedy']}" for r in failed)
            return result
        result["facts"] = facts
        result["msg"] = "; ".join(f"{r['status'].upper()} {r['check']}" for r in out)
        return result
