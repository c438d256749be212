"""The KV connectors between prefill and decode, one class each: the one place that knows them by name.

Each connector says what it needs and what it means for every other part: vLLM's ``kv_transfer_config`` for an
instance, the router that speaks its protocol, the ports and files the instances need, the serving packages beyond
vLLM, whether it runs on the cpu profile, and how a decode's ``/metrics`` prove that KV moved. The resolver, the
roles (through the ``pdinfra_kv`` filters in ``filter_plugins/pdinfra_kv.py``), the smoke, the probe and the KV
integrity check ask a connector; none of them compares its name. Adding a connector touches this module, its tests
and docs/connectors.md.

Standard library only: Ansible's filters import it on the controller.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# vLLM's Prometheus names. NIXL's were renamed between releases (the first one present counts).
NIXL_TRANSFERS = ("vllm:nixl_xfer_time_seconds_count",)
NIXL_BYTES = ("vllm:nixl_bytes_transferred_sum", "vllm:nixl_bytes_transferred_total", "vllm:nixl_bytes_transferred")
NIXL_FAILED = ("vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers")
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
EXTERNAL_SOURCE = 'source="external_kv_transfer"'
LOCAL_SOURCE = 'source="local_compute"'


def _first(values: Mapping[str, float], names: tuple[str, ...]) -> float:
    return next((values[n] for n in names if n in values), 0.0)


def external_tokens(values: Mapping[str, float]) -> float:
    """Prompt tokens the instances took from a KV transfer (vLLM's ``prompt_tokens_by_source``), from metrics parsed
    as ``{'name{labels}': value}``."""
    return sum(v for k, v in values.items() if k.startswith(PROMPT_BY_SOURCE + "{") and EXTERNAL_SOURCE in k)


def local_tokens(values: Mapping[str, float]) -> float:
    """Prompt tokens the instances computed themselves."""
    return sum(v for k, v in values.items() if k.startswith(PROMPT_BY_SOURCE + "{") and LOCAL_SOURCE in k)


def _knob(knobs: Mapping[str, Any], name: str) -> str:
    value = knobs.get(name)
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Connector(ABC):
    """One KV connector. The flags describe the PD layout; in the aggregated layout no connector joins instances.
    ``moved`` and ``proof`` read NIXL's transfer counters, which NIXL and LMCache (NIXL transport) both export;
    a connector without them says how else its KV is seen to move (Mooncake)."""

    name: str  # pdinfra_connector's value
    title: str  # as people write it
    vllm_class: str  # vLLM's kv_connector
    router: str = "vllm-router"  # what routes PD requests: vllm-router (--kv-connector NAME) or pdinfra's lmcache-proxy
    two_stage: bool = True  # prefill then decode with kv_transfer_params (the smoke, integrity check and gateway)
    bootstrap: bool = False  # each prefill runs a bootstrap server on its side_channel_port; the router names it
    transfer_engine: bool = False  # Mooncake's transfer engine: VLLM_HOST_IP and the MC_* port range
    config_file: bool = False  # a connector file per instance (LMCACHE_CONFIG_FILE) and the proxy's notify port
    packages: tuple[str, ...] = ()  # the pd_runtime variables that list its packages beyond vLLM
    not_on_cpu: str = ""  # why it does not run on the cpu profile ("" when it does)
    uni_executor: bool = True  # one CPU instance may run under vLLM's uni executor
    store_composes: bool = True  # the KV reuse tier composes with it (MultiConnector: this connector, then the store)
    moved_what: str = ""  # what the decode's /metrics count when KV moved

    @abstractmethod
    def extra_config(self, instance: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
        """The connector's kv_connector_extra_config for one instance, from the role's knobs."""

    def kv_transfer_config(self, instance: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
        """vLLM's kv_transfer_config of this connector alone, for one instance (``kv_role``, ``name``, ``role``)."""
        return {
            "kv_connector": self.vllm_class,
            "kv_role": instance["kv_role"],
            "kv_buffer_device": knobs["kv_buffer_device"],
            "kv_connector_extra_config": self.extra_config(instance, knobs),
        }

    def moved(self, values: Mapping[str, float]) -> tuple[float, float]:
        """(KV moved, failed transfers) on a decode, from its parsed /metrics."""
        return _first(values, NIXL_TRANSFERS), _first(values, NIXL_FAILED)

    def proof(self, before: Mapping[str, float], after: Mapping[str, float], prompt_tokens: int) -> tuple[bool, str]:
        """Whether two smoke requests' KV moved from prefill to decode, and the evidence: the transfer counters grew,
        with bytes and without failures."""
        ext = external_tokens(after) - external_tokens(before)
        count = _first(after, NIXL_TRANSFERS) - _first(before, NIXL_TRANSFERS)
        sent = _first(after, NIXL_BYTES) - _first(before, NIXL_BYTES)
        failed = _first(after, NIXL_FAILED) - _first(before, NIXL_FAILED)
        return count >= 2 and sent > 0 and failed == 0, (
            f"decode /metrics: +{count:.0f} NIXL transfers, +{sent:.0f} bytes, +{failed:.0f} failed, "
            f"+{ext:.0f} prompt tokens from external_kv_transfer"
        )

    def in_effect(self, layout: str) -> dict[str, Any]:
        """What the roles read (the ``pdinfra_kv`` filter): this connector's flags under ``layout``; under ``agg``
        no connector joins the instances, so every PD flag is off."""
        pd = layout == "pd"
        flags = asdict(self)
        for k in ("two_stage", "bootstrap", "transfer_engine", "config_file"):
            flags[k] = flags[k] and pd
        return {**flags, "pd": pd, "router": self.router if pd else "vllm-router"}


@dataclass(frozen=True)
class Nixl(Connector):
    """vLLM's NixlConnector: the decode reads the prefill's blocks (UCX over RDMA, NVLink or TCP)."""

    name: str = "nixl"
    title: str = "NIXL"
    vllm_class: str = "NixlConnector"
    moved_what: str = "NIXL transfers"

    def extra_config(self, instance: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"kv_lease_duration": int(knobs["kv_lease_duration"])}
        if _knob(knobs, "nixl_num_threads"):
            out["num_threads"] = int(knobs["nixl_num_threads"])
        return out


@dataclass(frozen=True)
class Mooncake(Connector):
    """vLLM's MooncakeConnector: the prefill writes into the decode's blocks over Mooncake's transfer engine (tcp on
    cpu, rdma on gpu); each prefill's bootstrap server is VLLM_MOONCAKE_BOOTSTRAP_PORT, which vllm-router passes
    on (``--prefill URL PORT``)."""

    name: str = "mooncake"
    title: str = "Mooncake"
    vllm_class: str = "MooncakeConnector"
    bootstrap: bool = True
    transfer_engine: bool = True
    # In the fresh-clone run of 2026-12-03 one n=2 request through Mooncake PD hung for 120 s under uni.
    uni_executor: bool = False
    store_composes: bool = False
    moved_what: str = "prompt tokens moved by Mooncake"

    def extra_config(self, instance: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"mooncake_protocol": knobs["mooncake_protocol"]}
        if _knob(knobs, "mooncake_device_name"):
            out["device_name"] = knobs["mooncake_device_name"]
        if _knob(knobs, "mooncake_num_workers"):
            out["num_workers"] = int(knobs["mooncake_num_workers"])
        return out

    def moved(self, values: Mapping[str, float]) -> tuple[float, float]:
        """vLLM 0.32's MooncakeConnector exports no transfer metric: the prompt tokens the decode took from the
        transfer count instead (no failure count)."""
        return external_tokens(values), 0.0

    def proof(self, before: Mapping[str, float], after: Mapping[str, float], prompt_tokens: int) -> tuple[bool, str]:
        """The decode instances took both smoke requests' prompts (2 x ``prompt_tokens``) from the transfer (seen on
        the local cluster: +44 for two 22-token prompts, none computed locally)."""
        ext = external_tokens(after) - external_tokens(before)
        local = local_tokens(after) - local_tokens(before)
        return prompt_tokens > 0 and ext >= 2 * prompt_tokens, (
            f"decode /metrics: +{ext:.0f} prompt tokens from external_kv_transfer, +{local:.0f} computed "
            f"locally (each request's prompt: {prompt_tokens} tokens)"
        )


@dataclass(frozen=True)
class LMCache(Connector):
    """LMCacheConnectorV1 with NIXL transport and LMCACHE_CONFIG_FILE (enable_pd); pdinfra's LMCache PD proxy routes
    (vllm-router does not speak its protocol). GPU only."""

    name: str = "lmcache"
    title: str = "LMCache"
    vllm_class: str = "LMCacheConnectorV1"
    router: str = "lmcache-proxy"
    two_stage: bool = False
    config_file: bool = True
    packages: tuple[str, ...] = ("pd_runtime_lmcache_packages",)
    not_on_cpu: str = (
        "needs GPU hosts: no LMCache release runs with vLLM's CPU build (LMCache RFC #4266); use nixl or mooncake on "
        "the cpu profile"
    )
    store_composes: bool = False
    moved_what: str = "NIXL transfers"

    def extra_config(self, instance: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
        # lmcache_rpc_port names the scheduler<->worker socket, unique per instance on a host; a decode skips the
        # proxy's appended first token.
        out: dict[str, Any] = {"discard_partial_chunks": False, "lmcache_rpc_port": instance["name"]}
        if instance.get("role") == "decode":
            out["skip_last_n_tokens"] = 1
        return out


CONNECTORS: dict[str, Connector] = {c.name: c for c in (Nixl(), Mooncake(), LMCache())}
DEFAULT = "nixl"
STORE_CLASS = "MooncakeStoreConnector"  # the KV reuse tier (pdinfra_kv_store)


def get(name: str | None) -> Connector:
    """The connector called ``name`` (the default when empty); KeyError naming the known ones otherwise."""
    key = (name or DEFAULT).strip().lower()
    if key not in CONNECTORS:
        raise KeyError(f"unknown KV connector {name!r}; known: {', '.join(CONNECTORS)}")
    return CONNECTORS[key]


def kv_transfer_config(
    connector: str, layout: str, instance: Mapping[str, Any], knobs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """An instance's ``--kv-transfer-config``, or None when it needs none (aggregated and not in the KV reuse tier).

    Under PD the cluster's connector; an instance in the reuse tier (``kv_store``) gets vLLM's MooncakeStoreConnector,
    under PD after the PD connector inside MultiConnector, which asks the PD connector first (a decode's KV comes from
    its prefill) and the store second (a prompt another instance computed). ``kv_load_failure_policy`` is read from
    the top level only (vLLM's scheduler), for every connector: the tier's own policy on its instances, the
    cluster's on the others."""
    conn = get(connector)
    pd, in_store = layout == "pd", bool(instance.get("kv_store"))
    if not pd and not in_store:
        return None
    if not in_store:
        top = conn.kv_transfer_config(instance, knobs)
    else:
        store = {
            "kv_connector": STORE_CLASS,
            "kv_role": instance["kv_role"] if pd else "kv_both",
            "kv_buffer_device": knobs["kv_buffer_device"],
            "kv_connector_extra_config": dict(knobs.get("kv_store_extra_config") or {}),
        }
        top = store
        if pd:
            multi = {"connectors": [conn.kv_transfer_config(instance, knobs), store]}
            top = {**store, "kv_connector": "MultiConnector", "kv_connector_extra_config": multi}
    policy = knobs["kv_store_load_failure_policy"] if in_store else knobs["kv_load_failure_policy"]
    return {
        "kv_connector": top["kv_connector"],
        "kv_role": top["kv_role"],
        "kv_buffer_device": top["kv_buffer_device"],
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": top["kv_connector_extra_config"],
    }
