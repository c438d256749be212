"""KV layout traces: the hook that records the block IDs of every NIXL READ in a decode process
(pdinfra.serving.kv_trace), and the trace's summary and replay (pdinfra.transfer.trace).

The hook is exercised here on a stand-in module with vLLM 0.32/0.33's class, method and parameter names, loaded
through the same .pth-style import hook in a fresh interpreter; the real vLLM on the local nodes is checked by
tests/e2e/test_local_cluster.py (check_target on the installed pull_worker, and a trace recorded under load)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pdinfra.serving import kv_trace
from pdinfra.transfer import trace

REPO = Path(__file__).resolve().parents[2]

FAKE_WORKER = """
class ReadSpec:
    def __init__(self, local, remote):
        self.local_block_ids, self.remote_block_ids = local, remote

class NixlPullConnectorWorker:
    def __init__(self):
        self.engine_id = "D"
        self.dst_num_blocks = {"D": 1000, "P": 2000}
        self.block_size = 16
        self.posted = []

    def _apply_prefix_caching(self, decode_block_ids, prefill_block_ids, **kw):
        # the decode side already holds the first block of each group
        return tuple(g[1:] for g in decode_block_ids), tuple(g[1:] for g in prefill_block_ids)

    def _read_blocks(self, read_spec, dst_engine_id, request_id, remote_request_id="r", **kw):
        loc, rem = self._apply_prefix_caching(decode_block_ids=read_spec.local_block_ids,
                                              prefill_block_ids=read_spec.remote_block_ids)
        self.posted.append((loc, rem))
        return True
"""


def _fake_vllm(root: Path, worker: str = FAKE_WORKER) -> None:
    """A stand-in vllm package under ``root`` whose nixl pull_worker module holds ``worker``."""
    d = root
    for part in ("vllm", "distributed", "kv_transfer", "kv_connector", "v1", "nixl"):
        d = d / part
        d.mkdir()
        (d / "__init__.py").touch()
    (d / "pull_worker.py").write_text(worker)


def _run(root: Path, env_trace: str | None) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import pdinfra.serving.kv_trace as k; k.install()   # what pdinfra_kv_trace.pth runs
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_worker as m
        w = m.NixlPullConnectorWorker()
        assert w._read_blocks(m.ReadSpec(([7, 8, 9, 20],), ([100, 101, 102, 50],)), "P", "req-1") is True
        assert w._read_blocks(m.ReadSpec(([1],), ([2],)), dst_engine_id="P", request_id="req-2") is True
        print(getattr(m.NixlPullConnectorWorker._read_blocks, "__pdinfra_kv_trace__", False), w.posted)
    """)
    env = {"PYTHONPATH": f"{root}:{REPO}", "PATH": "/usr/bin:/bin"}
    if env_trace:
        env[kv_trace.ENV] = env_trace
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_the_hook_records_every_read_and_changes_nothing(tmp_path):
    _fake_vllm(tmp_path)
    out = tmp_path / "kv-trace.jsonl"
    res = _run(tmp_path, str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("True")  # wrapped
    # the original ran with the same arguments: same transfers posted as without the hook
    plain = _run(tmp_path, None)
    assert plain.returncode == 0 and plain.stdout.startswith("False")
    assert res.stdout.split(" ", 1)[1] == plain.stdout.split(" ", 1)[1]
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["req"] for r in recs] == ["req-1", "req-2"]
    r = recs[0]
    assert r["local"] == [[7, 8, 9, 20]] and r["remote"] == [[100, 101, 102, 50]]
    assert r["local_xfer"] == [[8, 9, 20]] and r["remote_xfer"] == [[101, 102, 50]]  # after the prefix trim
    assert (r["local_pool"], r["remote_pool"], r["block_size"]) == (1000, 2000, 16)
    assert recs[1]["local_xfer"] == [[]]


def test_a_vllm_without_the_method_is_reported_not_patched(tmp_path):
    _fake_vllm(tmp_path)
    pw = tmp_path / "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py"
    pw.write_text(FAKE_WORKER.replace("def _read_blocks(self, read_spec,", "def _read_blocks(self, spec,"))
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pdinfra.serving.kv_trace as k; k.install(); "
            "import vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker",
        ],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}", kv_trace.ENV: str(tmp_path / "t")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "not tracing: NixlPullConnectorWorker._read_blocks has no parameter(s) read_spec" in res.stderr


