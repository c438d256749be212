"""The serving layer: the compilers vLLM needs at run time, and the pdinfra instances on the host."""

from __future__ import annotations

import json
from typing import Any

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import join_items
from pdinfra.host.checks.registry import Facts, Outcome, check, fail, na, ok, warn

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")
ROLES = ("prefill", "decode", "both")
PD_CONSISTENT_KEYS = ("model", "dtype", "block_size", "connector")


@check("serving.toolchain", "The compilers vLLM calls at run time are installed (inductor, Triton)", "serving")
def serving_toolchain(facts: Facts, expect: Expect) -> Outcome:
    """vLLM compiles kernels on first use: on CPU torch inductor's C++ backend (the sampler's logprobs path) with
    g++, on GPU Triton's launcher with a C compiler and Python.h. Without them the first such request kills the
    engine (EngineDeadError), not just the request.

    Reads: `toolchain` (`g++ --version`, `gcc --version`, `/usr/include/python3*/Python.h`)

    Rule: cpu hosts: fail without g++ or Python.h (vLLM CPU's sampler compiles its logprobs kernels with torch inductor,
    which includes Python.h; without them the first such request kills the engine); gpu hosts: fail without gcc or
    Python.h (Triton builds its launcher at the first kernel launch); warn if not recorded. Preflight only warns
    (`preflight_warn_only_checks`): pd_runtime installs `pd_runtime_compiler_packages`, then fails on it

    Remedy: `apt-get install g++ python3-dev` (cpu) / `gcc python3-dev` (gpu)
    """
    tc = facts.get("toolchain") or {}
    if not tc.get("known"):
        return warn(
            "compilers not recorded for this host (no pdinfra-cmd/g___--version.txt or gcc_--version.txt)",
            "Gather facts on the host itself (`pdinfra validate` there) to see its compilers.",
        )
    compilers = tc.get("compilers") or {}
    have = {k: v for k, v in compilers.items() if v}
    seen = ", ".join(f"{k}: {v}" for k, v in sorted(have.items())) or "no g++, no gcc"
    headers = tc.get("python_headers") or []
    cpu = expect.role == "cpu"
    need, who = ("g++", "torch inductor (vLLM CPU's sampler: logprobs)") if cpu else ("gcc", "Triton's launcher")
    problems = []
    if not have.get(need):
        problems.append(f"{seen}: {who} compiles with {need} at the first such request; without it the engine dies")
    if not headers:
        problems.append(f"no Python.h under /usr/include/python3*: {who} includes it")
    if problems:
        pkgs = "g++ python3-dev" if cpu else "gcc python3-dev"
        return fail(
            "; ".join(problems),
            f"Install {pkgs} from the distribution (pd_runtime installs "
            f"pd_runtime_compiler_packages; `apt-get install {pkgs}`).",
        )
    return ok(f"{need} for {who}: {have[need]}; {headers[0]}")


