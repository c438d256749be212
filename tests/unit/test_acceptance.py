"""Bandwidth acceptance (`pdinfra validate --acceptance`, pdinfra.transfer.acceptance) without a GPU: nccl-tests'
bus bandwidth formulas, the per-SKU verdicts (the one-GPU n/a among them), the perftest parser and rail plan, the
measurement's plumbing with a stand-in torch, and the CLI options with the measurement monkeypatched."""

from __future__ import annotations

import copy
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdinfra.cli.host import validate_cmd
from pdinfra.cluster import profiles
from pdinfra.host.facts import gather
from pdinfra.transfer import acceptance as A
from pdinfra.transfer import validation
from pdinfra.transfer.acceptance import worker as accept_worker

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ROOT / "tests" / "fixtures" / "hosts"
H100_TREE = HOSTS / "hgx-h100-8gpu-8roce"  # synthesised HGX H100: 8 GPUs, 8 RoCE rails, the ucx role's env files
# The one-GPU H200 VM's facts, recorded live on it (docs/runs/2026-12-03-h200-health/README.md)
H200X1_FACTS = ROOT / "docs" / "runs" / "2026-12-03-h200-health" / "facts.json"
GIB, MIB = 1024**3, 1024**2


# --------------------------------------------------------------------------------------------------
# nccl-tests' formulas
# --------------------------------------------------------------------------------------------------


def test_busbw_factors_are_nccl_tests_documented_ones() -> None:
    # NVIDIA/nccl-tests doc/PERFORMANCE.md, "Summary": AllReduce 2*(n-1)/n, AllGather (n-1)/n
    for n in range(1, 9):
        assert A.busbw_gbps("all_reduce", 100.0, n) == pytest.approx(100.0 * 2 * (n - 1) / n)
        assert A.busbw_gbps("all_gather", 100.0, n) == pytest.approx(100.0 * (n - 1) / n)
    assert A.busbw_gbps("all_reduce", 5000.0, 1) == 0 and A.busbw_gbps("all_gather", 5000.0, 1) == 0


def test_busbw_reproduces_recorded_nccl_tests_output() -> None:
    # An all_reduce_perf row as nccl-tests printed it (quoted in kvcache-ai/Mooncake#3484): size 16777216 B,
    # 121.33 us, algbw 138.28 GB/s, busbw 242.00 GB/s; busbw/algbw = 1.75 = 2*7/8, 8 ranks. nccl-tests computes
    # algbw = bytes / 1e9 / seconds (src/all_reduce.cu AllReduceGetBw).
    alg = A.algbw_gbps(16777216, 121.33e-6)
    assert alg == pytest.approx(138.28, abs=0.01)
    assert A.busbw_gbps("all_reduce", alg, 8) == pytest.approx(242.00, abs=0.05)
    # nccl-tests' maintainer on 8 H100 (NVIDIA/nccl-tests#212): "peak busBw of ~480GB/s (algbw ~275GB/s)"
    assert A.busbw_gbps("all_reduce", 275.0, 8) == pytest.approx(481.25)


def test_all_gather_size_is_the_whole_output() -> None:
    # nccl-tests' AllGatherGetBw: baseBw = count * typesize * nranks / 1e9 / sec (count per rank): S is the output
    entry = {"rows": [{"bytes": 16 * GIB, "iters": 20, "rank_seconds": [0.05] * 8}]}
    (row,) = A.collective_rows(entry, "all_gather", 8)
    assert row["algbw"] == pytest.approx(16 * GIB / 1e9 / 0.05)
    assert row["busbw"] == pytest.approx(row["algbw"] * 7 / 8)
    # the worker sizes all-gather outputs to split evenly into n float32 inputs, and asks for S + S/n per GPU
    assert accept_worker._round_size("all_gather", 16 * GIB, 8) == 16 * GIB
    assert accept_worker._round_size("all_gather", 64 * MIB, 3) % (4 * 3) == 0
    assert accept_worker._bytes_needed("all_gather", 16 * GIB, 8) == 18 * GIB
    assert accept_worker._bytes_needed("all_reduce", 16 * GIB, 8) == 16 * GIB


def test_time_is_the_mean_over_ranks_as_nccl_tests() -> None:
    (row,) = A.collective_rows({"rows": [{"bytes": GIB, "iters": 5, "rank_seconds": [0.01, 0.03]}]}, "all_reduce", 2)
    assert row["seconds"] == pytest.approx(0.02) and row["busbw"] == pytest.approx(GIB / 1e9 / 0.02)


# --------------------------------------------------------------------------------------------------
# Verdicts per SKU
# --------------------------------------------------------------------------------------------------