def test_recording_errors_never_break_the_read(tmp_path):
    calls = []

    class W:
        dst_num_blocks: dict = {}

        def _read_blocks(self, read_spec, dst_engine_id, request_id):
            calls.append(request_id)
            return "posted"

    w = kv_trace.Writer(str(tmp_path / "no-such-dir" / "t.jsonl"))
    wrapped = kv_trace.wrap_read_blocks(W._read_blocks, w)
    assert wrapped(W(), object(), "P", "r1") == "posted"  # read_spec without block IDs, unwritable file
    assert calls == ["r1"]


def test_a_hook_that_raises_leaves_the_module_imported_and_unpatched(tmp_path):
    (tmp_path / "victim.py").write_text("VALUE = 1\n")
    code = (
        "from pdinfra.serving import importhook\n"
        "def bad(m): raise RuntimeError('boom')\n"
        "importhook.on_import('victim', bad)\n"
        "import victim, inspect; print(victim.VALUE, len(inspect.getsource(victim)) > 0)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1 True"  # imported, and the loader still answers get_source
    assert "pdinfra import hook on victim: RuntimeError: boom (left unpatched)" in res.stderr


def _write_trace(path: Path, reads: list[tuple[list[int], list[int]]]) -> Path:
    with path.open("w") as f:
        for n, (loc, rem) in enumerate(reads):
            f.write(
                json.dumps(
                    {
                        "req": f"r{n}",
                        "local": [loc],
                        "remote": [rem],
                        "local_pool": 100,
                        "remote_pool": 100,
                        "block_size": 16,
                    }
                )
                + "\n"
            )
    return path


def test_runs_merge_only_where_both_sides_ascend(tmp_path):
    t = trace.load(
        _write_trace(
            tmp_path / "t.jsonl",
            [
                ([1, 2, 3, 9, 10], [5, 6, 7, 8, 9]),  # decode breaks after 3: runs 3 + 2
                ([4, 5, 6], [30, 29, 28]),  # prefill descending: 3 runs of 1
                ([], []),  # full prefix hit: skipped
            ],
        )
    )
    assert [rd.runs() for rd in t.reads] == [[3, 2], [1, 1, 1]]
    s = trace.summary(t)
    assert (s["reads"], s["full_prefix_hits"], s["blocks"], s["runs"]) == (2, 1, 8, 5)
    assert s["merge_factor"] == 1.6 and s["descending_steps"] == 0  # only one side descends
    assert s["blocks_in_runs"] == {"1": 0.375, "2-3": 0.625}


def test_blocks_freed_in_reverse_come_back_descending_and_only_sorting_merges_them(tmp_path):
    """vLLM frees a request's blocks tail first, so a busy pool hands them out descending on both sides: NIXL
    merges nothing in that order; sorted by block ID first, the three blocks are one descriptor per layer."""
    t = trace.load(_write_trace(tmp_path / "t.jsonl", [([6, 5, 4], [30, 29, 28])]))
    s = trace.summary(t)
    assert (s["merge_factor"], s["merge_factor_sorted"], s["descending_steps"]) == (1.0, 3.0, 2)
    assert trace.break_pattern(t, 3) == [True, True] and trace.break_pattern(t, 3, sort=True) == [False, False]


def test_replay_keeps_the_break_structure(tmp_path):
    t = trace.load(_write_trace(tmp_path / "t.jsonl", [([1, 2, 3], [1, 2, 3]), ([8, 9], [4, 7])]))
    # 3 blocks of read 0 (one run), a boundary, read 1's break, then read 0 again
    assert trace.break_pattern(t, 7) == [False, False, True, True, True, False]
    assert trace.slots_for([False, False, True, True]) == [0, 1, 2, 4, 6]
    assert trace.break_pattern(t, 1) == []


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("", "no READ that moved blocks"),
        ('{"local": [[1]]}\n', ":1: not a kv-trace record"),
        ('{"local": [[1, 2]], "remote": [[1]]}\n', ":1: decode and prefill block lists differ"),
        ("not json\n", ":1: not a kv-trace record"),
    ],
)
def test_bad_traces_name_the_file_and_line(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(trace.TraceError, match=match):
        trace.load(p)
    with pytest.raises(trace.TraceError, match="cannot read"):
        trace.load(tmp_path / "missing.jsonl")