@check("serving.health", "vLLM instances answer /health", "serving")
def serving_health(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `instances[].health`

    Rule: fail if any instance is not healthy; warn if not probed (replay); n/a without instances

    Remedy: read the unit's journal; check the port
    """
    instances = facts.get("instances") or []
    if not instances:
        return na("no pdinfra serving instances on this host")
    bad = [
        f"{i.get('name') or i.get('file')}: {i.get('error') or i.get('health')}"
        for i in instances
        if i.get("health") not in ("ok", "not probed")
    ]
    unprobed = [str(i.get("name")) for i in instances if i.get("health") == "not probed"]
    if bad:
        units = sorted({str(i.get("unit")) for i in instances if i.get("unit")}) or ["<unit>"]
        return fail(
            join_items(bad),
            f"Read the service log (`journalctl -u {' -u '.join(units)}`) and check that each instance listens "
            "on its port; a model still loading answers /health only when ready.",
        )
    if unprobed:
        return warn(f"not probed: {', '.join(unprobed)}", "Validate on the host itself to probe /health.")
    return ok(", ".join(f"{i.get('name')}:{i.get('port')} ok" for i in instances))


@check("serving.deep_health", "The deep-health probe's last PD request moved KV over every path, recently", "serving")
def serving_deep_health(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `deep_health` (the probe's `/var/lib/pdinfra/probe/last.json`, its age)

    Rule: on the router node: fail if the last probe failed a prefill->decode pair (the pair and its evidence named),
    never ran, lists no pair, is unreadable or older than its bound; n/a on nodes without the probe timer

    Remedy: `journalctl -u pdinfra-probe`; the failing pair's units and `pdinfra validate --transfer`
    """
    dh = facts.get("deep_health") or {}
    if not dh.get("deployed"):
        return na("no deep-health probe on this host (pdinfra-probe.timer runs on the router node)")
    remedy_run = "Run it now: `systemctl start pdinfra-probe.service`, then read /var/lib/pdinfra/probe/last.json."
    if dh.get("error"):
        return fail(str(dh["error"]), remedy_run)
    last = dh.get("last")
    if not last:
        return fail("pdinfra-probe.timer is installed but the probe has no result yet", remedy_run)
    interval = dh.get("interval_s") or 30
    age = dh.get("age_s")
    if isinstance(age, (int, float)) and age > 3 * interval + 60:
        return fail(
            f"the last probe ran {age:.0f} s ago (every {interval} s expected): the timer is not running",
            "Check `systemctl status pdinfra-probe.timer pdinfra-probe.service`.",
        )
    paths = [p for p in last.get("paths") or [] if isinstance(p, dict)]
    if not paths:
        return fail("the last probe result lists no path", remedy_run)
    bad = [f"{p.get('path')}: {p.get('evidence')}" for p in paths if not p.get("ok")]
    when = f" ({age:.0f} s ago)" if isinstance(age, (int, float)) else ""
    if bad or not last.get("ok"):
        return fail(
            join_items(bad) + when,
            "A path whose /health is fine but whose PD request fails is the stale NIXL/UCX "
            "state of docs/reliability.md: restart the instances of that pair (the decode first).",
        )
    return ok(join_items(f"{p.get('path')} {float(p.get('seconds') or 0):.2f} s" for p in paths) + when)


@check(
    "serving.kv_integrity",
    "P->D answers equal the decode instance's own, from one KV block to 90 % of the context",
    "serving",
)
def serving_kv_integrity(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `deep_health.last.integrity` (the probe's KV integrity result in `/var/lib/pdinfra/probe/last.json`:
    each prefill->decode pair and prompt length, when it ran)

    Rule: on the router node: fail if a pair's P->D answer differed from the decode instance's own (greedy tokens,
    logprobs beyond the tolerance) or the KV did not move, if the check never ran, or if its last run is older than
    3 of its intervals; n/a without the probe timer, or where the check does not apply (aggregated layout, LMCache)

    Remedy: the pair named; same model, dtype and block size on every instance (`serving.pd_consistency`), the
    connector's errors in the decode's journal, `pdinfra validate --transfer`; then `pdinfra smoke`
    """
    dh = facts.get("deep_health") or {}
    if not dh.get("deployed"):
        return na("no deep-health probe on this host (pdinfra-probe.timer runs on the router node)")
    last = dh.get("last") or {}
    integ = last.get("integrity")
    run_now = (
        "Run it now: `systemctl start pdinfra-probe.service` (it runs the check when its last run is older "
        "than pd_router_probe_integrity_interval_s), or `pdinfra smoke` from the controller."
    )
    if not isinstance(integ, dict):
        return fail(
            "the probe's result has no KV integrity check (never run, or a probe older than pdinfra's)", run_now
        )
    if "skipped" in integ:
        return na(f"the KV integrity check does not apply: {integ['skipped']}")
    cases = [c for c in integ.get("cases") or [] if isinstance(c, dict)]
    ran, interval = integ.get("ran"), integ.get("interval_s")
    if not cases or not isinstance(ran, (int, float)):
        return fail("the KV integrity check ran no case", run_now)
    started = last.get("started")
    age = (started - ran) + (dh.get("age_s") or 0) if isinstance(started, (int, float)) else None
    if isinstance(age, (int, float)) and isinstance(interval, (int, float)) and age > 3 * max(interval, 30) + 60:
        return fail(f"the KV integrity check last ran {age:.0f} s ago (every {interval:g} s expected)", run_now)
    bad = [f"{c.get('pair')} at {c.get('tokens')} tokens: {c.get('evidence')}" for c in cases if not c.get("ok")]
    when = f" ({age:.0f} s ago)" if isinstance(age, (int, float)) else ""
    if bad or not integ.get("ok"):
        return fail(
            join_items(bad) + when,
            "The decode answered from KV that is not the prompt's. Check that every "
            "instance runs the same model, dtype and block size (serving.pd_consistency), the connector's "
            "errors in the decode's journal and the transfer path (`pdinfra validate --transfer`; "
            "UCX_NET_DEVICES on RDMA hosts); restart the pair's instances, decode first; `pdinfra smoke`.",
        )
    pairs = sorted({str(c.get("pair")) for c in cases})
    sizes = sorted({int(c.get("tokens") or 0) for c in cases})
    return ok(f"{len(cases)} cases equal over {', '.join(pairs)} at {', '.join(map(str, sizes))} prompt tokens" + when)


def pd_consistency_problems(instances: list[dict[str, Any]], pd_hosts: int) -> list[str]:
    problems = []
    for key in PD_CONSISTENT_KEYS:
        values = {json.dumps(i.get(key)) for i in instances}
        if len(values) > 1:
            problems.append(f"{key} differs: {', '.join(sorted(values))}")
    for inst in instances:
        if inst.get("role") not in ROLES:
            problems.append(f"{inst.get('name')}: role {inst.get('role')!r} not in {'/'.join(ROLES)}")
        if pd_hosts > 1 and str(inst.get("side_channel_host") or "") in LOCAL_HOSTS:
            problems.append(
                f"{inst.get('name')}: side_channel_host {inst.get('side_channel_host')!r} is local but the "
                f"deployment spans {pd_hosts} hosts"
            )
    return problems


@check("serving.pd_consistency", "Prefill/decode instances agree and do not collide", "serving")
def pd_consistency(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `instances[]`

    Rule: fail if model, dtype, block_size or connector differ, a role is not prefill/decode/both, two instances share
    `port` or `side_channel_port`, or `side_channel_host` is local while `pd_hosts` > 1

    Remedy: same model/dtype/block size/connector everywhere; own ports; routable side-channel host
    """
    instances = [i for i in facts.get("instances") or [] if "error" not in i]
    if not instances:
        return na("no pdinfra serving instances on this host")
    problems = pd_consistency_problems(instances, expect.pd_hosts)
    for key in ("side_channel_port", "port"):
        ports = [i.get(key) for i in instances]
        dupes = sorted({str(p) for p in ports if ports.count(p) > 1})
        if dupes:
            problems.append(f"{key} {', '.join(dupes)} used by more than one instance")
    if problems:
        return fail(
            join_items(problems),
            "Serve the same model, dtype, block size and KV connector on every instance; give each instance "
            "its own port and VLLM_NIXL_SIDE_CHANNEL_PORT; use a routable side_channel_host across hosts.",
        )
    roles = ", ".join(f"{i.get('name')}={i.get('role')}" for i in instances)
    return ok(
        f"{roles}; {instances[0].get('model')} {instances[0].get('dtype')} "
        f"block {instances[0].get('block_size')} {instances[0].get('connector')}"
    )