def _facts(name: str, n: int, hostname: str = "node") -> dict:
    return {
        "hostname": hostname,
        "gpus": {"present": True, "count": n, "devices": [{"index": i, "name": name} for i in range(n)]},
        "rdma": {"present": False, "devices": []},
    }


def _measurement(
    n: int,
    all_reduce_busbw: float,
    all_gather_busbw: float = 360.0,
    h2d: float = 55.2,
    d2h: float = 55.1,
    p2p: float = 392.0,
    sizes: tuple[int, ...] = A.COLLECTIVE_SIZES,
) -> dict:
    """What measure_local returns, with the times that give these bus bandwidths (one rank: a local copy)."""

    def entry(op: str, busbw: float) -> dict:
        factor = A.BUSBW_FACTOR[op](n) or 1.0
        rows = [{"bytes": s, "iters": 20, "rank_seconds": [s / 1e9 / (busbw / factor)] * n} for s in sizes]
        return {"rows": rows, "skipped": [], "validated": True, "error": ""}

    return {
        "gpus": n,
        "torch": "2.9.0",
        "nccl": "2.27.3",
        "error": "",
        "collectives": {
            "all_reduce": entry("all_reduce", all_reduce_busbw),
            "all_gather": entry("all_gather", all_gather_busbw),
        },
        "copies": {
            "bytes": 512 * MIB,
            "error": "",
            "h2d": {str(g): h2d for g in range(n)},
            "d2h": {str(g): d2h for g in range(n)},
            "cpus": {},
            "p2p": {f"{a}->{b}": p2p for a in range(n) for b in range(n) if a != b},
            "peer_access": {},
        },
    }


def _judge(facts: dict, meas: dict, hardware: str | None = None) -> dict[str, A.CheckResult]:
    res, _ = A.run(
        facts,
        A.AcceptanceConfig(),
        hardware=hardware,
        measure=lambda plan, progress=None: meas,
        which=lambda name: None,
    )
    return {r.id: r for r in res}


@pytest.mark.parametrize(
    ("hardware", "name", "busbw", "verdict"),
    [
        ("hgx-h200-8gpu", "NVIDIA H200", 440.0, "pass"),
        ("hgx-h200-8gpu", "NVIDIA H200", 431.0, "pass"),  # at the figure
        ("hgx-h200-8gpu", "NVIDIA H200", 420.0, "fail"),  # below azurehpc's 431
        ("hgx-h100-8gpu", "NVIDIA H100 80GB HBM3", 450.0, "fail"),  # below azurehpc's 460 for H100
        ("hgx-h100-8gpu", "NVIDIA H100 80GB HBM3", 481.0, "pass"),
        (None, "NVIDIA H200", 440.0, "pass"),  # no profile declared: the SKU by the GPUs' name
    ],
)
def test_all_reduce_verdict_per_sku(hardware, name, busbw, verdict) -> None:
    got = _judge(_facts(name, 8), _measurement(8, busbw), hardware)
    r = got["accept.nccl.all_reduce"]
    assert r.verdict == verdict, r.evidence
    assert "16GiB" in r.evidence
    assert (r.remedy != "") == (verdict == "fail")
    # no sourced all-gather figure for either SKU: reported, not judged, never pass
    assert got["accept.nccl.all_gather"].verdict == "warn" and "no sourced all-gather figure" in (
        got["accept.nccl.all_gather"].evidence
    )


def test_copies_and_peer_copies_against_the_per_gpu_figures() -> None:
    good = _judge(_facts("NVIDIA H200", 8), _measurement(8, 440.0), "hgx-h200-8gpu")
    assert {good[f"accept.pcie_copy gpu{g}"].verdict for g in range(8)} == {"pass"}
    assert {good[f"accept.p2p gpu{g}"].verdict for g in range(8)} == {"pass"}
    meas = _measurement(8, 440.0)
    meas["copies"]["d2h"]["5"] = 31.0  # a GPU on a Gen4 link
    meas["copies"]["p2p"]["2->6"] = 120.0  # a pair without NVLink (staged through the host)
    meas["copies"]["peer_access"]["2->6"] = False
    bad = _judge(_facts("NVIDIA H200", 8), meas, "hgx-h200-8gpu")
    assert bad["accept.pcie_copy gpu5"].verdict == "fail" and "D2H 31.0 < 48" in bad["accept.pcie_copy gpu5"].evidence
    assert bad["accept.pcie_copy gpu4"].verdict == "pass"
    p2p = bad["accept.p2p gpu2"]
    assert p2p.verdict == "fail" and "->6 120" in p2p.evidence and "no peer access to GPU 6" in p2p.evidence
    assert p2p.remedy and bad["accept.p2p gpu6"].verdict == "pass"


