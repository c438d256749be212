"""A transfer report's part of the fleet view (:mod:`pdinfra.host.fleet`): its figures and its versions.

The report is what ``pdinfra validate --transfer --transfer-output`` or ``pdinfra transfer --output`` writes.
Its figures: the GB/s of every *bandwidth-bound* case (:func:`pdinfra.transfer.verdicts.bandwidth_bound`: at least
16 MiB in one descriptor or in adjacent prepped ones), named by session and case, and the raw copy each session
measured between the same endpoints. Latency- and descriptor-bound cases are left out: they measure the cost of
the request's shape, and three recorded runs on the one 2xH200 host (``tests/fixtures/recorded/h200x2-*/transfer.json``,
``tests/fixtures/transfer/h200x2-main.json``) spread by up to 27 % on its 64 KiB cuda_ipc requests, against at most
9 % on the bandwidth-bound cuda_ipc cases: a 10 % margin would call the same host slow. Over tcp even the
bandwidth-bound cases spread by 20 %: such a case is marked noisy (a software path) and compared only where another
host took a zero-copy path.
"""

from __future__ import annotations

from typing import Any

from pdinfra.host.fleet import Figure
from pdinfra.transfer.verdicts import CaseResult, bandwidth_bound

NIXL_REMEDY = (
    "If this host's raw copy figure of the same session is low too, the path itself is slow (NVLink or PCIe: "
    "see its gpu figures); if only NIXL is, compare its UCX transport and environment (ucx.env, the UCX and NIXL "
    "versions) with a healthy host's. Re-run `pdinfra validate --transfer` to rule out a one-off."
)
COPY_REMEDY = (
    "A raw copy between the same endpoints is slow: the hardware path (NVLink, PCIe, the GPU's memory) of this "
    "host; see its NVLink/PCIe figures and `nvidia-smi -q -d CLOCK,PERFORMANCE` (clocks held low)."
)
PEER_REMEDY = (
    "The node-to-node path from this host is slow: run `validate --transfer --peer` between it and two healthy "
    "hosts to tell its rail from the peer's, then `ethtool`/`mlxlink` on the slow rail."
)


def _case_figures(results: list[dict[str, Any]], prefix: str, peer: str | None = None) -> dict[str, Figure]:
    out = {}
    for raw in results:
        r = CaseResult.from_dict(raw)
        if r.gbps is None or not bandwidth_bound(r):
            continue
        session = r.session.replace(peer, "PEER") if peer else r.session
        out[f"{prefix} {session}: {r.case}"] = Figure(
            round(r.gbps, 2), "GB/s", PEER_REMEDY if peer else NIXL_REMEDY, noisy=r.transport == "tcp"
        )
    return out


def figures(report: dict[str, Any]) -> dict[str, Figure]:
    """The report's bandwidth figures, named so that the same case of the same plan matches across hosts."""
    out = _case_figures(report.get("results") or [], "NIXL")
    for s in report.get("sessions") or []:
        copy = s.get("copy") or {}
        for direction in ("READ", "WRITE"):
            if isinstance(copy.get(direction), (int, float)):
                name = f"raw copy {s.get('label')}: {direction}-direction, {copy.get('kind') or '?'}"
                out[name] = Figure(round(float(copy[direction]), 2), "GB/s", COPY_REMEDY)
    peer = report.get("peer_session")
    if isinstance(peer, dict):
        out.update(_case_figures(peer.get("results") or [], "NIXL to peer", str(peer.get("peer") or "") or None))
    return out


def versions(report: dict[str, Any]) -> dict[str, str | None]:
    return {"NIXL": report.get("nixl_version"), "torch": report.get("torch_version")}
