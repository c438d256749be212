"""What the inventory declares about one host: the expectations the validator judges (docs/validation.md).

Part of the cluster description: pdinfra.cluster.resolve builds each host's expectations (hardware profile,
driver pin, rails, pdinfra_expect overrides) and checks them with :meth:`Expect.from_dict` before any host is
touched; the host layer (pdinfra.host.checks) judges facts against them; nodes read them from expect.json.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


def parse_version_tuple(release: str) -> list[int] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release or "")
    if not m:
        return None
    return [int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)]


# The integer health thresholds of Expect (each must be an integer >= 0; docs/validation.md, "Expectations").
THRESHOLD_KEYS = (
    "nvlink_recovery_max", "nvlink_crc_data_max", "nvlink_replay_max", "pcie_aer_correctable_max",
    "rdma_link_downed_max", "rdma_link_error_recovery_max",
)  # fmt: skip


@dataclass(frozen=True)
class RdmaExpect:
    netdev: str
    address: str | None = None
    mtu: int | None = None
    speed: int | None = None  # Mb/s, as /sys/class/net/<netdev>/speed reports it (400000 for 400G)

    @property
    def ip(self) -> str | None:
        return self.address.split("/", 1)[0] if self.address else None


@dataclass
class Expect:
    """What the inventory declares about one host (docs/validation.md, "Expectations")."""

    role: str = "gpu"
    gpu_count: int | None = None
    driver_version: str | None = None
    nvlink_version: str | None = None
    nvlinks_per_gpu: int | None = None
    fabric: bool | None = None
    rdma: list[RdmaExpect] = field(default_factory=list)
    ucx_tls_required: list[str] | None = None
    min_kernel: str = "5.12"
    pd_hosts: int = 1
    roce_qos: dict[str, Any] | None = None  # {pfc_priority, ecn, dscp_trust, roce_mode} of the rails
    ecc: bool | None = None  # ECC on every GPU (the HGX profiles: data-center GPUs ship with it on)
    # Health thresholds: the most a counter may read (since boot, driver load or the counters' last reset) before
    # the check complains. Counters since boot cannot give a rate, so each figure is a count, not DCGM's per-second.
    # NVLink, per link: DCGM's health watch calls any new recovery critical (DCGM_FR_NVLINK_ERROR_CRITICAL), as do
    # Meta's GCM defaults (threshold 0): a recovery is the link retraining under traffic.
    nvlink_recovery_max: int = 0
    # pdinfra's own: DCGM fails CRC errors at 100 per second (DCGM_LIMIT_MAX_NVLINK_CRC_ERROR, "RM has informed us
    # that CRC errors only matter at rates of 100+ per second"); 100 since boot is at most one such second.
    nvlink_crc_data_max: int = 100
    # pdinfra's own (warn only): replays retransmit what a CRC error dropped; a handful is noise, hundreds a marginal
    # link (DCGM and GCM alarm at the first, on a window rather than since boot).
    nvlink_replay_max: int = 100
    # pdinfra's own (warn only): correctable AER errors are retried by the link itself (GCM reports them as
    # informational); hundreds since boot point at signal integrity (riser, slot, retimer).
    pcie_aer_correctable_max: int = 100
    # azurehpc-health-checks' check_ib_link_flapping: one flap is tolerated, a second (within 6 h) fails.
    rdma_link_downed_max: int = 1
    # pdinfra's own: each link error recovery is a retrain that stalls the rail for a moment; GCM's IB counter
    # check goes critical above 100 errors of all kinds together.
    rdma_link_error_recovery_max: int = 10

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Expect:
        """From expect.json (or --expect): every key type-checked, each error naming the key."""
        data = dict(data or {})
        if "_error" in data:
            raise ValueError(str(data["_error"]))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown expectation key(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if data.get("role", "gpu") not in ("gpu", "cpu"):
            raise ValueError(f"role must be 'gpu' or 'cpu', not {data['role']!r}")

        def integer(key: str, value: Any, low: int) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{key} must be an integer >= {low}, not {value!r}")
            return value

        for key, low in (("gpu_count", 0), ("nvlinks_per_gpu", 0), ("pd_hosts", 1)):
            if data.get(key) is not None:
                data[key] = integer(key, data[key], low)
        for key in THRESHOLD_KEYS:
            if key in data:
                data[key] = integer(key, data[key], 0)
        for key in ("fabric", "ecc"):
            if data.get(key) is not None and not isinstance(data[key], bool):
                raise ValueError(f"{key} must be true or false, not {data[key]!r}")
        if not isinstance(data.get("rdma", []), (list, type(None))):
            raise ValueError(f"rdma must be a list of rails, not {data['rdma']!r}")
        if data.get("driver_version") is not None and not isinstance(data["driver_version"], str):
            raise ValueError(f"driver_version must be a string such as '580.159.04', not {data['driver_version']!r}")
        if "min_kernel" in data and not (
            isinstance(data["min_kernel"], str) and parse_version_tuple(data["min_kernel"])
        ):
            raise ValueError(f"min_kernel must be a kernel version such as '5.12', not {data['min_kernel']!r}")
        qos = data.get("roce_qos")
        if qos is not None:
            known_qos = {"pfc_priority", "ecn", "dscp_trust", "roce_mode"}
            if not isinstance(qos, dict) or set(qos) - known_qos:
                raise ValueError(f"roce_qos must be a mapping of {', '.join(sorted(known_qos))}, not {qos!r}")
            if qos.get("pfc_priority") is not None:
                integer("roce_qos pfc_priority", qos["pfc_priority"], 0)
                if qos["pfc_priority"] > 7:
                    raise ValueError(f"roce_qos pfc_priority must be 0..7, not {qos['pfc_priority']!r}")
            for key in ("ecn", "dscp_trust"):
                if qos.get(key) is not None and not isinstance(qos[key], bool):
                    raise ValueError(f"roce_qos {key} must be true or false, not {qos[key]!r}")
        tls = data.get("ucx_tls_required")
        if tls is not None and (not isinstance(tls, list) or not all(isinstance(t, str) and t for t in tls)):
            raise ValueError(f"ucx_tls_required must be a list of transport names, not {tls!r}")
        rdma = []
        for item in data.pop("rdma", None) or []:
            if isinstance(item, str):
                item = {"netdev": item}
            if not isinstance(item, dict) or "netdev" not in item:
                raise ValueError(f"each rdma entry needs a 'netdev': {item!r}")
            extra = set(item) - {"netdev", "address", "mtu", "speed"}
            if extra:
                raise ValueError(f"unknown rdma key(s) {sorted(extra)} in {item!r}")
            address = item.get("address")
            if address is not None:
                try:
                    if "/" not in str(address):
                        raise ValueError(address)
                    ipaddress.ip_interface(str(address))
                except ValueError:
                    raise ValueError(f"rdma address must be an address with prefix length, not {address!r}") from None
            mtu = integer("rdma mtu", item["mtu"], 576) if item.get("mtu") is not None else None
            speed = integer("rdma speed", item["speed"], 1) if item.get("speed") is not None else None
            rdma.append(RdmaExpect(str(item["netdev"]), address, mtu, speed))
        if data.get("nvlink_version") is not None:
            try:
                data["nvlink_version"] = normalise_nvlink_version(data["nvlink_version"])
            except ValueError:
                raise ValueError(f"nvlink_version must be like '4.0' or 4, not {data['nvlink_version']!r}") from None
        if data.get("driver_version") is not None:
            data["driver_version"] = str(data["driver_version"])
        return cls(rdma=rdma, **data)

    @classmethod
    def load(cls, path: str | Path) -> Expect:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    @property
    def gpu(self) -> bool:
        return self.role == "gpu"


def normalise_nvlink_version(value: Any) -> str:
    """4, "4", "4.0" -> "4.0" (the NVLink generation; NVML's enum value 6 is also 4.0)."""
    text = str(value).strip()
    return text if "." in text else f"{int(text)}.0"