def test_one_gpu_h200_collectives_are_na_and_say_what_they_show() -> None:
    """The recorded one-GPU H200 VM: NCCL runs on one rank, busbw is 0 by formula: n/a, not pass and not fail."""
    facts = json.loads(H200X1_FACTS.read_text())
    plan = A.measurement_plan(facts, A.AcceptanceConfig())
    assert plan["gpus"] == 1 and plan["sizes"] == [64 * MIB]  # one size: more would show nothing more
    got = _judge(facts, _measurement(1, 1800.0, 1800.0, sizes=(64 * MIB,)))
    for op in ("all_reduce", "all_gather"):
        r = got[f"accept.nccl.{op}"]
        assert r.verdict == "n/a", r.evidence
        for words in ("initialised and ran", "on 1 rank", "busbw is 0", "no link was crossed", "nothing about NVLink"):
            assert words in r.evidence
    assert got["accept.p2p"].verdict == "n/a" and "one GPU" in got["accept.p2p"].evidence
    # the per-GPU figures hold on one GPU of the SKU: the host<->GPU copy is judged (55 GB/s recorded on that VM)
    assert got["accept.pcie_copy gpu0"].verdict == "pass" and "H200" in got["accept.pcie_copy gpu0"].evidence
    assert got["accept.rdma"].verdict == "n/a" and "no RDMA device" in got["accept.rdma"].evidence
    assert not A.any_fail(list(got.values()))


def test_two_gpus_collective_figure_is_for_eight() -> None:
    got = _judge(_facts("NVIDIA H200", 2), _measurement(2, 360.0), "hgx-h200-2gpu")
    r = got["accept.nccl.all_reduce"]
    assert r.verdict == "warn" and "is for 8 GPUs, this host has 2" in r.evidence
    assert got["accept.p2p gpu0"].verdict == "pass" and got["accept.p2p gpu1"].verdict == "pass"


def test_unknown_sku_is_never_pass() -> None:
    got = _judge(_facts("NVIDIA A100-SXM4-80GB", 8), _measurement(8, 230.0))
    assert {r.verdict for r in got.values()} <= {"warn", "n/a"}
    assert "no acceptance figures" in got["accept.nccl.all_reduce"].evidence
    assert got["accept.nccl.all_reduce"].remedy  # says how to get figures
    # an H200 NVL (PCIe card, no NVSwitch) is not the HGX SKU
    assert profiles.acceptance_for_gpus(["NVIDIA H200 NVL"]) is None
    assert profiles.acceptance_for_gpus(["NVIDIA H200", "NVIDIA H200"]) is profiles.H200_SXM


def test_thresholds_declared_or_by_name() -> None:
    acc, src = A.thresholds_for(_facts("NVIDIA H200", 8), "hgx-h200-8gpu")
    assert acc is profiles.H200_SXM and src == "hgx-h200-8gpu"
    acc, src = A.thresholds_for(_facts("NVIDIA H200", 8), "gpu-generic")
    assert acc is profiles.H200_SXM and "by the GPUs' name; profile gpu-generic has none" in src
    acc, src = A.thresholds_for(_facts("NVIDIA H200", 8), "hgx-h100-8gpu")
    assert acc is profiles.H100_SXM and "declared; but the host has 8 x 'NVIDIA H200'" in src


def test_the_size_of_the_figure_must_have_run() -> None:
    meas = _measurement(8, 470.0, sizes=(64 * MIB, 256 * MIB, GIB, 4 * GIB))
    meas["collectives"]["all_reduce"]["skipped"] = [{"bytes": 16 * GIB, "why": "above the cap of 4.0 GiB"}]
    r = _judge(_facts("NVIDIA H200", 8), meas, "hgx-h200-8gpu")["accept.nccl.all_reduce"]
    assert r.verdict == "warn" and "figure is for 16GiB, which did not run" in r.evidence
    assert "not run: 16GiB: above the cap" in r.evidence


def test_failures_to_measure_fail() -> None:
    meas = _measurement(8, 470.0)
    meas["collectives"]["all_reduce"]["error"] = "NCCL ranks: 1 of 8 process(es) did not finish in time"
    meas["collectives"]["all_gather"]["validated"] = False
    got = _judge(_facts("NVIDIA H200", 8), meas, "hgx-h200-8gpu")
    ar, ag = got["accept.nccl.all_reduce"], got["accept.nccl.all_gather"]
    assert ar.verdict == "fail" and "did not finish" in ar.evidence and ar.remedy
    assert ag.verdict == "fail" and "wrong values" in ag.evidence
    meas = _measurement(8, 470.0)
    meas["copies"] = {"error": "copies: a process exited with code -11 before reporting"}
    assert _judge(_facts("NVIDIA H200", 8), meas)["accept.copies"].verdict == "fail"
    # no torch in this Python: the measurement cannot run, which is not a pass
    missing = {"error": "torch is not installed in this Python", "missing": "torch"}
    if _no_torch():
        assert accept_worker.measure_local({"gpus": 1}) | {"collectives": {}, "copies": {}} == missing | {
            "gpus": 1,
            "collectives": {},
            "copies": {},
        }
    got = _judge(_facts("NVIDIA H200", 1), missing)
    assert got["accept.nccl"].verdict == "fail" and "venv" in got["accept.nccl"].remedy


