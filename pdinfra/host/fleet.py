"""The fleet view: hosts validated together, compared with one another (issue 23, item 3).

A host can pass every check of its own and still be the slow one: a riser that lets its GPUs train only at Gen4
(the per-host check judges the width, since the generation drops at idle), a raw copy that is slow on the GPU
itself (then NIXL is slow by as much, and the transfer verdicts, which judge NIXL against that copy, pass). Only
the other hosts show it. So when several hosts are validated at once, :func:`compare` holds them side by side:

- **figures**: every number that several hosts report (NVLink and PCIe bandwidth per GPU, rail speed and NIC
  lanes per RDMA port, GPU and active-port counts, and, from their transfer reports, the bandwidth-bound NIXL
  cases and the raw copies). A host more than ``margin`` (default 10 %) below the fleet median of a figure is
  flagged with the figure, its value, the median and the margin. Higher is better for every figure. A median of
  fewer than :data:`MIN_HOSTS` hosts cannot say which one is slow: that is reported as "cannot judge" (warn,
  never pass).
- **versions**: the driver, the CUDA version of the driver, the GPU model, VBIOS, NIC firmware, fabric manager,
  kernel, OS, UCX and (from the transfer reports) NIXL and torch. A host whose value differs from the fleet's
  majority is flagged with what differs; this holds for two hosts too (then there is no majority, and both are
  named).

Everything here is pure: facts dicts (:mod:`pdinfra.host.facts`) in, rows out. The transfer layer turns its reports
into figures and versions of the same kind (:mod:`pdinfra.transfer.fleet_figures`); the CLI joins them per host.
Fleet rows are warnings, never failures: they say which host to look at; the per-host checks say what is broken.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pdinfra.host.checks import NA, PASS, WARN
from pdinfra.host.linklimits import PCIE_LANE_GBPS, nvlink_gbps

DEFAULT_MARGIN = 0.10
MIN_HOSTS = 3  # a median of two cannot tell the slow host from the fast one
NOT_RECORDED = "not in any host's facts: cannot compare"

NVLINK_REMEDY = (
    "`nvidia-smi nvlink -s -i <gpu>` on this host and a healthy one: a link at a lower rate or down; then "
    "`nvidia-smi nvlink -e` for its error counters (gpu.nvlink_errors), reseat or RMA the baseboard."
)
PCIE_REMEDY = (
    "`nvidia-smi -q -d PCIE` / `lspci -vv -s <bdf>` (LnkSta vs LnkCap): a riser, slot or BIOS setting that "
    "trains the link narrower or a generation lower; reseat, check the BIOS PCIe settings."
)
RAIL_REMEDY = "`ethtool <netdev>`, `mlxlink -d <pci>`: the cable, transceiver or switch port of this rail."
NIC_PCIE_REMEDY = "Reseat the NIC or its riser (400G needs Gen5 x16); `lspci -vv -s <pci>`."
COUNT_REMEDY = "A device is missing on this host: see its gpu.count / rdma.ports results."
VERSION_REMEDY = {
    "driver": "Pin one driver (nvidia_driver_version) and re-run the nvidia_driver role on this host.",
    "CUDA (driver)": "It follows the driver: converge the driver.",
    "GPU": "A different GPU model or count: compare like with like (one hardware profile per fleet view).",
    "VBIOS": "Flash the fleet's VBIOS from the system vendor's firmware bundle (nvidia-smi -q shows it per GPU).",
    "NIC firmware": "Update the NIC to the fleet's firmware (`mlxfwmanager`, or the vendor's bundle), then reset it.",
    "fabric manager": "Install nvidia-fabricmanager at exactly the driver version.",
    "kernel": "Boot the fleet's kernel (the same package and cmdline on every host).",
    "OS": "Converge the OS release.",
    "UCX": "Use the same UCX on every host (the one bundled with the serving venv's NIXL wheel).",
    "NIXL": "Install the same serving venv (wheelhouse) on every host.",
    "torch": "Install the same serving venv (wheelhouse) on every host.",
}


@dataclass(frozen=True)
class Figure:
    """One number a host reports; higher is better."""

    value: float
    unit: str
    remedy: str = ""
    noisy: bool = False  # a software path (tcp) whose speed varies run to run: compared only beside a steadier one


@dataclass
class HostSample:
    """What the fleet view compares of one host."""

    host: str
    figures: dict[str, Figure] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One line of the fleet view: a flag against one host, or a comparison that holds (or cannot be made)."""

    id: str  # fleet.figure or fleet.version
    subject: str  # the figure's or the fact's name
    verdict: str
    evidence: str
    remedy: str = ""
    host: str = "*"  # the flagged host; "*" for the fleet
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def flag(self) -> bool:
        return self.verdict == WARN and self.host != "*"

    def to_dict(self) -> dict[str, Any]:
        """A check-result-shaped dict (`validate --json` rows) with the comparison under ``fleet``."""
        title = f"fleet median: {self.subject}" if self.id == "fleet.figure" else f"fleet majority: {self.subject}"
        return {
            "id": self.id,
            "title": title,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "remedy": self.remedy,
            "layer": "fleet",
            "host": self.host,
            "fleet": self.detail,
        }


