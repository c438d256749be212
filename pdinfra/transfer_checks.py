"""`pdinfra validate --transfer`: NIXL transfers measured live, judged against the host's link limits.

The link limits come from the same facts the other checks read (pdinfra.linklimits); the measurement is
pdinfra.transfer's two-process benchmark with a compact plan (one run well under a minute on a 2-GPU host).
Each measured case becomes a CheckResult in layer "transfer".
"""

from __future__ import annotations

from typing import Any

from pdinfra import linklimits
from pdinfra import transfer as T
from pdinfra.checks import CheckResult

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def compact_config(facts: dict[str, Any], iters: int = 10) -> T.BenchConfig:
    lim = linklimits.limits(facts)
    gpu = bool((facts.get("gpus") or {}).get("present")) and bool((facts.get("gpus") or {}).get("count"))
    return T.BenchConfig(
        ops=("READ", "WRITE"),
        sizes=(64 * KIB, 16 * MIB, 1 * GIB) if gpu else (64 * KIB, 16 * MIB),
        batches=((1024, 256 * KIB),) if gpu else ((256, 16 * KIB),),
        layouts=("contig",),
        model_shape="gpt-oss-120b" if gpu else "tiny",
        prompt_tokens=8192 if gpu else 1024,
        block_sizes=(16,) if gpu else (32,),
        link_gbps=lim["gpu-gpu"],
        pcie_gbps=lim["host-gpu"],
        iters=iters,
        case_cap_s=5.0,
    )


def _pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "n/a"


def to_checks(report: dict[str, Any], host: str = "") -> list[CheckResult]:
    out = []
    for raw in report.get("results", []):
        r = T.CaseResult.from_dict(raw)
        if r.gbps is None:
            evidence = r.error or r.reason or "no measurement"
        else:
            link = f"{_pct(r.eff_link)} of the {r.link_gbps:.0f} GB/s link" if r.link_gbps else "no link limit known"
            copy = f"{_pct(r.eff_copy)} of a raw copy ({r.copy_gbps:.0f} GB/s)" if r.copy_gbps else "no raw copy"
            lat = f"{r.latency_s * 1e6:.0f} us" if r.latency_s is not None else "n/a"
            evidence = (
                f"{r.gbps:.1f} GB/s, {lat} per request, {r.descs} desc, over {r.transport or 'unknown transport'}; "
                f"{link}, {copy}" + (f"; {r.reason}" if r.reason else "")
            )
        out.append(
            CheckResult(
                id=f"transfer.{r.pair} {r.case}",
                title=f"NIXL {r.op} {r.initiator}<-{r.target}"
                if r.op == "READ"
                else f"NIXL {r.op} {r.initiator}->{r.target}",
                verdict=r.verdict or "warn",
                evidence=evidence,
                remedy=r.remedy,
                layer="transfer",
                host=host,
            )
        )
    return out


def run(facts: dict[str, Any], iters: int = 10, progress=None) -> tuple[list[CheckResult], dict[str, Any]]:
    report = T.run_benchmark(compact_config(facts, iters), progress=progress)
    return to_checks(report, str(facts.get("hostname") or facts.get("host") or "")), report