def _no_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is None


def test_cpu_host_has_nothing_to_accept() -> None:
    facts = {"hostname": "cpu", "gpus": {"present": False, "reason": "no NVIDIA GPU"}}
    res, report = A.run(facts, measure=lambda *a: pytest.fail("no GPU: nothing to measure"))
    assert [(r.id, r.verdict) for r in res] == [("accept.gpus", "n/a")] and "measurement" not in report
    # without nvidia-ml-py this Python cannot tell: not "no GPUs"
    facts["gpus"]["reason"] = "nvidia-ml-py (pynvml) is not installed"
    (r,) = A.run(facts)[0]
    assert r.verdict == "warn" and "cannot see the GPUs" in r.evidence and "nvidia-ml-py" in r.remedy


def test_report_round_trips() -> None:
    res, report = A.run(
        _facts("NVIDIA H200", 8), measure=lambda plan, progress=None: _measurement(8, 440.0), which=lambda name: None
    )
    again = A.to_checks(json.loads(json.dumps(report)))
    assert [r.to_dict() for r in again] == [r.to_dict() for r in res]


def test_every_figure_and_its_source_is_in_the_docs() -> None:
    text = (ROOT / "docs" / "validation.md").read_text()
    section = text[text.index("## Bandwidth acceptance") :]
    for acc in profiles.ACCEPTANCE:
        assert acc.sku in section
        for field in ("h2d_gbps", "p2p_gbps", "all_reduce_busbw_gbps", "rdma_gbits"):
            assert f"{getattr(acc, field):g}" in section, (acc.sku, field)
        for _, source in acc.sources:
            assert source.split(": ")[0].split(" ")[-1] in section  # the conf file's path
    for p in profiles.PROFILES.values():
        if p.acceptance:
            assert f"`{p.name}`" in section


# --------------------------------------------------------------------------------------------------
# perftest
# --------------------------------------------------------------------------------------------------

# ib_write_bw's client output for one rail with CUDA buffers and --report_gbits. Its parts, in perftest's own
# layout: the CUDA lines as perftest --use_cuda prints them (the GPU run posted in linux-rdma/perftest#241), the test
# header of a RoCE port with GID index 3 (as in linux-rdma/perftest#234), and the result table in the format of
# perftest's src/perftest_parameters.h (RESULT_LINE, RESULT_FMT_G, REPORT_FMT). The figures of the result row are
# ours: an 8 MiB row at the rate a healthy 400G rail gives (MsgRate = 371.62e9 / 8 / 8388608 / 1e6).
IB_WRITE_BW_CUDA_GBITS = """\
Perftest doesn't supports CUDA tests with inline messages: inline size set to 0
initializing CUDA
Listing all CUDA devices in system:
CUDA device 0: PCIe address is 18:00

Picking device No. 0
[pid = 41211, dev = 0] device name = [NVIDIA H200]
creating CUDA Ctx
making it the current CUDA Ctx
cuMemAlloc() of a 16777216 bytes GPU buffer
allocated GPU buffer address at 00007f0c60000000 pointer=0x7f0c60000000
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : ON
 TX depth        : 128
 CQ Moderation   : 1
 Mtu             : 4096[B]
 Link type       : Ethernet
 GID index       : 3
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0000 QPN 0x0108 PSN 0x63ad7d RKey 0x17eedf VAddr 0x007f0c60800000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:11
 remote address: LID 0000 QPN 0x0109 PSN 0xf3810c RKey 0x201600 VAddr 0x007f0c60000000
 GID: 00:00:00:00:00:00:00:00:00:00:255:255:198:18:00:11
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 8388608    5000             371.84             371.62 \t\t     0.005538
---------------------------------------------------------------------------------------
"""


def test_parse_ib_write_bw_gbits_with_cuda() -> None:
    got = A.parse_ib_write_bw(IB_WRITE_BW_CUDA_GBITS)
    assert got["bytes"] == 8388608 and got["iterations"] == 5000
    assert got["bw_peak"] == 371.84 and got["bw_average"] == 371.62 and got["gbits"] == 371.62
    assert got["unit"] == "Gb/sec" and got["msg_rate_mpps"] == 0.005538 and got["cuda"] is True
    assert (got["device"], got["link_type"], got["mtu"], got["gid_index"]) == ("mlx5_0", "Ethernet", 4096, 3)