@dataclass
class FleetView:
    hosts: list[str]
    margin: float
    rows: list[Row]

    def flags(self) -> list[Row]:
        return [r for r in self.rows if r.flag]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.rows]


# --------------------------------------------------------------------------- what the facts give


def _rate_gbps(rate: str | None) -> float | None:
    """RDMA port rate '400 Gb/sec (4X NDR)' -> 400.0."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate or "")
    return float(m.group(1)) if m else None


def facts_figures(facts: dict[str, Any]) -> dict[str, Figure]:
    gpus = facts.get("gpus") or {}
    out: dict[str, Figure] = {}
    devices = list(gpus.get("devices") or []) if gpus.get("present") else []
    if gpus.get("present") and gpus.get("count") is not None:
        out["GPUs (NVML)"] = Figure(float(gpus["count"]), "GPUs", COUNT_REMEDY)
    for d in devices:
        gpu = f"gpu{d.get('index')}"
        if d.get("nvlinks"):  # a GPU with NVLinks whose links are all down has 0 GB/s, not no figure
            out[f"{gpu} NVLink GB/s"] = Figure(nvlink_gbps(d) or 0.0, "GB/s", NVLINK_REMEDY)
        pcie = d.get("pcie") or {}
        gen, width = pcie.get("max_gen"), pcie.get("cur_width")
        if isinstance(gen, int) and gen in PCIE_LANE_GBPS and isinstance(width, int):
            # the generation it may reach times the lanes it trained (the current generation drops at idle)
            out[f"{gpu} PCIe GB/s"] = Figure(round(PCIE_LANE_GBPS[gen] * width, 1), "GB/s", PCIE_REMEDY)
    rdma = facts.get("rdma") or {}
    interfaces = (facts.get("netdevs") or {}).get("interfaces") or {}
    active = 0
    for dev in (rdma.get("devices") or []) if rdma.get("present") else []:
        name = dev.get("name")
        for port in dev.get("ports") or []:
            active += port.get("state") == "ACTIVE"
            speed = _rate_gbps(port.get("rate"))
            if speed is None:
                ndevs = list(dev.get("netdevs") or []) + [g.get("ndev") for g in port.get("gids") or []]
                mbps = next((interfaces.get(n, {}).get("speed_mbps") for n in ndevs if n in interfaces), None)
                speed = mbps / 1000 if mbps else None
            if speed is not None:
                out[f"{name} port {port.get('port')} Gb/s"] = Figure(speed, "Gb/s", RAIL_REMEDY)
        width = (dev.get("pcie") or {}).get("cur_width")
        if isinstance(width, int):
            out[f"{name} PCIe lanes"] = Figure(float(width), "lanes", NIC_PCIE_REMEDY)
    if rdma.get("present"):
        out["RDMA ports ACTIVE"] = Figure(float(active), "ports", COUNT_REMEDY)
    return out


def _distinct(values: list[Any]) -> str | None:
    seen = sorted({str(v) for v in values if v not in (None, "")})
    return ", ".join(seen) or None


def gpu_host(facts: dict[str, Any]) -> bool:
    """NVML, the driver, the PCI bus or the declared role says the host has NVIDIA GPUs (NVML may have failed)."""
    return bool(
        (facts.get("gpus") or {}).get("present")
        or (facts.get("nvidia_driver") or {}).get("loaded")
        or (facts.get("pci") or {}).get("gpus")
        or (facts.get("expect") or {}).get("role") == "gpu"
    )


def facts_versions(facts: dict[str, Any]) -> dict[str, str | None]:
    """The versions a host's facts carry: None where unknown; the GPU ones absent on a host without GPUs and the NIC
    firmware on a host without RDMA devices (there they do not apply: nothing to compare, rather than a difference)."""
    out: dict[str, str | None] = {}
    if gpu_host(facts):
        gpus = facts.get("gpus") or {}
        devices = list(gpus.get("devices") or []) if gpus.get("present") else []
        cuda = gpus.get("cuda_driver_version")
        names = Counter(str(d.get("name") or "?") for d in devices)
        fm = facts.get("fabric_manager") or {}
        out["driver"] = (facts.get("nvidia_driver") or {}).get("version") or gpus.get("driver_version")
        out["CUDA (driver)"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        out["GPU"] = ", ".join(f"{n}x {name}" for name, n in sorted(names.items())) or None
        out["VBIOS"] = _distinct([d.get("vbios") for d in devices])
        out["fabric manager"] = fm.get("version") if fm.get("installed") else None
    rdma = facts.get("rdma") or {}
    if rdma.get("present"):
        out["NIC firmware"] = _distinct([d.get("fw_ver") for d in rdma.get("devices") or []])
    out["kernel"] = (facts.get("kernel") or {}).get("release")
    out["OS"] = (facts.get("os") or {}).get("pretty_name")
    out["UCX"] = (facts.get("ucx") or {}).get("version")
    return out


def sample(
    host: str,
    facts: dict[str, Any],
    figures: dict[str, Figure] | None = None,
    versions: dict[str, str | None] | None = None,
) -> HostSample:
    """A host's facts, plus what other layers measured on it (e.g. :func:`pdinfra.transfer.fleet_figures.figures`)."""
    return HostSample(host, {**facts_figures(facts), **(figures or {})}, {**facts_versions(facts), **(versions or {})})


