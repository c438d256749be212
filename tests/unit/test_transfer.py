"""The NIXL benchmark: UCX_PROTO_INFO parsing, verdicts, recorded H200 output, and a real two-process run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdinfra import transfer as T
from pdinfra.cluster import kvshape

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transfer"
HAVE_NIXL, WHY_NOT = T.nixl_available()
needs_nixl = pytest.mark.skipif(not HAVE_NIXL, reason=WHY_NOT)


def _h200_logs() -> dict[str, str]:
    text = (FIXTURES / "h200x2-ucx-initiator-logs.txt").read_text()
    out = {}
    for part in text.split("=== ")[1:]:
        name, body = part.split("\n", 1)
        out[Path(name).name.replace(".initiator.log", "")] = body
    return out


# ----------------------------------------------------------------------------- parsing recorded output


def test_parse_cpu_tcp_log():
    tables = T.parse_proto_info((FIXTURES / "cpu-dram-tcp.initiator.log").read_text())
    assert tables and all(t.rows for t in tables)
    assert T.select_transports(tables, "READ", "host", "host", 16384) == ["tcp"]
    assert T.select_transports(tables, "WRITE", "host", "host", 1 << 20) == ["tcp"]
    get = [t for t in tables if t.op == "READ" and not t.is_self]
    assert get[0].rows[0].description == "software emulation"
    # a two-lane row: "52% on tcp/lo and 48% on tcp/eth0"
    assert any(len(r.config.split(" and ")) == 2 for t in tables for r in t.rows)


def test_parse_h200_logs():
    logs = _h200_logs()
    vv = T.parse_proto_info(logs["VRAM0-_VRAM1_thr0"])
    assert T.select_transports(vv, "READ", "cuda", "cuda", 16384) == ["cuda_ipc"]
    assert T.select_transports(vv, "WRITE", "cuda", "cuda", 1 << 30) == ["cuda_ipc"]
    # the loopback ("self") endpoint's cuda_copy tables never count
    assert any(t.is_self and "cuda_copy" in r.config for t in vv for r in t.rows)
    assert "cuda_copy" not in T.select_transports(vv, "WRITE", "host", "host")
    hv = T.parse_proto_info(logs["DRAM-_VRAM0_thr0"])
    assert T.select_transports(hv, "READ", "cuda", "host", 65536) == ["tcp"]
    assert T.select_transports(hv, "WRITE", "cuda", "host", 65536) == ["tcp"]
    assert T.select_transports(hv, "READ", "cuda", "cuda") == []  # no table for that pair: no guess
    copy_only = T.parse_proto_info(logs["VRAM0-_VRAM1_thr0_UCX_TLS_cuda_copy_tcp_sm_self"])
    assert T.select_transports(copy_only, "READ", "cuda", "cuda", 1 << 20) == ["tcp"]
    assert T.parse_proto_info(logs["VRAM0-_VRAM1_thr0_UCX_TLS_tcp_sm_self"]) == []


def test_native_error_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(_h200_logs()["VRAM0-_VRAM1_thr0_UCX_TLS_tcp_sm_self"])
    from pdinfra.transfer.session import native_errors

    msg = native_errors(log)
    assert msg.startswith("config.cpp:84] Invalid UCX_TLS=tcp,sm,self") and "cuda_copy" in msg


RDMA_SAMPLE = """\
[1.1] [node:7:0]   +-------------+----------------------+---------------------------------------------+
[1.1] [node:7:0]   | dec inter-node cfg#3                                                             |
[1.1] [node:7:0]   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]            |
[1.1] [node:7:0]   +-------------+----------------------+---------------------------------------------+
[1.1] [node:7:0]   |   Range     |    Description       |                   Config                    |
[1.1] [node:7:0]   +-------------+----------------------+---------------------------------------------+
[1.1] [node:7:0]   |     0..8192 | zero-copy            | rc_mlx5/mlx5_0:1                            |
[1.1] [node:7:0]   | 8193..inf   | multi-frag zero-copy | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_3:1 |
[1.1] [node:7:0]   +-------------+----------------------+---------------------------------------------+
some other line
"""


def test_parse_rdma_sample_and_size_ranges():
    (table,) = T.parse_proto_info(RDMA_SAMPLE)
    assert table.op == "READ" and table.mems == ("cuda", "cuda") and not table.is_self
    assert table.rows[1].hi is None and table.rows[0].covers(8192) and not table.rows[0].covers(8193)
    assert table.rows[1].transports == ["rc_mlx5", "rc_mlx5"]
    assert T.select_transports([table], "READ", "cuda", "cuda", 4096) == ["rc_mlx5"]
    assert T.select_transports([table], "WRITE", "cuda", "cuda") == []


# ----------------------------------------------------------------------------- verdicts


def _res(**kw) -> T.CaseResult:
    base = dict(
        case="c",
        session="s",
        op="READ",
        mode="prepped",
        layout="single",
        initiator="VRAM1",
        target="VRAM0",
        pair="gpu-gpu",
        num_threads=0,
        desc_bytes=1 << 30,
        descs=1,
        bytes_per_xfer=1 << 30,
        gbps=390.0,
        latency_s=0.00275,
        transport="cuda_ipc",
        checksum_ok=True,
    )
    base.update(kw)
    return T.CaseResult(**base)


def test_verdicts():
    ok = T.finish_result(_res(), 392.0, 478.0, gpu_host=True)
    assert ok.verdict == "pass" and ok.eff_copy == pytest.approx(390 / 392) and ok.eff_link == pytest.approx(390 / 478)

    tcp = T.finish_result(_res(transport="tcp", gbps=0.5), 392.0, 478.0, True, module_dir="/x/nixl_cu13.libs/ucx")
    assert tcp.verdict == "fail" and "tcp" in tcp.reason
    assert "UCX_MODULE_DIR=/x/nixl_cu13.libs/ucx" in tcp.remedy and "keep tcp" in tcp.remedy

    # the same tcp on a host without GPUs is not a GPU path lost
    assert (
        T.judge(_res(pair="host-host", transport="tcp", initiator="DRAM", target="DRAM", eff_copy=0.9), False)[0]
        == "pass"
    )
    # nothing to compare with: the bandwidth of a bandwidth-bound request is not judged, and says so
    unjudged = T.judge(_res(pair="node-node", transport="tcp", initiator="DRAM", target="DRAM"), False)
    assert unjudged[0] == "warn" and "not judged" in unjudged[1]
    host_gpu = T.judge(_res(pair="host-gpu", transport="tcp", target="DRAM"), True)
    assert host_gpu[0] == "warn" and "not PCIe bandwidth" in host_gpu[1]
    assert T.judge(_res(transport="cma"), True)[0] == "warn"  # GPU pair without cuda_ipc
    assert T.judge(_res(transport=""), True)[0] == "warn"
    assert T.judge(_res(error="target exited with code 1"), True)[0] == "fail"
    assert T.judge(_res(checksum_ok=False), True)[0] == "fail"

    bound = T.finish_result(
        _res(descs=36864, desc_bytes=16384, bytes_per_xfer=603979776, gbps=3.6, latency_s=0.1668, layout="scatter"),
        392.0,
        478.0,
        True,
    )
    assert bound.verdict == "warn" and "4.5 us per descriptor" in bound.reason
    slow = T.finish_result(_res(gbps=200.0), 392.0, 478.0, True)
    assert slow.verdict == "warn" and "51% of a raw copy" in slow.reason


def test_bandwidth_bound_requests_far_below_the_copy_fail():
    """1 GiB over NVLink at 4 GB/s while a plain copy did 392 GB/s in the same run: a fail, with a remedy."""
    crawl = T.finish_result(_res(gbps=4.0), 392.0, 478.0, True)
    assert crawl.verdict == "fail" and "1% of a raw copy (< 25%)" in crawl.reason and crawl.remedy
    kv = T.finish_result(
        _res(descs=9216, desc_bytes=65536, bytes_per_xfer=9216 * 65536, layout="contig", gbps=50.0, latency_s=0.012),
        392.0,
        478.0,
        True,
    )
    assert kv.verdict == "fail"  # adjacent prepped KV blocks are bandwidth-bound too
    no_copy = T.finish_result(_res(gbps=40.0), None, 478.0, True)
    assert no_copy.verdict == "fail" and "of the link limit" in no_copy.reason
    small = T.finish_result(_res(bytes_per_xfer=65536, desc_bytes=65536, gbps=4.0), 392.0, 478.0, True)
    assert small.verdict == "pass"  # 64 KiB is latency-bound: not judged on bandwidth
    scattered = T.finish_result(
        _res(descs=36864, desc_bytes=16384, bytes_per_xfer=603979776, gbps=3.6, latency_s=0.1668, layout="scatter"),
        392.0,
        478.0,
        True,
    )
    assert scattered.verdict == "warn"  # descriptor-bound: the layout's cost, reported not failed


def test_recorded_h200_results():
    data, results = T.load_results(FIXTURES / "h200x2-main.json")
    assert data["nixl_version"] == "1.5.1" and data["gpus"] == [0, 1]
    T.regrade(results, gpu_host=True)
    assert not T.any_fail(results)
    gg = [r for r in results if r.pair == "gpu-gpu"]
    assert gg and all(r.transport == "cuda_ipc" and r.checksum_ok for r in gg)
    hg = [r for r in results if r.pair == "host-gpu"]
    assert hg and all(r.transport == "tcp" and r.verdict == "warn" for r in hg)
    one_gib = next(r for r in gg if r.case == "READ 1x1GiB" and r.num_threads == 0)
    assert one_gib.verdict == "pass" and one_gib.eff_copy > 0.9 and one_gib.eff_link > 0.75
    scatter = next(r for r in gg if r.case == "READ kv:gpt-oss-120b 8192tok B16 scatter prepped" and r.num_threads == 0)
    contig = next(r for r in gg if r.case == "READ kv:gpt-oss-120b 8192tok B16 contig prepped" and r.num_threads == 0)
    # recorded with the pre-0.32 plan (K and V in two regions per layer): twice today's descriptor count
    today = kvshape.descriptors_per_request(kvshape.get_shape("gpt-oss-120b"), 8192, 16, swa_trim=False)
    assert scatter.descs == contig.descs == 2 * today
    assert scatter.verdict == "warn" and "descriptor-bound" in scatter.reason
    assert contig.verdict == "pass" and contig.gbps > 50 * scatter.gbps

    _, bad = T.load_results(FIXTURES / "h200x2-ucx-tls.json")
    T.regrade(bad, gpu_host=True)
    assert T.any_fail(bad)
    copy_only = [r for r in bad if "cuda_copy" in r.session]
    assert copy_only and all(r.transport == "tcp" and r.verdict == "fail" for r in copy_only)
    no_cuda = [r for r in bad if r.session.endswith("UCX_TLS=tcp,sm,self")]
    assert "does not enable CUDA memory support" in no_cuda[0].error


def test_a_healthy_one_gpu_host_has_no_fail_and_the_same_gpu_pair_is_not_judged_against_pcie():
    """Recorded on a one-GPU H200 host (docs/runs/2026-12-01-h200x1-final-catalog): READ between two processes on
    the GPU went over tcp while WRITE used cuda_ipc, and every row was judged against the 63 GB/s PCIe link. Now:
    no fail, the READ rows say why (cuda_ipc GET off) and what to set, and a same-GPU pair has no link limit."""
    _, results = T.load_results(FIXTURES / "h200x1-final-catalog.json")
    T.regrade(results, gpu_host=True)
    assert not T.any_fail(results), [(r.case, r.reason) for r in results if r.verdict == "fail"]
    same = [r for r in results if r.pair == "gpu-gpu"]
    assert same and all(r.same_device and r.link_gbps is None and r.eff_link is None for r in same)
    reads = [r for r in same if r.op == "READ"]
    assert reads and all(r.transport == "tcp" and r.verdict == "warn" for r in reads)
    assert all("cuda_ipc GET is off" in r.reason and "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in r.remedy for r in reads)
    assert "UCX_MODULE_DIR" not in reads[0].remedy  # the CUDA path exists: WRITE used it
    one_gib = next(r for r in same if r.case == "WRITE 1x1GiB")
    assert one_gib.verdict == "pass" and one_gib.eff_copy > 0.9  # against the GPU's own copy (2 112 GB/s)


def test_cuda_ipc_get_forced_on_moves_the_same_gpu_read_off_tcp():
    """Recorded on a one-GPU H200 host (docs/runs/2026-12-03-h200x1-get-zcopy): with UCX's default the READ rows go
    over tcp at 0.3-0.7 GB/s; with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y the same cases use cuda_ipc, 1 GiB at about
    2 080 GB/s. This is why the ucx role writes that variable on GPU hosts."""
    _, results = T.load_results(FIXTURES / "h200x1-get-zcopy.json")
    T.regrade(results, gpu_host=True)
    default = [r for r in results if r.op == "READ" and not r.ucx_env]
    forced = [r for r in results if r.op == "READ" and r.ucx_env.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") == "y"]
    assert default and all(r.transport == "tcp" and r.gbps < 1.0 for r in default)
    assert forced and all(r.transport == "cuda_ipc" for r in forced)
    assert next(r for r in forced if r.case == "READ 1x1GiB").gbps > 1500
    assert not T.any_fail(results)


def test_read_over_tcp_between_two_gpus_while_write_used_cuda_ipc_fails_with_the_get_remedy():
    """Two GPUs of one host without an active NVLink (UCX's auto turns cuda_ipc GET off): vLLM's decode READ would
    go over tcp. A fail naming UCX_CUDA_IPC_ENABLE_GET_ZCOPY; on one GPU the same pattern is a warn."""
    two = [_res(op="WRITE", transport="cuda_ipc", gbps=380.0, target="VRAM0"),
           _res(op="READ", transport="tcp", gbps=0.6, target="VRAM0")]  # fmt: skip
    for r in two:
        T.finish_result(r, 392.0, 478.0, True)
    T.regrade(two, gpu_host=True)
    assert two[1].verdict == "fail" and "cuda_ipc GET is off" in two[1].reason
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in two[1].remedy
    one = [_res(op="WRITE", transport="cuda_ipc", gbps=380.0, same_device=True),
           _res(op="READ", transport="tcp", gbps=0.6, same_device=True)]  # fmt: skip
    T.regrade(one, gpu_host=True)
    assert one[1].verdict == "warn" and "one GPU" in one[1].reason


def test_render_table_of_recorded_results():
    from rich.console import Console

    from pdinfra.cli.transfer import render_table

    _, results = T.load_results(FIXTURES / "h200x2-progthread.json")
    console = Console(width=250, record=True)
    console.print(render_table(T.regrade(results, True)))
    text = console.export_text()
    assert "READ 1x1GiB" in text and "cuda_ipc" in text and "266.00" in text


# ----------------------------------------------------------------------------- planning and helpers


def test_plans_and_layouts():
    shape = kvshape.get_shape("gpt-oss-120b")
    blen, contig = T.kv_slots(shape, 8192, 16, 1, "contig")
    _, scatter = T.kv_slots(shape, 8192, 16, 1, "scatter")
    # one region per layer of 512 blocks (K and V together), the regions one slot apart (as in vLLM's cache);
    # layer 0 slides (window 128): only its last 9 blocks move
    assert blen == 32768 and len(contig) == len(scatter) == 18 * 512 + 18 * 9 == 9378
    assert contig[:9] == list(range(503, 512)) and contig[9 : 9 + 512] == list(range(513, 513 + 512))
    assert all(b - a >= 2 for a, b in zip(scatter, scatter[1:], strict=False))  # nothing adjacent to merge
    _, traced = T.kv_slots(shape, 64, 16, 1, "trace", [False, True, False])
    # blocks 0-1 and 2-3 adjacent, a break between them, in each layer's region
    assert traced[:8] == [0, 1, 3, 4, 6, 7, 9, 10] and len(traced) == 36 * 4  # 64 tokens: nothing to trim
    pblen, packed = T.kv_slots(shape, 8192, 16, 1, "packed")  # cross-layer blocks: one descriptor per block
    assert pblen == 36 * 32768 and packed == [2 * b for b in range(512)]
    with pytest.raises(ValueError, match="break flags"):
        T.kv_slots(shape, 64, 16, 1, "trace", [False])
    cases = T.plan_cases(("READ",), (1 << 20,), ((64, 16384),), ("scatter",), kvshape.get_shape("tiny"), 256, (16,))
    assert [c.name for c in cases] == [
        "READ 1x1MiB",
        "READ 64x16KiB scatter plain",
        "READ 64x16KiB scatter prepped",
        "READ kv:tiny 256tok B16 scatter prepped",
    ]
    assert cases[-1].descs == 2 * 16 and cases[-1].kv["bytes_per_token"] == 4096
    s3 = T.plan_sessions([0, 1, 2], cases)
    assert [s.label for s in s3] == [
        "VRAM0->VRAM1 thr0",
        "VRAM0->VRAM2 thr0",
        "VRAM1->VRAM2 thr0",
        "DRAM->VRAM0 thr0",
    ]
    assert s3[-1].target.pinned and s3[-1].pair == "host-gpu"
    assert [s.label for s in T.plan_sessions([0], cases)] == ["VRAM0->VRAM0 thr0", "DRAM->VRAM0 thr0"]
    cpu = T.plan_sessions([], cases, num_threads=(0, 4), ucx_envs=({"UCX_TLS": "tcp"},))
    assert [s.label for s in cpu] == ["DRAM->DRAM thr0 UCX_TLS=tcp", "DRAM->DRAM thr4 UCX_TLS=tcp"]
    assert T.parse_size("64KiB") == 65536 and T.parse_size("1G") == 1 << 30 and T.parse_size("4096") == 4096
    assert T.fmt_bytes(1 << 30) == "1GiB" and T.fmt_bytes(1000) == "1000B"
    assert T.fmt_latency(2.5e-5) == "25 us" and T.fmt_latency(None) == "-"


def test_checksum_catches_misplaced_blocks():
    from pdinfra.transfer.worker import Buffer

    buf = Buffer(T.Endpoint("DRAM"), 64 * 4096)
    buf.fill(7)
    slots = [0, 2, 4, 6]
    good = buf.checksum(slots, 4096)
    assert good == buf.checksum(list(slots), 4096)
    assert good != buf.checksum([2, 0, 4, 6], 4096)  # blocks swapped
    assert good != buf.checksum([0, 2, 4, 8], 4096)  # a block from the wrong slot
    buf.zero()
    assert buf.checksum(slots, 4096) == 0


def test_importable_without_nixl_and_torch():
    code = (
        "import sys; sys.modules['nixl'] = None; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
        "import pdinfra.transfer as T, pdinfra.cli.transfer, pdinfra.cluster.kvshape\n"
        "print(T.nixl_available())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "NIXL not installed" in out.stdout


def test_cli_says_nixl_missing(monkeypatch):
    from typer.testing import CliRunner

    import pdinfra.transfer.session as S
    from pdinfra.cli.transfer import transfer_cmd

    monkeypatch.setattr(S, "nixl_available", lambda: (False, T.NIXL_MISSING))
    import typer

    app = typer.Typer()
    app.command()(transfer_cmd)
    res = CliRunner().invoke(app, ["--iters", "1"])
    assert res.exit_code == 2
    assert "NIXL not installed" in res.output


# ----------------------------------------------------------------------------- real NIXL, two processes


@needs_nixl
def test_real_dram_transfer_over_tcp_loopback(tmp_path):
    """Two processes, UCX forced onto tcp over loopback (what a CPU-only CI host exercises)."""
    tiny = kvshape.get_shape("tiny")
    cases = T.plan_cases(("READ", "WRITE"), (1 << 20,), ((64, 16384),), ("scatter",), tiny, 256, (16,))
    spec = T.SessionSpec(
        "cpu tcp",
        T.Endpoint("DRAM"),
        T.Endpoint("DRAM"),
        cases,
        ucx_env={"UCX_TLS": "tcp"},
        iters=3,
        warmup=1,
        case_cap_s=10.0,
    )
    report, results = T.run_session(spec, gpu_host=False, log_dir=str(tmp_path))
    assert report.error == ""
    assert report.transports_seen == ["tcp"]
    assert report.copy["READ"] > 0 and "memcpy" in report.copy["kind"]
    assert len(results) == len(cases) == 8
    for r in results:
        assert r.error == "" and r.checksum_ok is True, (r.case, r.error)
        assert r.transport == "tcp", r.case
        assert r.iters == 3 and r.gbps > 0 and r.latency_s > 0
        assert r.verdict in ("pass", "warn") and r.eff_copy is not None
    kv = next(r for r in results if r.kv)
    assert kv.descs == kvshape.descriptors_per_request(tiny, 256, 16) == 32
    assert kv.bytes_per_xfer == kvshape.request_bytes(tiny, 256, 16)
    assert (tmp_path / "cpu_tcp.initiator.log").exists()


@needs_nixl
def test_cli_json_real_run():
    import typer
    from typer.testing import CliRunner

    from pdinfra.cli.transfer import transfer_cmd

    app = typer.Typer()
    app.command()(transfer_cmd)
    args = [
        "--ucx-env",
        "UCX_TLS=tcp",
        "--sizes",
        "64KiB",
        "--batches",
        "none",
        "--prompt-tokens",
        "32",
        "--mode",
        "READ",
        "--iters",
        "2",
        "--json",
        "--gpus",
        "",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{") :])
    assert [r["case"] for r in data["results"]] == ["READ 1x64KiB", "READ kv:tiny 32tok B16 scatter prepped"]
    assert all(r["transport"] == "tcp" and r["checksum_ok"] for r in data["results"])


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--sizes", "banana"], "--sizes"),
        (["--sizes", "0"], "--sizes"),
        (["--block-size", "abc"], "--block-size"),
        (["--block-size", "0"], "--block-size"),
        (["--block-size", "48"], "--block-size"),
        (["--gpus", "x"], "--gpus"),
        (["--model-shape", "foo"], "--model-shape"),
        (["--iters", "0"], "--iters"),
        (["--tp", "0"], "--tp"),
        (["--batches", "ax16KiB"], "--batches"),
        (["--batches", "4096"], "--batches"),
        (["--layouts", "diagonal"], "--layouts"),
        (["--threads", "-1"], "--threads"),
        (["--ucx-env", "UCX_TLS"], "--ucx-env"),
        (["--mode", "COPY"], "--mode"),
        (["--cap", "0"], "--cap"),
    ],
)
def test_cli_rejects_bad_arguments_without_a_traceback(args, option):
    import typer
    from typer.testing import CliRunner

    from pdinfra.cli.transfer import transfer_cmd

    app = typer.Typer()
    app.command()(transfer_cmd)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert option in res.output and "Traceback" not in res.output, res.output


@pytest.mark.skipif(not HAVE_NIXL, reason=f"NIXL not importable here: {WHY_NOT}")
def test_peer_session_speaks_to_a_target_started_by_a_command():
    """--peer's channel (one pickle per line over the command's stdin/stdout) with the target started as a local
    command instead of over SSH: a real NIXL DRAM->DRAM session, judged against the given link limit."""
    import sys

    from pdinfra.host.facts import gather
    from pdinfra.transfer import checks as TC

    results, report = TC.run_peer(
        gather("/"), "local", command=f"{sys.executable} -m pdinfra transfer-target", iters=2, link_gbps=1.25
    )
    assert report["session"]["error"] == "" and len(results) == 10, report["session"]
    assert all(r.id.startswith("transfer.node-node ") and "GB/s" in r.evidence for r in results), results
    assert not [r for r in results if r.verdict == "fail"], results


@pytest.mark.slow  # waits for the peer command's bounded start-up time
def test_peer_session_with_a_broken_command_fails_with_the_reason():
    import sys

    from pdinfra.host.facts import gather
    from pdinfra.transfer import checks as TC

    results, report = TC.run_peer(
        gather("/"), "nowhere", command=f"{sys.executable} -c 'raise SystemExit(3)'", iters=1, link_gbps=1.25
    )
    assert results and all(r.verdict == "fail" for r in results)
    assert "target exited with code 3" in report["session"]["error"] or "peer closed" in report["session"]["error"]


def test_peer_channel_skips_banners_and_never_unpickles():
    import os

    from pdinfra.transfer import remote
    from pdinfra.transfer.plan import Endpoint

    r, w = os.pipe()
    os.write(w, b"Welcome to node2\n")
    remote.LineConn(-1, w).send(("hello", b"\x00meta", 1, (2, 3), Endpoint("VRAM", 1), {"k": [None, True]}))
    os.write(w, remote.PREFIX + b"not json\n")
    conn = remote.LineConn(r, w)
    assert conn.poll(1.0)
    assert conn.recv() == ("hello", b"\x00meta", 1, (2, 3), Endpoint("VRAM", 1), {"k": [None, True]})
    with pytest.raises(EOFError, match="unreadable message"):
        conn.recv()