def test_parse_ib_write_bw_other_units_and_rows() -> None:
    # Rows as reported in linux-rdma/perftest#65 (MB/sec: perftest's MiB, 0x100000 bytes, named MiB/sec since
    # 2024) and #273 (Gb/sec); the last row of a table is the result.
    mb = (
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
        "1024       1000             0.00               5544.28\t\t   5.677340\n"
    )
    assert A.parse_ib_write_bw(mb)["gbits"] == pytest.approx(5544.28 * 1048576 * 8 / 1e9, abs=0.01)
    mib = mb.replace("MB/sec", "MiB/sec")
    assert A.parse_ib_write_bw(mib)["gbits"] == A.parse_ib_write_bw(mb)["gbits"]
    sweep = (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 8          224958464        0.00               0.48   \t\t   7.498617\n"
        " 8388608    5000             380.10             379.95 \t\t     0.005662\n"
    )
    assert A.parse_ib_write_bw(sweep)["bytes"] == 8388608 and A.parse_ib_write_bw(sweep)["gbits"] == 379.95
    for text in ("", "Couldn't connect to 127.0.0.1:18510\n", IB_WRITE_BW_CUDA_GBITS.split(" #bytes")[0]):
        assert A.parse_ib_write_bw(text) is None


@pytest.fixture(scope="module")
def h100_facts() -> dict:
    return gather(str(H100_TREE))


