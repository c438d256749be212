"""Bandwidth acceptance (``pdinfra validate --acceptance``): what this host's GPUs and rails measure, against the
figures of its SKU (``pdinfra.cluster.profiles.Acceptance``, each with its source).

What runs, live, on this host:

- NCCL all-reduce and all-gather over all its GPUs (torch.distributed with NCCL from the serving venv, one process
  per GPU: pdinfra.transfer.acceptance.worker), sizes 64 MiB to 16 GiB as far as free GPU memory and
  ``--acceptance-max-bytes`` allow; algbw and busbw computed as nccl-tests does (:func:`busbw_gbps`).
- host->GPU and GPU->host copies per GPU from pinned memory on the GPU's NUMA node, GPU->GPU peer copies for every
  ordered pair.
- per-rail GPUDirect RDMA with perftest's ``ib_write_bw`` (CUDA buffers; each NIC with its GPU, by the affinity
  the ucx role wrote or by PCIe distance), in loopback on this host or against ``--peer``: the commands are listed,
  and run with ``--acceptance-rdma``.

Verdicts: pass at or above the SKU's figure, fail below it; warn where the SKU has no figure for a measurement
(it is reported, not judged), n/a where the measurement does not apply (one GPU: no pair, and a collective on one
rank crosses no link), never pass on something unknown.

The measurement (``measure``) and the perftest runner (``rdma_exec``) are parameters of :func:`run`, so that the
tests drive everything else without a GPU. Nothing here imports torch. ``python -m pdinfra.transfer.acceptance``
runs it without typer/rich (the standard library, torch and nvidia-ml-py are enough) and prints JSON.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdinfra.cluster.profiles import PROFILES, Acceptance, acceptance_for_gpus
from pdinfra.host.checks import CheckResult
from pdinfra.transfer.acceptance import dcgm
from pdinfra.transfer.acceptance.rails import (
    RailPlan,
    parse_ib_write_bw,
    perftest_status,
    plan_rails,
    rail_commands,
    rail_probe,
    run_ib_pair,
    shown,
    sysfs_pcie_path,
)
from pdinfra.transfer.fmt import GIB, MIB, fmt_bytes

PASS, WARN, FAIL, NA = "pass", "warn", "fail", "n/a"
LAYER = "acceptance"
OPS = ("all_reduce", "all_gather")
OP_NAME = {"all_reduce": "all-reduce", "all_gather": "all-gather"}
COLLECTIVE_SIZES = (64 * MIB, 256 * MIB, 1 * GIB, 4 * GIB, 16 * GIB)

# nccl-tests' bus bandwidth (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md "Bus Bandwidth"; src/all_reduce.cu and
# src/all_gather.cu, AllReduceGetBw / AllGatherGetBw): algbw = S / t in GB/s (1e9 bytes), t the time of one
# operation averaged over the ranks; busbw = algbw * 2(n-1)/n for all-reduce and algbw * (n-1)/n for all-gather,
# where S is the whole output: n times what each rank sends (sendcount * sizeof(datatype) * n). On one rank both
# factors are 0: the operation crosses no link, and busbw says so.
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / 1e9 / seconds


def busbw_gbps(op: str, algbw: float, ranks: int) -> float:
    return algbw * BUSBW_FACTOR[op](ranks)


@dataclass
class AcceptanceConfig:
    """What :func:`run` measures; the CLI fills it from its options."""

    sizes: tuple[int, ...] = COLLECTIVE_SIZES
    max_bytes: int | None = None  # cap on a collective's size (--acceptance-max-bytes); free GPU memory caps too
    warmup: int = 5  # nccl-tests' defaults: 5 warm-up, 20 timed iterations
    iters: int = 20
    op_cap_s: float = 4.0  # fewer timed iterations (at least 3) where one operation is slow
    copy_bytes: int = 512 * MIB
    copy_warmup: int = 2
    copy_iters: int = 10
    timeout_s: float = 300.0  # for the collectives, then again for the copies (a hung rank is a fail)
    rdma: bool = False  # run the ib_write_bw commands (--acceptance-rdma), not only list them
    peer: str | None = None  # with rdma: the server side on this SSH destination instead of loopback
    rdma_bytes: int = 8 * MIB  # azurehpc-health-checks' ib_write_bw message size
    rdma_tcp_port: int = 18510  # ib_write_bw's out-of-band port of the first rail (+1 per rail)
    rdma_timeout_s: float = 120.0
    dcgm_level: int = 1  # dcgmi diag -r LEVEL where DCGM is installed (pdinfra.transfer.acceptance.dcgm); 0 skips it


# --------------------------------------------------------------------------------------------------
# Which figures: the SKU of this host
# --------------------------------------------------------------------------------------------------


def gpu_names(facts: dict[str, Any]) -> list[str]:
    return [str(d.get("name") or "") for d in (facts.get("gpus") or {}).get("devices") or []]


def thresholds_for(facts: dict[str, Any], hardware: str | None = None) -> tuple[Acceptance | None, str]:
    """(the figures, where they come from): the declared hardware profile's, else the SKU the GPUs' names match."""
    names = gpu_names(facts)
    shown = f"{len(names)} x {names[0]!r}" if names and len(set(names)) == 1 else f"GPUs {names}"
    prof = PROFILES.get(hardware or "")
    if prof is not None and prof.acceptance is not None:
        acc = prof.acceptance
        if names and acceptance_for_gpus(names) is not acc:
            return acc, f"{hardware} (declared; but the host has {shown})"
        return acc, f"{hardware}"
    acc = acceptance_for_gpus(names)
    why = f"; profile {hardware} has none" if hardware else ""
    if acc is not None:
        return acc, f"{acc.sku}, by the GPUs' name{why}"
    return None, f"no acceptance figures for {shown}{why}"


# --------------------------------------------------------------------------------------------------
# Verdicts: the report -> CheckResults
# --------------------------------------------------------------------------------------------------

REMEDY_NCCL = (
    "Check `nvidia-smi topo -m` (NV18 between every pair), the fabric manager (`systemctl status "
    "nvidia-fabricmanager`, gpu.fabric), NVLink errors (gpu.nvlink_errors) and clocks (gpu.clocks); other load on "
    "the GPUs (`nvidia-smi`); re-run with NCCL_DEBUG=INFO to see the algorithm NCCL picked (NVLS on NVSwitch)."
)
REMEDY_PCIE = (
    "Check the GPU's PCIe link (gpu.pcie: Gen5 x16 under load), the IOMMU mode (iommu=pt, os.iommu), other traffic "
    "on the GPU's PCIe switch, and that the host memory is on the GPU's NUMA node."
)
REMEDY_P2P = (
    "Check `nvidia-smi topo -p2p r` (OK between every pair), NVLink state and errors (gpu.nvlink, gpu.nvlink_errors), "
    "the fabric manager (gpu.fabric) and ACS on the PCIe switches (peer traffic must not detour through the root "
    "complex)."
)
REMEDY_RDMA = (
    "Check the rail's link (rdma.ports, rdma.speed), its PCIe link (rdma.pcie), the GPU-NIC path (`nvidia-smi topo "
    "-m`: PIX/PXB, not SYS; ACS off on the switch between them), dma-buf or nvidia_peermem (gpu.dmabuf), the MTU "
    "(rdma.mtu) and the QoS (rdma.qos)."
)
NO_FIGURE = "declare the hardware profile (pdinfra_hardware, e.g. hgx-h200-8gpu) if the host is one of pdinfra's"


def _check(cid: str, title: str, verdict: str, evidence: str, remedy: str, host: str) -> CheckResult:
    return CheckResult(cid, title, verdict, evidence, remedy if verdict in (FAIL, WARN) else "", LAYER, host)


def _figure(acc: Acceptance | None, name: str) -> float | None:
    return getattr(acc, name) if acc is not None else None


def collective_rows(entry: dict[str, Any], op: str, ranks: int) -> list[dict[str, Any]]:
    """Each measured size: bytes, iterations, seconds (the ranks' mean, as nccl-tests), algbw, busbw."""
    out = []
    for row in entry.get("rows") or []:
        secs = statistics.fmean(row["rank_seconds"]) if row.get("rank_seconds") else row.get("seconds")
        if not secs:
            continue
        alg = algbw_gbps(row["bytes"], secs)
        out.append(
            {
                "bytes": row["bytes"],
                "iters": row.get("iters"),
                "seconds": secs,
                "algbw": alg,
                "busbw": busbw_gbps(op, alg, ranks),
            }
        )
    return sorted(out, key=lambda r: r["bytes"])


def _collective_check(
    op: str, entry: dict[str, Any], n: int, meas: dict[str, Any], acc: Acceptance | None, source: str, host: str
) -> CheckResult:
    cid, title = f"accept.nccl.{op}", f"NCCL {OP_NAME[op]} bus bandwidth over the host's GPUs (nccl-tests' busbw)"

    def res(verdict: str, evidence: str, remedy: str = "") -> CheckResult:
        return _check(cid, title, verdict, evidence, remedy, host)

    if entry.get("error"):
        return res(FAIL, f"NCCL {OP_NAME[op]} did not run: {entry['error']}", REMEDY_NCCL)
    rows = collective_rows(entry, op, n)
    skipped = "; ".join(f"{fmt_bytes(s['bytes'])}: {s['why']}" for s in entry.get("skipped") or [])
    if not rows:
        return res(
            WARN,
            f"no size measured ({skipped or 'nothing planned'})",
            "free GPU memory (stop the serving instances: pdinfra down) or lower --acceptance-max-bytes",
        )
    if entry.get("validated") is False:
        return res(
            FAIL,
            f"NCCL {OP_NAME[op]} returned wrong values on {n} GPUs (checked at {fmt_bytes(rows[0]['bytes'])})",
            "check GPU ECC and Xid errors (gpu.ecc, gpu.xid), then NVLink",
        )
    top = rows[-1]
    nccl = f"NCCL {meas.get('nccl') or '?'} (torch {meas.get('torch') or '?'})"
    if n == 1:
        return res(
            NA,
            (
                f"{nccl} initialised and ran {OP_NAME[op]} on 1 rank (GPU 0, {fmt_bytes(top['bytes'])}, {top['iters']} "
                f"timed iterations, {top['algbw']:.0f} GB/s algbw with nothing leaving the GPU, results checked): "
                "torch, NCCL, the driver and the GPU work together; busbw is 0 by nccl-tests' formula (factor "
                f"{'2(n-1)/n' if op == 'all_reduce' else '(n-1)/n'} = 0 for n = 1): no link was crossed, so this says "
                "nothing about NVLink or the NVSwitch fabric"
            ),
        )
    ladder = ", ".join(f"{fmt_bytes(r['bytes'])} {r['busbw']:.0f}" for r in rows)
    evidence = (
        f"busbw GB/s by size on {n} GPUs: {ladder}; at {fmt_bytes(top['bytes'])} {top['algbw']:.1f} GB/s "
        f"algbw, {top['busbw']:.1f} GB/s busbw ({top['iters']} iterations; {nccl})"
    )
    if skipped:
        evidence += f"; not run: {skipped}"
    fig = _figure(acc, f"{op}_busbw_gbps")
    if acc is None:
        return res(WARN, f"{evidence}; not judged: {source}", NO_FIGURE)
    if fig is None:
        return res(WARN, f"{evidence}; not judged: {acc.sku} has no sourced {OP_NAME[op]} figure", "")
    if n != acc.collective_gpus:
        return res(
            WARN,
            f"{evidence}; not judged: the {fig:.0f} GB/s figure of {source} is for "
            f"{acc.collective_gpus} GPUs, this host has {n}",
            "",
        )
    at = next((r for r in rows if r["bytes"] == acc.collective_bytes), None)
    if at is None:
        return res(
            WARN,
            f"{evidence}; not judged: the {fig:.0f} GB/s figure is for {fmt_bytes(acc.collective_bytes)}"
            ", which did not run",
            "free GPU memory or raise --acceptance-max-bytes to 16GiB",
        )
    verdict = PASS if at["busbw"] >= fig else FAIL
    rel = ">=" if verdict == PASS else "<"
    return res(
        verdict,
        f"{evidence}; {at['busbw']:.1f} {rel} {fig:.0f} GB/s at {fmt_bytes(at['bytes'])} ({source})",
        REMEDY_NCCL,
    )


def _copy_checks(meas: dict[str, Any], n: int, acc: Acceptance | None, source: str, host: str) -> list[CheckResult]:
    copies = meas.get("copies") or {}
    out: list[CheckResult] = []
    title_h = "Host<->GPU copy bandwidth (pinned host memory, copy engine)"
    title_p = "GPU->GPU peer copy bandwidth"
    if copies.get("error"):
        return [
            _check(
                "accept.copies",
                "Host<->GPU and GPU->GPU copies",
                FAIL,
                f"copies did not run: {copies['error']}",
                REMEDY_PCIE,
                host,
            )
        ]
    size = fmt_bytes(int(copies.get("bytes") or 0))
    for g in range(n):
        h2d, d2h = (copies.get("h2d") or {}).get(str(g)), (copies.get("d2h") or {}).get(str(g))
        cid = f"accept.pcie_copy gpu{g}"
        if h2d is None or d2h is None:
            out.append(_check(cid, title_h, FAIL, "not measured (no figure came back for this GPU)", REMEDY_PCIE, host))
            continue
        cpus = (copies.get("cpus") or {}).get(str(g))
        evidence = f"H2D {h2d:.1f} GB/s, D2H {d2h:.1f} GB/s ({size} pinned" + (f", on CPUs {cpus})" if cpus else ")")
        fh, fd = _figure(acc, "h2d_gbps"), _figure(acc, "d2h_gbps")
        if fh is None or fd is None:
            why = source if acc is None else f"{acc.sku} has no host<->GPU figure"
            out.append(
                _check(cid, title_h, WARN, f"{evidence}; not judged: {why}", NO_FIGURE if acc is None else "", host)
            )
            continue
        low = [f"{k} {v:.1f} < {f:.0f}" for k, v, f in (("H2D", h2d, fh), ("D2H", d2h, fd)) if v < f]
        verdict = FAIL if low else PASS
        tail = ("; " + ", ".join(low) + " GB/s") if low else f"; both >= {min(fh, fd):.0f} GB/s"
        out.append(_check(cid, title_h, verdict, f"{evidence}{tail} ({source})", REMEDY_PCIE, host))
    if n < 2:
        out.append(
            _check("accept.p2p", title_p, NA, "one GPU: no pair to copy between (NVLink is not exercised)", "", host)
        )
        return out
    p2p = copies.get("p2p") or {}
    access = copies.get("peer_access") or {}
    fig = _figure(acc, "p2p_gbps")
    for src in range(n):
        figs = {dst: p2p.get(f"{src}->{dst}") for dst in range(n) if dst != src}
        cid = f"accept.p2p gpu{src}"
        missing = [d for d, v in figs.items() if v is None]
        if missing:
            out.append(
                _check(cid, title_p, FAIL, f"not measured to GPU {', '.join(map(str, missing))}", REMEDY_P2P, host)
            )
            continue
        worst = min(figs, key=lambda d: figs[d])
        listing = ", ".join(f"->{d} {v:.0f}" for d, v in figs.items())
        no_peer = [str(d) for d in figs if access.get(f"{src}->{d}") is False]
        evidence = f"{listing} GB/s ({size} copy_, the source's copy engine); min {figs[worst]:.1f} (->{worst})" + (
            f"; no peer access to GPU {', '.join(no_peer)} (staged through the host)" if no_peer else ""
        )
        if fig is None:
            why = source if acc is None else f"{acc.sku} has no peer-copy figure"
            out.append(
                _check(cid, title_p, WARN, f"{evidence}; not judged: {why}", NO_FIGURE if acc is None else "", host)
            )
            continue
        low = [f"->{d} {v:.0f}" for d, v in figs.items() if v < fig]
        verdict = FAIL if low else PASS
        tail = f"; below {fig:.0f} GB/s: {', '.join(low)}" if low else f"; all >= {fig:.0f} GB/s"
        out.append(_check(cid, title_p, verdict, f"{evidence}{tail} ({source})", REMEDY_P2P, host))
    return out


def _rdma_checks(rdma: dict[str, Any], acc: Acceptance | None, source: str, host: str) -> list[CheckResult]:
    title = "GPUDirect RDMA write bandwidth per rail (ib_write_bw, CUDA buffers)"
    rails = rdma.get("rails") or []
    if not rails:
        return [_check("accept.rdma", title, NA, rdma.get("reason") or "no rail", "", host)]
    out = []
    fig = _figure(acc, "rdma_gbits")
    for r in rails:
        plan = RailPlan(**r["rail"])
        cid = f"accept.rdma {plan.rdma_dev}"
        where = f"{plan.rdma_dev}:{plan.port} with GPU {plan.gpu} ({plan.how})"
        cmd = f"server: {shown(r['server'])}; client: {shown(r['client'])}"
        if rdma.get("reason"):  # planned only: not asked, or perftest cannot run
            verdict = WARN if rdma.get("verdict") == WARN else NA
            out.append(_check(cid, title, verdict, f"{where}: {rdma['reason']}; {cmd}", rdma.get("remedy", ""), host))
            continue
        result = r.get("result")
        if not result:
            tail = (r.get("output") or "").strip().splitlines()[-3:]
            out.append(
                _check(
                    cid,
                    title,
                    FAIL,
                    f"{where}: no ib_write_bw report ({r.get('error') or 'rc '}"
                    f"{r.get('rc')}): {' | '.join(tail)}; {cmd}",
                    REMEDY_RDMA,
                    host,
                )
            )
            continue
        got = result["gbits"]
        evidence = (
            f"{where}, {'peer ' + str(rdma.get('peer')) if rdma.get('peer') else 'loopback'}: {got:.1f} Gb/s "
            f"average at {fmt_bytes(result['bytes'])} ({result['iterations']} iterations"
            + (f", MTU {result['mtu']}" if result.get("mtu") else "")
            + ")"
        )
        rail_gbits = plan.rate_gbits
        if fig is None:
            why = source if acc is None else f"{acc.sku} has no rail figure"
            out.append(
                _check(cid, title, WARN, f"{evidence}; not judged: {why}", NO_FIGURE if acc is None else "", host)
            )
        elif rail_gbits is not None and rail_gbits != acc.rdma_rail_gbits:
            out.append(
                _check(
                    cid,
                    title,
                    WARN,
                    f"{evidence}; not judged: the {fig:.0f} Gb/s figure is for a "
                    f"{acc.rdma_rail_gbits}G rail, this port runs at {rail_gbits:.0f} Gb/s",
                    "check the port's speed (rdma.speed) if it should be 400G",
                    host,
                )
            )
        else:
            verdict = PASS if got >= fig else FAIL
            rel = ">=" if verdict == PASS else "<"
            out.append(_check(cid, title, verdict, f"{evidence}; {rel} {fig:.0f} Gb/s ({source})", REMEDY_RDMA, host))
    return out


def to_checks(report: dict[str, Any]) -> list[CheckResult]:
    """The report (as :func:`run` writes it, or read back from --acceptance-output) judged row by row."""
    host = str(report.get("host") or "")
    acc = (
        Acceptance(
            **{
                **report["thresholds"],
                "gpu_names": tuple(report["thresholds"]["gpu_names"]),
                "sources": tuple(tuple(s) for s in report["thresholds"]["sources"]),
            }
        )
        if report.get("thresholds")
        else None
    )
    source = str(report.get("threshold_source") or "")
    n = int(report.get("gpus") or 0)
    if n == 0:
        why = str(report.get("gpus_reason") or "NVML reports none")
        if "not installed" in why:  # the GPUs may be there: this Python cannot see them, which is not "none"
            return [
                _check(
                    "accept.gpus",
                    "Bandwidth acceptance",
                    WARN,
                    f"cannot see the GPUs: {why}",
                    "pip install nvidia-ml-py, or run it with the serving venv's Python",
                    host,
                )
            ]
        return [_check("accept.gpus", "Bandwidth acceptance", NA, f"no GPUs: nothing to accept ({why})", "", host)]
    meas = report.get("measurement") or {}
    out: list[CheckResult] = []
    if meas.get("error"):
        remedy = (
            (
                "run it with the serving venv's Python, which has torch (e.g. /opt/pdinfra/venv/bin/python -m "
                "pdinfra validate --acceptance)"
            )
            if meas.get("missing") == "torch"
            else REMEDY_NCCL
        )
        out.append(
            _check(
                "accept.nccl",
                "NCCL collectives and CUDA copies",
                FAIL,
                f"could not measure: {meas['error']}",
                remedy,
                host,
            )
        )
    else:
        for op in OPS:
            entry = (meas.get("collectives") or {}).get(op)
            if entry is not None:
                out.append(_collective_check(op, entry, n, meas, acc, source, host))
        out += _copy_checks(meas, n, acc, source, host)
    out += _rdma_checks(report.get("rdma") or {}, acc, source, host)
    if report.get("dcgm"):
        diag = dcgm.to_check(report["dcgm"], host)
        out += [diag] if diag else []
    return out


# --------------------------------------------------------------------------------------------------
# Running it
# --------------------------------------------------------------------------------------------------


def _gpu_cpus(facts: dict[str, Any]) -> dict[int, list[int]]:
    """Each GPU's local CPUs (sysfs local_cpulist of its PCI function): where its pinned host buffer is allocated."""
    out = {}
    for d in (facts.get("gpus") or {}).get("devices") or []:
        text = None
        try:
            text = Path(f"/sys/bus/pci/devices/{d.get('bus_id')}/local_cpulist").read_text().strip()
        except OSError:
            continue
        cpus: list[int] = []
        for part in text.split(","):
            a, _, b = part.partition("-")
            if a.isdigit():
                cpus += list(range(int(a), int(b or a) + 1))
        if cpus:
            out[int(d.get("index", 0))] = cpus
    return out


def measurement_plan(facts: dict[str, Any], cfg: AcceptanceConfig) -> dict[str, Any]:
    n = int((facts.get("gpus") or {}).get("count") or 0)
    sizes = list(cfg.sizes)
    if n == 1:  # one rank crosses no link: one size shows that NCCL runs, more would show nothing more
        sizes = sizes[:1]
    return {
        "gpus": n,
        "ops": list(OPS),
        "sizes": sizes,
        "max_bytes": cfg.max_bytes,
        "warmup": cfg.warmup,
        "iters": cfg.iters,
        "op_cap_s": cfg.op_cap_s,
        "copy_bytes": cfg.copy_bytes,
        "copy_warmup": cfg.copy_warmup,
        "copy_iters": cfg.copy_iters,
        "timeout_s": cfg.timeout_s,
        "cpus": {str(k): v for k, v in _gpu_cpus(facts).items()},
    }


def _which(name: str) -> str | None:
    return shutil.which(name)


def rdma_section(
    facts: dict[str, Any],
    cfg: AcceptanceConfig,
    rdma_exec: Callable[..., dict[str, Any]] | None = None,
    which: Callable[[str], str | None] | None = None,
    probe: Callable[[list[str]], str] | None = None,
    pcie_path: Callable[[str], list[str]] | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """The rails' plan and, with ``cfg.rdma``, their ib_write_bw results (``rdma_exec``, ``which`` and ``probe``
    default to running perftest, looking programs up on PATH and reading a program's --help)."""
    which, probe = which or _which, probe or rail_probe
    rails, why = plan_rails(facts, pcie_path)
    section: dict[str, Any] = {"peer": cfg.peer, "rails": []}
    if not rails:
        section["reason"] = why
        return section
    present, path_or_why, cuda = perftest_status(which, probe)
    numactl = bool(which("numactl"))
    for i, rail in enumerate(rails):
        server, client = rail_commands(rail, i, cfg, numactl)
        section["rails"].append({"rail": dataclasses.asdict(rail), "server": server, "client": client})
    if not present:
        section["reason"] = f"{path_or_why}: apt-get install perftest (a build with CUDA for --use_cuda)"
        return section
    if not cuda:
        section["reason"] = f"{path_or_why} has no --use_cuda (perftest built without CUDA): GPUDirect not measured"
        section["verdict"] = WARN
        section["remedy"] = "build perftest with CUDA (./configure finds cuda.h since 25.07; CUDA_H_PATH before)"
        return section
    if not cfg.rdma:
        section["reason"] = "not run (give --acceptance-rdma to run it)"
        return section
    run_pair = rdma_exec or run_ib_pair
    for r in section["rails"]:
        if progress:
            progress(
                f"ib_write_bw {r['rail']['rdma_dev']} with GPU {r['rail']['gpu']}"
                + (f" against {cfg.peer}" if cfg.peer else " (loopback)")
            )
        got = run_pair(r["server"], r["client"], cfg.rdma_timeout_s)
        r["rc"] = got.get("client_rc")
        r["output"] = got.get("client", "")
        r["server_output"] = got.get("server", "")
        r["result"] = parse_ib_write_bw(got.get("client", "")) or parse_ib_write_bw(got.get("server", ""))
    return section


def run(
    facts: dict[str, Any],
    cfg: AcceptanceConfig | None = None,
    *,
    hardware: str | None = None,
    measure: Callable[..., dict[str, Any]] | None = None,
    rdma_exec: Callable[..., dict[str, Any]] | None = None,
    dcgm_exec: Callable[[list[str], float], tuple[int, str]] | None = None,
    which: Callable[[str], str | None] | None = None,
    probe: Callable[[list[str]], str] | None = None,
    pcie_path: Callable[[str], list[str]] | None = sysfs_pcie_path,
    progress: Any = None,
) -> tuple[list[CheckResult], dict[str, Any]]:
    """Measure this host and judge it: (check results, the JSON-ready report)."""
    cfg = cfg or AcceptanceConfig()
    gpus = facts.get("gpus") or {}
    n = int(gpus.get("count") or 0) if gpus.get("present") else 0
    acc, source = thresholds_for(facts, hardware)
    report: dict[str, Any] = {
        "pdinfra_acceptance": 1,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": str(facts.get("hostname") or ""),
        "gpus": n,
        "gpus_reason": gpus.get("reason"),
        "gpu_names": gpu_names(facts),
        "driver_version": gpus.get("driver_version"),
        "hardware": hardware,
        "thresholds": dataclasses.asdict(acc) if acc else None,
        "threshold_source": source,
        "config": dataclasses.asdict(cfg),
    }
    if n:
        if progress:
            progress(f"acceptance figures: {source}")
        plan = measurement_plan({**facts, "gpus": {**gpus, "count": n}}, cfg)
        if measure is None:
            from pdinfra.transfer.acceptance.worker import measure_local as measure
        report["measurement"] = measure(plan, progress)
        report["rdma"] = rdma_section(facts, cfg, rdma_exec, which, probe, pcie_path, progress)
        if progress and cfg.dcgm_level > 0:
            progress(f"DCGM diagnostic: {' '.join(dcgm.diag_argv(cfg.dcgm_level))} where dcgmi is installed")
        report["dcgm"] = dcgm.section(cfg.dcgm_level, which or _which, dcgm_exec)
    return to_checks(report), report


def any_fail(results: list[CheckResult]) -> bool:
    return any(r.verdict == FAIL for r in results)


# --------------------------------------------------------------------------------------------------
# python -m pdinfra.transfer.acceptance: without typer and rich
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Measure this host and print ``{"checks": [...], "report": {...}}`` as JSON; exit 1 on a fail."""
    import argparse
    import json
    import sys

    from pdinfra.cluster.model import NODE_FILE
    from pdinfra.host.facts import gather
    from pdinfra.transfer.fmt import parse_size

    ap = argparse.ArgumentParser(prog="python -m pdinfra.transfer.acceptance", description=main.__doc__)
    ap.add_argument("--max-bytes", help="cap on a collective's size, e.g. 4GiB (default: 16GiB, or free memory)")
    ap.add_argument("--rdma", action="store_true", help="run the per-rail ib_write_bw commands (else only listed)")
    ap.add_argument("--peer", help="with --rdma: run each rail's server on this SSH destination, not in loopback")
    ap.add_argument(
        "--hardware",
        help="hardware profile whose figures apply (default: the node's cluster.json, "
        "else the SKU the GPU names match)",
    )
    ap.add_argument("--cluster", default=NODE_FILE, help="the node's cluster model (for its hardware profile)")
    ap.add_argument("--output", "-o", help="also write the report (JSON) to this file")
    ap.add_argument(
        "--dcgm-level",
        type=int,
        default=1,
        choices=range(5),
        help="dcgmi diag -r LEVEL where DCGM is installed (default 1; 0 skips it)",
    )
    args = ap.parse_args(argv)
    try:
        max_bytes = parse_size(args.max_bytes) if args.max_bytes else None
    except ValueError as exc:
        ap.error(str(exc))
    hardware = args.hardware or hardware_from_cluster(args.cluster)
    facts = gather("/")
    cfg = AcceptanceConfig(max_bytes=max_bytes, rdma=args.rdma, peer=args.peer, dcgm_level=args.dcgm_level)
    results, report = run(facts, cfg, hardware=hardware, progress=lambda m: print(f"» {m}", file=sys.stderr))
    text = json.dumps({"checks": [r.to_dict() for r in results], "report": report}, indent=1, default=str)
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(text)
    return 1 if any_fail(results) else 0


def hardware_from_cluster(path: str | Path) -> str | None:
    """The node's hardware profile from its cluster.json (None on a host pdinfra did not deploy)."""
    from pdinfra.cluster.model import Cluster

    if not Path(path).exists():
        return None
    try:
        cluster, node = Cluster.load(path)
        return cluster.host(node).hardware if node else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