# --------------------------------------------------------------------------- the comparison


def pct(fraction: float) -> str:
    """0.1 -> '10%', 0.125 -> '12.5%'."""
    return f"{fraction * 100:.4g}%"


def _num(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _figure_rows(samples: list[HostSample], margin: float) -> list[Row]:
    names = sorted({n for s in samples for n in s.figures})
    if not names:
        return []
    if len(samples) < MIN_HOSTS:
        values = {n: {s.host: s.figures[n].value for s in samples if n in s.figures} for n in names}
        return [
            Row(
                "fleet.figure",
                f"{len(names)} figures",
                WARN,
                f"cannot judge: {len(samples)} hosts; a median needs at least {MIN_HOSTS} to tell the slow host "
                f"from the fast one ({len(names)} figures not compared)",
                f"Validate {MIN_HOSTS} or more hosts of the same kind together.",
                detail={"hosts": len(samples), "min_hosts": MIN_HOSTS, "margin": margin, "figures": values},
            )
        ]
    rows = []
    for name in names:
        have = {s.host: s.figures[name] for s in samples if name in s.figures}
        values = {h: f.value for h, f in have.items()}
        unit = next(iter(have.values())).unit
        detail: dict[str, Any] = {"figure": name, "unit": unit, "hosts": len(have), "margin": margin, "values": values}
        if len(have) < MIN_HOSTS:
            missing = sorted(s.host for s in samples if name not in s.figures)
            rows.append(
                Row(
                    "fleet.figure",
                    name,
                    WARN,
                    f"cannot judge: reported by {len(have)} of {len(samples)} hosts (none from {', '.join(missing)})",
                    "",
                    detail=detail,
                )
            )
            continue
        if all(f.noisy for f in have.values()):
            rows.append(
                Row(
                    "fleet.figure",
                    name,
                    NA,
                    "not compared: a software path (tcp) on every host, whose "
                    "speed varies run to run by more than the margin",
                    detail=detail,
                )
            )
            continue
        median = statistics.median(values.values())
        detail["median"] = median
        floor = median * (1 - margin)
        low = {h: v for h, v in values.items() if median > 0 and v < floor}
        for h, v in sorted(low.items()):
            below = 1 - v / median
            rows.append(
                Row(
                    "fleet.figure",
                    name,
                    WARN,
                    f"{name}: {_num(v)} {unit}, {below:.1%} below the fleet median {_num(median)} {unit} "
                    f"(margin {pct(margin)}, {len(have)} hosts)",
                    have[h].remedy,
                    h,
                    dict(detail, value=v, below=round(below, 4)),
                )
            )
        if not low:
            rows.append(
                Row(
                    "fleet.figure",
                    name,
                    PASS,
                    f"{len(have)} hosts within {pct(margin)} of the median {_num(median)} {unit}",
                    detail=detail,
                )
            )
    return rows


def _version_rows(samples: list[HostSample]) -> list[Row]:
    facts: list[str] = []
    for s in samples:
        facts += [k for k in s.versions if k not in facts]
    rows = []
    for fact in facts:
        values = {s.host: s.versions[fact] for s in samples if fact in s.versions}  # absent: does not apply there
        known = {h: v for h, v in values.items() if v}
        detail: dict[str, Any] = {"fact": fact, "values": values}
        if not known:
            rows.append(Row("fleet.version", fact, NA, NOT_RECORDED, detail=detail))
            continue
        if len(values) < 2:
            only = next(iter(values))
            rows.append(Row("fleet.version", fact, NA, f"only {only} has one: nothing to compare", detail=detail))
            continue
        counts = Counter(known.values()).most_common()
        majority = counts[0][0] if len(counts) == 1 or counts[0][1] > counts[1][1] else None
        detail["majority"] = majority
        remedy = VERSION_REMEDY.get(fact, "Converge this host to the fleet's version.")
        if majority is None:
            spread = "; ".join(f"{v} on {', '.join(sorted(h for h, x in known.items() if x == v))}" for v, _ in counts)
        for h, v in values.items():
            if not v:
                rows.append(
                    Row(
                        "fleet.version",
                        fact,
                        WARN,
                        f"{fact}: not recorded on this host; the fleet's: {majority or 'no majority'}",
                        "Gather this host's facts on the host itself (`pdinfra facts`; docs/facts.md says what each "
                        "version is read from), or give its transfer report for NIXL and torch.",
                        h,
                        dict(detail, value=None),
                    )
                )
            elif majority is None:
                rows.append(
                    Row(
                        "fleet.version",
                        fact,
                        WARN,
                        f"{fact}: {v}; no majority in the fleet ({spread})",
                        remedy,
                        h,
                        dict(detail, value=v),
                    )
                )
            elif v != majority:
                rows.append(
                    Row(
                        "fleet.version",
                        fact,
                        WARN,
                        f"{fact}: {v}, the fleet's majority {majority} ({counts[0][1]} of {len(values)} hosts)",
                        remedy,
                        h,
                        dict(detail, value=v),
                    )
                )
        if majority is not None and all(v == majority for v in values.values()):
            rows.append(Row("fleet.version", fact, PASS, f"{len(values)} hosts on {majority}", detail=detail))
    return rows


def compare(samples: list[HostSample], margin: float = DEFAULT_MARGIN) -> FleetView:
    """Compare several hosts; ``margin`` is the fraction below the median that flags a host (0.1 = 10 %)."""
    if not 0 < margin < 1:
        raise ValueError(f"margin {margin}: want a fraction between 0 and 1 (0.1 = 10 %)")
    hosts = [s.host for s in samples]
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"host names must be unique: {', '.join(hosts)}")
    return FleetView(hosts, margin, _figure_rows(samples, margin) + _version_rows(samples))