def test_rail_plan_follows_the_ucx_roles_affinity(h100_facts) -> None:
    rails, why = A.plan_rails(h100_facts)
    assert not why and [(r.rdma_dev, r.gpu) for r in rails] == [(f"mlx5_{i}", i) for i in range(8)]
    r0 = rails[0]
    assert r0.how == "ucx-gpu0.env" and r0.gid_index == 3 and r0.rate_gbits == 400 and r0.numa == 0
    assert r0.dmabuf  # no nvidia_peermem, dma-buf supported: --use_cuda_dmabuf
    cfg = A.AcceptanceConfig()
    server, client = A.rail_commands(rails[5], 5, cfg)
    assert server == [
        "ib_write_bw",
        "-d",
        "mlx5_5",
        "-i",
        "1",
        "--use_cuda=5",
        "--use_cuda_dmabuf",
        "-x",
        "3",
        "-s",
        "8388608",
        "-F",
        "--report_gbits",
        "--perform_warm_up",
        "-p",
        "18515",
    ]
    assert client == [*server, "127.0.0.1"]
    peer = A.AcceptanceConfig(peer="root@node2")
    server, client = A.rail_commands(rails[0], 0, peer, numactl=True)
    assert server[:6] == ["ssh", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", "root@node2"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in server and server[-1] == "18510"
    assert client[:3] == ["numactl", "--cpunodebind=0", "--membind=0"] and client[-1] == "node2"
    assert A.shown(client).startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID numactl")


def test_rail_plan_by_pcie_distance_without_the_ucx_files(h100_facts) -> None:
    facts = copy.deepcopy(h100_facts)
    facts["ucx"]["env_files"] = {}
    facts["modules"]["loaded"]["nvidia_peermem"] = True
    # GPU i and mlx5_i under one PCIe switch (root port k), as on HGX: PXB
    gpus, nics = facts["gpus"]["devices"], facts["rdma"]["devices"]
    paths = {d["bus_id"]: ["pci0000:00", f"0000:00:0{i}.0", d["bus_id"]] for i, d in enumerate(gpus)}
    paths |= {d["pci"]: ["pci0000:00", f"0000:00:0{i}.0", d["pci"]] for i, d in enumerate(nics)}
    rails, _ = A.plan_rails(facts, lambda bdf: paths.get(bdf, []))
    assert [(r.rdma_dev, r.gpu, r.how) for r in rails][:2] == [
        ("mlx5_0", 0, "closest GPU (PXB)"),
        ("mlx5_1", 1, "closest GPU (PXB)"),
    ]
    assert not rails[0].dmabuf  # nvidia_peermem: plain --use_cuda
    rails, _ = A.plan_rails(facts, None)  # NUMA only: the four GPUs of node 0 spread over its four NICs
    assert [r.gpu for r in rails] == [0, 1, 2, 3, 4, 5, 6, 7] and rails[0].how == "closest GPU (NODE)"
    facts["expect"]["rdma"] = [{"netdev": "enp26s0np0"}]  # only declared rails are tested
    assert [r.rdma_dev for r in A.plan_rails(facts, None)[0]] == ["mlx5_0"]


def test_rdma_section_states(h100_facts) -> None:
    cfg = A.AcceptanceConfig()
    absent = A.rdma_section(h100_facts, cfg, which=lambda n: None)
    assert "perftest not installed" in absent["reason"] and len(absent["rails"]) == 8
    no_cuda = A.rdma_section(h100_facts, cfg, which=lambda n: f"/usr/bin/{n}", probe=lambda a: "Usage: -d <dev>")
    assert no_cuda["verdict"] == "warn" and "without CUDA" in no_cuda["reason"]
    planned = A.rdma_section(h100_facts, cfg, which=lambda n: f"/usr/bin/{n}", probe=lambda a: " --use_cuda=<id>")
    assert planned["reason"].startswith("not run")
    res = A._rdma_checks(planned, profiles.H100_SXM, "hgx-h100-8gpu", "h")
    assert {r.verdict for r in res} == {"n/a"} and "ib_write_bw -d mlx5_0" in res[0].evidence
    assert A._rdma_checks({"rails": [], "reason": "no RDMA device"}, None, "", "h")[0].verdict == "n/a"


def test_rdma_runs_and_is_judged_per_rail(h100_facts) -> None:
    calls = []

    def fake_pair(server, client, timeout_s):
        calls.append((server, client))
        dev = server[server.index("-d") + 1]
        if dev == "mlx5_3":
            return {"client_rc": 1, "client": "Couldn't connect to 127.0.0.1:18513\n", "server": ""}
        rate = "351.20" if dev == "mlx5_6" else "371.62"
        return {"client_rc": 0, "client": IB_WRITE_BW_CUDA_GBITS.replace("371.62", rate), "server": ""}

    cfg = A.AcceptanceConfig(rdma=True)
    section = A.rdma_section(h100_facts, cfg, fake_pair, which=lambda n: f"/usr/bin/{n}", probe=lambda a: "--use_cuda")
    assert len(calls) == 8 and calls[0][1][-1] == "127.0.0.1"
    got = {r.id: r for r in A._rdma_checks(section, profiles.H200_SXM, "hgx-h200-8gpu", "h")}
    assert got["accept.rdma mlx5_0"].verdict == "pass" and "371.6 Gb/s" in got["accept.rdma mlx5_0"].evidence
    assert got["accept.rdma mlx5_6"].verdict == "fail"  # 351.2 < 360 (H200)
    assert got["accept.rdma mlx5_3"].verdict == "fail" and "Couldn't connect" in got["accept.rdma mlx5_3"].evidence
    h100 = {r.id: r for r in A._rdma_checks(section, profiles.H100_SXM, "hgx-h100-8gpu", "h")}
    assert h100["accept.rdma mlx5_0"].verdict == "fail"  # 371.6 < 380 (H100)
    slow_port = copy.deepcopy(section)
    slow_port["rails"][0]["rail"]["rate_gbits"] = 200.0
    r = A._rdma_checks(slow_port, profiles.H200_SXM, "hgx-h200-8gpu", "h")[0]
    assert r.verdict == "warn" and "for a 400G rail" in r.evidence


# --------------------------------------------------------------------------------------------------
# The measurement's plumbing, with a stand-in torch (the real one runs on GPU hosts)
# --------------------------------------------------------------------------------------------------

FAKE_TORCH = '''
"""A stand-in for the part of torch accept_worker uses: one process per rank, no GPU, collectives faked."""
import contextlib, os, types
__version__ = "0.0-fake"
version = types.SimpleNamespace(cuda="12.8")
float32, float64, int64, uint8 = "float32", "float64", "int64", "uint8"
STATE = {"world": 1, "rank": 0, "dev": 0}

class Tensor:
    def __init__(self, n, value=0.0):
        self.n, self.v = n, [value] * min(n, 4)
    def numel(self): return self.n
    def fill_(self, x): self.v = [x] * len(self.v); return self
    def zero_(self): return self.fill_(0.0)
    def item(self): return self.v[0]
    def __eq__(self, other):
        ok = self.v == (other.v if isinstance(other, Tensor) else [other] * len(self.v))
        return types.SimpleNamespace(all=lambda: types.SimpleNamespace(item=lambda: ok))
    def copy_(self, other, non_blocking=False): self.v = list(other.v); return self
    def repeat_interleave(self, k): return Tensor(self.n * k, self.v[0])

def empty(n, dtype=None, device=None, pin_memory=False): return Tensor(int(n))
def tensor(vals, dtype=None, device=None): return Tensor(len(vals), vals[0])
def arange(n, dtype=None, device=None): return Tensor(n, "arange")
def device(kind, index=0): return types.SimpleNamespace(type=kind, index=index)

class _Event:
    def __init__(self, enable_timing=False): self.t = 0.0
    def record(self, stream=None): STATE["clock"] = STATE.get("clock", 0.0) + 1.0; self.t = STATE["clock"]
    def synchronize(self): pass
    def elapsed_time(self, other): return float(os.environ.get("FAKE_MS", "10"))

class _Nccl:
    @staticmethod
    def version(): return (2, 27, 3)

cuda = types.SimpleNamespace(
    nccl=_Nccl, set_device=lambda d: STATE.update(dev=d), get_device_name=lambda d: "Fake GPU",
    mem_get_info=lambda d: (int(os.environ.get("FAKE_FREE", str(100 * 2**30))), 141 * 2**30),
    synchronize=lambda d=None: None, current_stream=lambda d=None: None, Event=_Event,
    empty_cache=lambda: None, can_device_access_peer=lambda a, b: True, device=lambda d: contextlib.nullcontext(),
)
'''

FAKE_DIST = """
import types
import torch
ReduceOp = types.SimpleNamespace(MIN="min", MAX="max", SUM="sum")
def init_process_group(backend, init_method, rank, world_size, timeout=None):
    assert backend == "nccl" and init_method.startswith("tcp://127.0.0.1:")
    torch.STATE.update(world=world_size, rank=rank)
def all_reduce(t, op="sum"):
    if op == "sum": t.v = [x * torch.STATE["world"] for x in t.v]
def all_gather_into_tensor(out, inp): out.v = ["arange"] * len(out.v)
def barrier(device_ids=None): pass
def destroy_process_group(): pass
"""


def test_measure_local_plumbing_with_a_stand_in_torch(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "torch"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_TORCH)
    (pkg / "distributed" / "__init__.py").write_text(FAKE_DIST)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned children get the parent's sys.path
    monkeypatch.setenv("FAKE_FREE", str(4 * GIB))  # 16 GiB does not fit: skipped, not failed
    for mod in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, mod)
    plan = A.measurement_plan(_facts("NVIDIA H200", 2), A.AcceptanceConfig(copy_bytes=MIB, timeout_s=120))
    meas = accept_worker.measure_local(plan)
    assert not meas["error"] and meas["nccl"] == "2.27.3" and meas["torch"] == "0.0-fake"
    ar = meas["collectives"]["all_reduce"]
    assert not ar["error"], ar
    assert [r["bytes"] for r in ar["rows"]] == [64 * MIB, 256 * MIB, GIB]
    assert [s["bytes"] for s in ar["skipped"]] == [4 * GIB, 16 * GIB] and "free on the emptiest GPU" in (
        ar["skipped"][0]["why"]
    )
    assert ar["validated"] is True and len(ar["rows"][0]["rank_seconds"]) == 2
    assert ar["rows"][0]["rank_seconds"][0] == pytest.approx(0.01 / ar["rows"][0]["iters"])
    assert meas["collectives"]["all_gather"]["validated"] is True
    copies = meas["copies"]
    assert not copies["error"] and set(copies["h2d"]) == {"0", "1"} and set(copies["p2p"]) == {"0->1", "1->0"}
    assert copies["p2p"]["0->1"] == pytest.approx(MIB * 10 / 0.01 / 1e9)
    got = {r.id: r for r in A.to_checks({"host": "h", "gpus": 2, "measurement": meas,
                                         "thresholds": None, "threshold_source": "test", "rdma": {}})}  # fmt: skip
    assert got["accept.nccl.all_reduce"].verdict == "warn"  # measured, no figures given: not judged


