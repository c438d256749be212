"""The test-only KV fault (pdinfra.serving.kv_fault): while its switch file exists, a decode worker's NIXL READs
are posted with the request's remote blocks permuted; without it, exactly as vLLM made them.

Exercised here on a stand-in pull_worker with vLLM 0.32/0.33's names and a frozen ``ReadSpec`` dataclass (as in
vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py), loaded through both .pth hooks in a fresh
interpreter, so the order the two wrappers take is the nodes' order. That the permuted blocks change the answer,
and that the smoke sees it, is shown on the real vLLM by tests/e2e/test_local_cluster.py
(test_misplaced_kv_blocks_fail_the_answer_checks)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import test_kv_trace

from pdinfra.serving import kv_fault, kv_trace

REPO = Path(__file__).resolve().parents[2]

WORKER = """
from dataclasses import dataclass

@dataclass(frozen=True)
class ReadSpec:
    remote_rank: int
    local_block_ids: tuple
    remote_block_ids: tuple

class NixlPullConnectorWorker:
    def __init__(self):
        self.posted = []

    def _read_blocks(self, read_spec, dst_engine_id, request_id, remote_request_id="r", **kw):
        self.posted.append([list(g) for g in read_spec.remote_block_ids])
        return True
"""


def _fake_vllm(root: Path) -> None:
    test_kv_trace._fake_vllm(root, WORKER)


def _reads(root: Path, switch: Path | None, trace: Path | None = None) -> list:
    code = textwrap.dedent("""
        import json
        # what pdinfra_kv_fault.pth and pdinfra_kv_trace.pth run, in the order Python reads .pth files
        import pdinfra.serving.kv_fault as f; f.install()
        import pdinfra.serving.kv_trace as t; t.install()
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_worker as m
        w = m.NixlPullConnectorWorker()
        w._read_blocks(m.ReadSpec(0, ([7, 8, 9],), ([100, 101, 102],)), "P", "req-1")
        w._read_blocks(m.ReadSpec(0, ([1],), ([2],)), dst_engine_id="P", request_id="req-2")
        print(json.dumps(w.posted))
    """)
    env = {"PYTHONPATH": f"{root}:{REPO}", "PATH": "/usr/bin:/bin"}
    if switch is not None:
        env[kv_fault.ENV] = str(switch)
    if trace is not None:
        env[kv_trace.ENV] = str(trace)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize(
    ("word", "want"), [("swap", [102, 101, 100]), ("", [102, 101, 100]), ("shift", [101, 102, 100])]
)
def test_the_switch_file_permutes_the_remote_blocks(tmp_path, word, want):
    _fake_vllm(tmp_path)
    switch = tmp_path / "kv-fault"
    switch.write_text(word)
    assert _reads(tmp_path, switch) == [[want], [[2]]]  # one block: nothing to permute


def test_without_the_file_the_reads_are_vllms(tmp_path):
    _fake_vllm(tmp_path)
    assert _reads(tmp_path, tmp_path / "absent") == [[[100, 101, 102]], [[2]]]
    assert _reads(tmp_path, None) == [[[100, 101, 102]], [[2]]]


def test_the_trace_still_records_what_vllm_asked_for(tmp_path):
    """Both hooks armed: the trace (outer wrapper) records vLLM's block IDs, the fault (inner) posts its own."""
    _fake_vllm(tmp_path)
    switch, trace = tmp_path / "kv-fault", tmp_path / "trace.jsonl"
    switch.write_text("swap")
    assert _reads(tmp_path, switch, trace)[0] == [[102, 101, 100]]
    first = json.loads(trace.read_text().splitlines()[0])
    assert first["remote"] == [[100, 101, 102]]


def test_permute_keeps_vllms_containers():
    assert kv_fault.permute(([1, 2, 3], [4, 5]), "swap") == ([3, 2, 1], [5, 4])
    assert kv_fault.permute([[1, 2, 3]], "shift") == [[2, 3, 1]]
    assert kv_fault.permute([1, 2], "swap") == [2, 1]
    assert kv_fault.permute((), "swap") == ()
