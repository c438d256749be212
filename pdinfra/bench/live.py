"""`pdinfra bench` against a deployed cluster: endpoints from the inventory, `vllm bench serve` on the router node.

The client runs on the router host, inside the serving venv (vLLM is there; the controller needs none), through
Ansible ad-hoc commands, so whatever connection the inventory declares (SSH keys, users, bastions) is used as
is. Each result JSON is fetched back to the controller. Server metrics are read from the controller over HTTP.

Layouts on the same hardware:
- ``pd``: the router (prefill instances -> NIXL -> decode instances);
- ``agg``: the decode instances served directly, each an ordinary vLLM server doing its own prefill and
  decode (the aggregated layout on the decode instances' GPUs). Sweeping agg on *all* GPUs needs the
  cluster redeployed in the aggregated layout; the run manifest records which GPUs each layout used.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from pdinfra.bench.plan import BenchEndpoints, BenchPoint, Instance, LayoutEndpoint
from pdinfra.cluster.inventory import load_cluster
from pdinfra.cluster.model import Cluster
from pdinfra.playbook import adhoc, run_playbook


class LiveBenchError(RuntimeError):
    pass


# vllm bench serve's backends pdinfra drives, and the endpoint each posts to.
BACKEND_ENDPOINTS = {"vllm": "/v1/completions", "openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


def endpoints_from_cluster(
    cluster: Cluster, redeploy: bool = False, backend: str = "vllm"
) -> tuple[BenchEndpoints, str]:
    """(endpoints, router host name) for the resolved cluster (pdinfra.cluster).

    redeploy=False: agg = the first decode instance served directly. redeploy=True: agg = the router in front
    of every instance redeployed as an aggregated server (the same GPUs as PD). Model shape, block size, KV dtype
    and TP come from the model, so the report's KV predictions are those of the deployed instances; the device kind
    from the profile, so the report counts GPUs on a GPU cluster and CPU instances on a CPU one."""
    if not cluster.routers:
        raise LiveBenchError("the cluster has no router (inventory group 'router')")
    instances = [Instance(i.name, i.role, i.url, i.gpu_count) for i in cluster.instances]
    decode = tuple(i for i in instances if i.role == "decode")
    if not decode:
        raise LiveBenchError("the cluster has no decode instance")
    router = cluster.router
    front = cluster.client_url  # the clients' address: the front door's virtual IP, else the first router
    agg_instances = instances if redeploy else list(decode[:1])
    layouts = {
        "pd": LayoutEndpoint("pd", front, tuple(instances)),
        "agg": LayoutEndpoint(
            "agg",
            front if redeploy else decode[0].url,
            tuple(Instance(i.name, "agg", i.url, i.gpus) for i in agg_instances),
        ),
    }
    endpoints = BenchEndpoints(
        model=cluster.model.name,
        tokenizer=cluster.model.path,
        layouts=layouts,
        backend=backend,
        endpoint=BACKEND_ENDPOINTS[backend],
        model_shape=cluster.model.shape,
        block_size=cluster.block_size,
        tp=cluster.tp,
        kv_dtype=cluster.kv_dtype,
        device=cluster.profile if cluster.profile in ("gpu", "cpu") else None,
    )
    return endpoints, router.host


# The plays a layout switch changes: all of playbooks/serving.yml. Not only instances,router: pd_runtime writes the
# node's cluster.json, whose layout the deep-health probe (and validate) read (tried in CI: the router play's probe
# then sent PD requests to aggregated instances and failed).
LAYOUT_TAGS = "serving"


class LayoutDeployer:
    """Redeploys the serving layer in the layout a point needs (``site.yml --tags serving -e pdinfra_layout=X``)."""

    def __init__(self, inventory: Path, log_dir: Path, progress=None) -> None:
        self.inventory, self.log_dir, self.progress = inventory, log_dir, progress
        self.current: str | None = None

    def ensure(self, layout: str) -> None:
        if layout == self.current:
            return
        if self.progress:
            self.progress(f"deploying the {layout} layout (site.yml --tags {LAYOUT_TAGS} -e pdinfra_layout={layout})")
        # A layout switch changes every instance's KV role at once: it cannot be rolled pair by pair.
        res = run_playbook(
            self.inventory,
            "site.yml",
            ["--tags", LAYOUT_TAGS, "-e", f"pdinfra_layout={layout}", "-e", "vllm_instance_rolling=false"],
            log=self.log_dir / f"deploy-{layout}.log",
            timeout_s=3600,
        )
        if res.rc != 0:
            tail = res.summary(3000)
            raise LiveBenchError(f"deploying the {layout} layout failed (log: {res.log}):\n{tail}")
        self.current = layout
        self.warm_up(layout)

    def warm_up(self, layout: str) -> None:
        """Restarted instances pay NIXL's handshake on their first request (0.1-14 s measured): the smoke
        requests take that hit, and prove the layout works, before any point is measured."""
        from pdinfra.serving import smoke

        cluster = load_cluster(self.inventory, secrets=True)
        ep = smoke.endpoints_from_cluster(cluster, api_key=cluster.secrets.api_key)
        result = smoke.run(ep, layout=layout)
        if not result.ok:
            failed = "; ".join(f"{p.name}: {p.evidence}" for p in result.proofs if not p.ok)
            raise LiveBenchError(f"the {layout} layout does not pass the smoke proofs after deploying: {failed}")


class AnsibleExecutor:
    """Runs argv on one inventory host with Ansible and fetches the result JSON it names."""

    def __init__(
        self,
        inventory: Path,
        host: str,
        local_dir: Path,
        timeout_s: float = 3600,
        deployer: LayoutDeployer | None = None,
    ) -> None:
        self.inventory, self.host, self.local_dir, self.timeout_s = inventory, host, local_dir, timeout_s
        self.deployer = deployer
        self.local_dir.mkdir(parents=True, exist_ok=True)

    def prepare(self, point: BenchPoint) -> None:
        """Before a point: switch the cluster to the point's layout when redeploying."""
        if self.deployer is not None:
            self.deployer.ensure(point.layout)

    def _ansible(self, module: str, args: dict[str, Any]) -> dict[str, Any]:
        """One ad-hoc module run on the host; its result as Ansible's tree callback saved it."""
        return adhoc(self.inventory, self.host, module, args, self.timeout_s)

    def __call__(self, argv: list[str], point: BenchPoint) -> Path:
        remote_dir = argv[argv.index("--result-dir") + 1]
        name = argv[argv.index("--result-filename") + 1]
        mk = self._ansible("ansible.builtin.file", {"path": remote_dir, "state": "directory"})
        if mk.get("failed"):
            raise LiveBenchError(f"{self.host}: cannot create {remote_dir}: {mk.get('msg')}")
        out = self._ansible("ansible.builtin.command", {"argv": argv})
        if out.get("failed") or out.get("rc", 1) != 0:
            tail = (str(out.get("stdout", "")) + "\n" + str(out.get("stderr", "") or out.get("msg", "")))[-2500:]
            raise LiveBenchError(f"vllm bench serve failed on {self.host} (rc={out.get('rc')}):\n{tail}")
        dest = self.local_dir / name
        got = self._ansible("ansible.builtin.fetch", {"src": f"{remote_dir}/{name}", "dest": str(dest), "flat": True})
        if got.get("failed") or not dest.exists():
            raise LiveBenchError(f"{self.host}: could not fetch {remote_dir}/{name}: {got.get('msg')}")
        return dest


def http_scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()
