"""The resolver's role-variable part: every role variable an operator sets, checked against the one schema before any
host is touched.

First alone (groups pass): the type and choices of the role's ``meta/argument_specs.yml`` (Ansible's own validator),
then what :data:`pdinfra.cluster.schema.ROLE_RULES` says the value means: its unit (a duration carries one, a number
of seconds does not), its range (a fraction is 0-1), its format. Then against the cluster (roles pass, after the
services): the alert rules against the scrape interval, the transports a host is told to use against the rails and
GPUs it declares, the environment the instances get against what pdinfra writes itself, and every service's port
against the user it runs as. Each problem names the host, the variable, the value and what is allowed.
"""

from __future__ import annotations

import re
from typing import Any

from pdinfra.cluster import schema
from pdinfra.cluster.checker import Checker, InventoryView, Settings, role_value, show, unit_hint
from pdinfra.cluster.model import Host, KVStore, Monitoring, Router

# UCX transports that need an RDMA NIC (a rail), and those that need a GPU.
RDMA_TLS = re.compile(r"^(rc|dc|ud|ib)(_|$)")
CUDA_TLS = re.compile(r"^(cuda|gdr)")
# The alert PdinfraDeepHealthStale (roles/pd_monitoring/templates/pdinfra-rules.yml.j2): the probe's last run older
# than this many seconds.
PROBE_STALE_S = 180