# --------------------------------------------------------------------------------------------------
# The CLI
# --------------------------------------------------------------------------------------------------


@pytest.fixture()
def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("validate")(validate_cmd)
    app.command("other")(lambda: None)  # two commands: typer keeps the command name
    return app


def _invoke(app: typer.Typer, *args: str):  # noqa: ANN202
    return CliRunner().invoke(app, ["validate", *args], env={"COLUMNS": "220", "NO_COLOR": "1"})


def test_cli_acceptance_options_reach_the_measurement(cli, h100_facts, tmp_path, monkeypatch) -> None:
    seen = {}

    def fake_measure(plan, progress=None):
        seen["plan"] = plan
        return _measurement(8, 470.0)

    runs = []
    monkeypatch.setattr(validation, "gather", lambda root="/": copy.deepcopy(h100_facts))
    monkeypatch.setattr(accept_worker, "measure_local", fake_measure)
    monkeypatch.setattr(A, "_which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(A, "rail_probe", lambda argv: "--use_cuda=<gpu>")
    h100_rail = IB_WRITE_BW_CUDA_GBITS.replace("371.62", "385.40")  # H100's figure is 380 Gb/s
    monkeypatch.setattr(A, "run_ib_pair", lambda s, c, t: runs.append(c) or {"client_rc": 0, "client": h100_rail})
    out = tmp_path / "accept.json"
    res = _invoke(
        cli,
        "--acceptance-rdma",
        "--acceptance-max-bytes",
        "16GiB",
        "--acceptance-output",
        str(out),
        "--cluster",
        str(tmp_path / "none.json"),
        "--json",
    )
    assert res.exit_code == 0, res.output
    assert seen["plan"]["max_bytes"] == 16 * GIB and seen["plan"]["gpus"] == 8
    assert len(runs) == 8  # --acceptance-rdma implies --acceptance and runs every rail
    rows = [r for r in json.loads(res.stdout) if r["layer"] == "acceptance"]
    verdicts = {r["id"]: r["verdict"] for r in rows}
    assert verdicts["accept.nccl.all_reduce"] == "pass" and verdicts["accept.rdma mlx5_7"] == "pass"
    assert "H100 SXM" in next(r for r in rows if r["id"] == "accept.nccl.all_reduce")["evidence"]
    report = json.loads(out.read_text())
    assert report["pdinfra_acceptance"] == 1 and report["threshold_source"].startswith("H100 SXM")
    assert len(report["rdma"]["rails"]) == 8 and report["rdma"]["rails"][0]["result"]["gbits"] == 385.4
    # a below-figure all-reduce makes validate exit 1, as any fail does
    monkeypatch.setattr(accept_worker, "measure_local", lambda plan, progress=None: _measurement(8, 400.0))
    res = _invoke(cli, "--acceptance", "--cluster", str(tmp_path / "none.json"))
    assert res.exit_code == 1 and "accept.nccl.all_reduce" in res.output


def test_cli_acceptance_reads_the_nodes_hardware_profile(cli, h100_facts, tmp_path, monkeypatch) -> None:
    seen = {}
    monkeypatch.setattr(validation, "gather", lambda root="/": copy.deepcopy(h100_facts))
    monkeypatch.setattr(validation, "node_cluster", lambda path: (_Cluster("hgx-01", "hgx-h200-8gpu"), "hgx-01"))
    monkeypatch.setattr(A, "_which", lambda name: None)

    def fake_run(facts, cfg, hardware=None, progress=None):
        seen.update(hardware=hardware, cfg=cfg)
        return [], {}

    monkeypatch.setattr(A, "run", fake_run)
    assert _invoke(cli, "--acceptance").exit_code == 0
    assert seen["hardware"] == "hgx-h200-8gpu" and seen["cfg"].rdma is False and seen["cfg"].peer is None


class _Cluster:
    def __init__(self, node: str, hardware: str):
        self.hosts = (type("H", (), {"name": node, "hardware": hardware})(),)


def test_cli_acceptance_bad_arguments(cli, h100_facts, tmp_path, monkeypatch) -> None:
    facts = tmp_path / "f.json"
    facts.write_text(json.dumps(h100_facts))
    res = _invoke(cli, "--acceptance", "--facts", str(facts))
    assert res.exit_code == 2 and "measures this machine" in res.output
    monkeypatch.setattr(validation, "gather", lambda root="/": copy.deepcopy(h100_facts))
    monkeypatch.setattr(accept_worker, "measure_local", lambda *a: pytest.fail("must not measure"))
    for size in ("lots", "0"):
        res = _invoke(cli, "--acceptance", "--acceptance-max-bytes", size)
        assert res.exit_code == 2 and "want a size" in res.output
    res = _invoke(cli, "--root", str(H100_TREE), "--peer", "root@node2")
    assert res.exit_code == 2 and "--acceptance-rdma" in res.output


def test_module_entry_point_prints_json(h100_facts, monkeypatch, capsys) -> None:
    import pdinfra.host.facts as facts_mod

    monkeypatch.setattr(facts_mod, "gather", lambda root="/": copy.deepcopy(h100_facts))
    monkeypatch.setattr(accept_worker, "measure_local", lambda plan, progress=None: _measurement(8, 470.0))
    monkeypatch.setattr(A, "_which", lambda name: None)
    rc = A.main(["--max-bytes", "16GiB", "--hardware", "hgx-h100-8gpu", "--cluster", "/nonexistent"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["report"]["hardware"] == "hgx-h100-8gpu"
    assert {c["id"] for c in data["checks"]} >= {"accept.nccl.all_reduce", "accept.pcie_copy gpu7", "accept.p2p gpu7"}


def test_nothing_imports_torch_at_module_level() -> None:
    for mod in (A, accept_worker):
        src = Path(mod.__file__).read_text()
        top = [ln for ln in src.splitlines() if re.match(r"(import|from) ", ln)]
        assert not [ln for ln in top if "torch" in ln], mod.__name__
    assert "import torch" in textwrap.dedent(Path(accept_worker.__file__).read_text())