def duration_s(text: str) -> float | None:
    """Seconds of a Prometheus duration ("1h30m" -> 5400), or None when it is not one."""
    if not isinstance(text, str) or not re.fullmatch(schema.PROM_DURATION, text):
        return None
    return sum(int(n) * schema.DURATION_UNITS[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", text))


def unit_problem(name: str, raw: Any) -> str | None:
    """A value written in the wrong unit, said as such (Ansible's own message would be a failed conversion)."""
    rule = schema.ROLE_RULES.get(name)
    if rule is None or isinstance(raw, (bool, list, dict)) or raw is None:
        return None
    if rule.unit == "duration":
        if isinstance(raw, (int, float)) or re.fullmatch(r"\s*[0-9]+(\.[0-9]+)?\s*", str(raw)):
            number = str(raw).strip()
            return (
                f"must be {schema.UNITS['duration']}, not {show(raw)}: Prometheus reads a bare number as no "
                f"duration at all (did you mean {number}s?)"
            )
        if duration_s(str(raw)) is None:
            return (
                f"must be {schema.UNITS['duration']}: digits and units ms, s, m, h, d, w, y such as 90s or 1h30m, "
                f"not {show(raw)}"
            )
        return None
    if rule.unit == "fraction" and isinstance(raw, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*", raw)
        if m:
            return f"must be {schema.UNITS['fraction']}, not {show(raw)} (did you mean {float(m[1]) / 100:g}?)"
        return None
    if rule.unit in ("s", "ms", "us", "GiB", "MiB", "bytes") and isinstance(raw, str):
        hint = unit_hint(raw, rule.unit)
        if hint:
            return f"must be {_range(rule)}, not {show(raw)}{hint}"
    return None


def _number(x: float | None) -> str:
    return "" if x is None else str(int(x)) if float(x).is_integer() else f"{x:g}"


def _range(rule: schema.Rule) -> str:
    """ "in 1..86400 seconds"; the unit only where it is not plain from the number (a time, a size)."""
    what = f" {schema.UNITS[rule.unit]}" if rule.unit in ("s", "ms", "us", "GiB", "MiB") else ""
    return f"in {_number(rule.min)}..{_number(rule.max)}{what}"


def rule_problem(name: str, value: Any, raw: Any) -> str | None:
    """The value (as the argument spec converted it) against its rule's range and format."""
    rule = schema.ROLE_RULES.get(name)
    if rule is None:
        return None
    if rule.pattern is not None:
        return None if re.fullmatch(rule.pattern, str(value)) else f"must be {rule.what}, not {show(raw)}"
    if rule.min is None or rule.max is None or rule.unit == "duration":
        return None
    try:
        n = float(value)
    except (TypeError, ValueError):
        return None  # reported by the argument spec
    if rule.min <= n <= rule.max:
        return None
    if rule.unit == "fraction":
        hint = f" (did you mean {n / 100:g}?)" if 1 < n <= 100 else ""
        return f"must be {schema.UNITS['fraction']}, not {show(raw)}{hint}"
    return f"must be {_range(rule)}, not {show(raw)}"


def check_role_vars(ck: Checker, hostvars: dict[str, dict[str, Any]]) -> None:
    """Types and choices by each role's argument_specs (Ansible's own validator), then units, ranges and formats
    (ROLE_RULES), then what the templates take as they are (environment names)."""
    try:
        from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    except ImportError:  # pragma: no cover - the controller extras bring ansible-core
        ArgumentSpecValidator = None  # noqa: N806
    for h, hv in hostvars.items():
        for role, rs in schema.role_schemas().items():
            params = {k: v for k, v in hv.items() if k in rs.variables and k not in schema.DERIVED_ROLE_VARS}
            if not params:
                continue
            for k in list(params):
                why = unit_problem(k, params[k])
                if why is not None:
                    ck.add(k, why, h)
                    params.pop(k)
            validated = _argument_spec(ck, ArgumentSpecValidator, role, rs, params, h)
            for k in params:
                # Ansible converts what it can: 12 to "12", "a,b" to a list. A list or mapping where one word is
                # meant, or true/false where a number is, is a mistake it would turn into a string or a 1.
                want, got = rs.variables[k].type, params[k]
                if want in ("str", "path") and isinstance(got, (list, dict)):
                    ck.add(
                        k,
                        f"must be a {'path' if want == 'path' else 'string'}, not a "
                        f"{'list' if isinstance(got, list) else 'mapping'} ({show(got)})",
                        h,
                    )
                elif want in ("int", "float") and isinstance(got, bool):
                    ck.add(k, f"must be a number, not {show(got)}", h)
                elif want == "path" and isinstance(got, (str, int)) and not str(got).startswith(("/", "{{")):
                    ck.add(k, f"must be an absolute path on the node, not {show(got)}", h)
            for k, v in validated.items():
                why = rule_problem(k, v, params[k])
                if why is not None:
                    ck.add(k, why, h)
        _pairs(ck, hv, h)
        for name in ("ucx_extra_env", "vllm_instance_extra_env"):
            if isinstance(hv.get(name), dict):
                _environment(ck, h, name, hv[name])


def _argument_spec(
    ck: Checker, validator: Any, role: str, rs: schema.RoleSchema, params: dict[str, Any], h: str
) -> dict[str, Any]:
    """Ansible's validation of the role's argument spec; the values as it converted them."""
    if validator is None or not params:
        return params
    spec = {k: {kk: vv for kk, vv in rs.variables[k].spec.items() if kk not in ("description", "default")}
            for k in params}  # fmt: skip
    try:
        res = validator(spec).validate(dict(params))
    except Exception:  # Ansible's validator itself failed (a 2**63 in a list): find the variable
        validated: dict[str, Any] = {}
        for k in params:
            try:
                one = validator({k: spec[k]}).validate({k: params[k]})
            except Exception as exc:
                ck.add(
                    k,
                    f"cannot be checked against roles/{role}/meta/argument_specs.yml "
                    f"({type(exc).__name__}: {exc}); not {show(params[k])}",
                    h,
                )
                continue
            for msg in one.error_messages:
                ck.add(k, f"{msg} (roles/{role}/meta/argument_specs.yml)", h)
            validated.update(one.validated_parameters)
        return validated
    for msg in res.error_messages:
        names = [k for k in params if f"'{k}'" in msg or f"{k}." in msg or f" {k}" in msg]
        ck.add(names[0] if names else role, f"{msg} (roles/{role}/meta/argument_specs.yml)", h)
    return dict(res.validated_parameters)


def _pairs(ck: Checker, hv: dict[str, Any], h: str) -> None:
    """Role variables that must agree with each other on one host."""
    if "rdma_roce_tos" in hv or "rdma_roce_dscp" in hv:
        tos = hv.get("rdma_roce_tos", schema.role_var("rdma_roce_tos").default)
        dscp = hv.get("rdma_roce_dscp", schema.role_var("rdma_roce_dscp").default)
        try:
            if int(tos) // 4 != int(dscp):
                ck.add(
                    "rdma_roce_tos",
                    f"{tos}: its DSCP bits (tos >> 2 = {int(tos) // 4}) differ from "
                    f"rdma_roce_dscp={dscp}; set tos = dscp * 4 (+ ECN bits)",
                    h,
                )
        except (TypeError, ValueError):
            pass
    branch, version = hv.get("nvidia_driver_branch"), hv.get("nvidia_driver_version")
    if branch is not None or version is not None:
        branch = str(branch if branch is not None else schema.role_var("nvidia_driver_branch").default)
        version = str(version if version is not None else schema.role_var("nvidia_driver_version").default)
        if re.fullmatch(r"[0-9]{3}", branch) and not version.startswith(branch + "."):
            ck.add("nvidia_driver_version", f"{version!r} is not on nvidia_driver_branch {branch!r}", h)
    for name in ("pd_monitoring_ttft_buckets", "pd_monitoring_itl_buckets"):
        buckets = hv.get(name)
        if isinstance(buckets, list) and buckets:
            _buckets(ck, h, name, buckets)


def _buckets(ck: Checker, h: str, name: str, buckets: list[Any]) -> None:
    """The SLO attainment rules select vLLM's bucket by its label, le="0.5": a bound must be written as vLLM exports
    it (a float: 10.0, not 10, whose label "10" matches no series), above zero and ascending."""
    last = 0.0
    for i, b in enumerate(buckets):
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            return  # the argument spec reported it
        if isinstance(b, int):
            ck.add(
                f"{name}[{i}]",
                f'{b} must be written as {float(b)}: the rule selects le="{b}" and vLLM\'s '
                f'histogram exports le="{float(b)}", so the SLO attainment would be empty',
                h,
            )
            return
        if b <= last:
            ck.add(
                f"{name}[{i}]",
                f"{b} must be above {last:g}: the bounds are seconds in ascending order, as vLLM's histogram has them",
                h,
            )
            return
        last = b


def _environment(ck: Checker, h: str, name: str, env: dict[Any, Any]) -> None:
    """Extra environment: names the shell and systemd take, one-line scalar values, and none of the variables
    pdinfra writes itself from the model."""
    for key, value in env.items():
        where = f"{name}.{key}"
        if not isinstance(key, str) or not re.fullmatch(schema.ENV_NAME, key):
            ck.add(
                where,
                f"{show(key)} is not an environment variable name (letters, digits and _, not starting with a digit)",
                h,
            )
        elif key in schema.MANAGED_ENV:
            ck.add(
                where,
                f"{key} is written by pdinfra from {schema.MANAGED_ENV[key]}: set that instead (a second "
                "value in the unit's environment would be the one that counts, unseen by the model)",
                h,
            )
        elif isinstance(value, (list, dict)) or (isinstance(value, str) and "\n" in value):
            ck.add(where, f"must be one line of text or a number, not {show(value)}", h)


# ----------------------------------------------------------------------------------------- against the cluster
def check_against_cluster(
    inv: InventoryView,
    s: Settings,
    hosts: list[Host],
    routers: list[Router],
    monitoring: Monitoring | None,
    kv_store: KVStore | None,
) -> None:
    """The role variables that depend on the cluster: alert timings, transports and devices, unprivileged ports."""
    ck = inv.ck
    for h in hosts:
        hv = inv.hostvars.get(h.name, {})
        if not h.in_cluster:
            continue
        if monitoring is not None and monitoring.host == h.name:
            _alert_timing(ck, hv, h.name, monitoring)
        if monitoring is not None and h.router is not None:
            _probe_interval(ck, hv, h.name)
        if h.instances:
            _transports(ck, hv, h, s, kv_store)
        _unprivileged(ck, hv, h, kv_store)


def _alert_timing(ck: Checker, hv: dict[str, Any], host: str, monitoring: Monitoring) -> None:
    window = hv.get("pd_monitoring_window", schema.role_var("pd_monitoring_window").default)
    secs = duration_s(str(window)) if isinstance(window, str) else None
    need = 2 * monitoring.scrape_interval_s
    if secs is not None and secs < need:
        ck.add(
            "pd_monitoring_window",
            f"{window} holds fewer than two scrapes at pdinfra_scrape_interval_s "
            f"{monitoring.scrape_interval_s}: rate() over it is empty, so the recording rules and the alerts "
            f"built on them never fire; allowed: {need}s or more (4 scrapes, {4 * monitoring.scrape_interval_s}s, "
            "is Prometheus's advice)",
            host,
        )


def _probe_interval(ck: Checker, hv: dict[str, Any], host: str) -> None:
    probe = hv.get("pd_router_probe", True)
    interval = hv.get("pd_router_probe_interval_s")
    if probe in (False, "false", "no") or interval is None or not re.fullmatch(r"[0-9]+", str(interval)):
        return
    if int(interval) >= PROBE_STALE_S:
        ck.add(
            "pd_router_probe_interval_s",
            f"{interval} s is as long as or longer than the {PROBE_STALE_S} s after "
            "which the alert PdinfraDeepHealthStale fires (roles/pd_monitoring/templates/pdinfra-rules.yml.j2): it "
            f"would fire between every two probes; allowed: 5..{PROBE_STALE_S - 1}",
            host,
        )


def _transports(ck: Checker, hv: dict[str, Any], h: Host, s: Settings, kv_store: KVStore | None) -> None:
    """Every transport a host's instances are told to use against the rails (rdma_roce_nics) and GPUs it declares,
    on every profile."""
    devs = [r.rdma_dev for r in h.rails]
    names = ", ".join(i.name for i in h.instances)
    no_rails = f"{h.name} declares no RDMA rails (rdma_roce_nics) for its instances {names}"
    if (
        kv_store is not None
        and kv_store.protocol == "rdma"
        and not h.rails
        and s.profile != "cpu"
        and any(i.kv_store for i in h.instances)
    ):  # (the cpu profile has its own message)
        ck.add("pdinfra_kv_store_protocol", f"rdma, but {no_rails}; allowed: tcp, or declare the rails", h.name)
    if s.kv["transfer_engine"]:
        proto = hv.get("vllm_instance_mooncake_protocol", "tcp" if s.profile == "cpu" else "rdma")
        if proto == "rdma" and not h.rails:
            set_by = "" if "vllm_instance_mooncake_protocol" in hv else f" (the default on the {s.profile} profile)"
            ck.add(
                "vllm_instance_mooncake_protocol",
                f"rdma{set_by}, but {no_rails}: the {s.conn.title} connector could not "
                "move KV; allowed: tcp, or declare the rails",
                h.name,
            )
    for name in ("vllm_instance_kv_store_device_name", "vllm_instance_mooncake_device_name"):
        value = hv.get(name)
        if isinstance(value, str) and value:
            unknown = [d for d in value.split(",") if d not in devs]
            if unknown:
                ck.add(
                    name,
                    f"{value!r} names {', '.join(unknown)}, not a rail of this host (rdma_roce_nics: "
                    f"{', '.join(devs) or 'none'})",
                    h.name,
                )
    _ucx(ck, hv, h, devs)


def _ucx(ck: Checker, hv: dict[str, Any], h: Host, devs: list[str]) -> None:
    gpu = h.gpu
    kind = hv.get("ucx_host_kind", "auto")
    if kind == "auto":
        kind = "gpu_rdma" if gpu and h.rails else "gpu" if gpu else "cpu"
    elif kind in ("gpu_rdma", "gpu") and not gpu:
        ck.add(
            "ucx_host_kind",
            f"{kind}, but {h.name} runs no GPU host roles (pdinfra_gpu false or the cpu "
            "profile): UCX would look for CUDA transports it does not have; allowed: auto, cpu",
            h.name,
        )
    elif kind == "gpu_rdma" and not h.rails:
        ck.add(
            "ucx_host_kind",
            f"gpu_rdma, but {h.name} declares no RDMA rails (rdma_roce_nics); allowed: auto, gpu",
            h.name,
        )
    elif kind == "cpu" and gpu:
        ck.add(
            "ucx_host_kind",
            "cpu on a GPU host: UCX would offer no CUDA transport for the instances' KV in GPU "
            "memory; allowed: auto, gpu, gpu_rdma",
            h.name,
        )
    if kind not in ("gpu_rdma", "gpu", "cpu"):
        return
    var = f"ucx_tls_{kind}"
    tls = hv.get(var, schema.role_var(var).default)
    if isinstance(tls, str) and re.fullmatch(schema.ROLE_RULES[var].pattern or ".*", tls):
        names = tls.split(",")
        if "tcp" not in names:
            ck.add(
                var,
                f"{tls!r} lacks tcp: NIXL's UCX wire-up needs it (without it: \"no active messages "
                'transport"); allowed: the list with tcp in it',
                h.name,
            )
        rdma = [t for t in names if RDMA_TLS.match(t)]
        if rdma and not h.rails:
            ck.add(
                var,
                f"{tls!r} names {', '.join(rdma)}, but {h.name} declares no RDMA rails (rdma_roce_nics); "
                "allowed: transports without rc, dc, ud",
                h.name,
            )
        cuda = [t for t in names if CUDA_TLS.match(t)]
        if cuda and not gpu:
            ck.add(var, f"{tls!r} names {', '.join(cuda)} on a host without GPUs", h.name)
    nics = hv.get("ucx_nics")
    if isinstance(nics, list) and devs:
        for i, nic in enumerate(nics):
            dev = nic.get("rdma_dev") if isinstance(nic, dict) else None
            if dev is not None and dev not in devs:
                ck.add(
                    f"ucx_nics[{i}].rdma_dev",
                    f"{dev!r} is not a rail of {h.name} (rdma_roce_nics: "
                    f"{', '.join(devs)}): UCX_NET_DEVICES would name a device without an address",
                    h.name,
                )
    gpus_ = hv.get("ucx_gpus")
    count = h.expect.get("gpu_count")
    if isinstance(gpus_, list) and isinstance(count, int):
        for i, g in enumerate(gpus_):
            idx = g.get("index") if isinstance(g, dict) else None
            if isinstance(idx, int) and not isinstance(idx, bool) and not 0 <= idx < count:
                ck.add(f"ucx_gpus[{i}].index", f"{idx} is not a GPU of a {h.hardware} host (0..{count - 1})", h.name)


def _unprivileged(ck: Checker, hv: dict[str, Any], h: Host, kv_store: KVStore | None) -> None:
    """A service that runs as the service user (its role's hardening on) cannot bind a port below 1024."""
    ports: list[tuple[str, int]] = []
    if h.router is not None:
        ports += [
            ("pdinfra_router_port", h.router.port),
            ("pd_router_prometheus_port", h.router.metrics_port),
            ("pd_router_backend_port", h.router.backend_port),
        ]
        if h.router.lmcache_notify_port:
            ports.append(("pdinfra_lmcache_notify_port", h.router.lmcache_notify_port))
    if kv_store is not None and kv_store.host == h.name:
        ports += [("pdinfra_kv_store_port", kv_store.port), ("pdinfra_kv_store_metrics_port", kv_store.metrics_port)]
    for i in h.instances:
        ports += [(f"{i.var}.port", i.port), (f"{i.var}.side_channel_port", i.side_channel_port)]
    for var, port in ports:
        if port >= 1024 or port <= 0:
            continue
        hardening, what = schema.UNPRIVILEGED_PORTS[var.rsplit(".", 1)[-1]]
        if str(role_value(hv, hardening)).lower() in ("false", "no", "0", "off"):
            continue  # the unit runs as root
        ck.add(
            var,
            f"{port} is below 1024: {what} runs as the unprivileged pdinfra_service_user ({hardening} true) "
            "and cannot bind it; allowed: 1024..65535",
            h.name,
        )
