"""Link limits from facts, and `validate --transfer` results replayed from the recorded 2xH200 run (2026-11-29)."""

from __future__ import annotations

import json
from pathlib import Path

from pdinfra import transfer as T
from pdinfra.cluster import kvshape
from pdinfra.host import linklimits
from pdinfra.host.facts import gather
from pdinfra.transfer import checks as transfer_checks

FIX = Path(__file__).resolve().parent.parent / "fixtures"
RUN = FIX / "recorded" / "h200x2-validate-transfer"


def test_recorded_h200x2_link_limits_match_nvidia_smi():
    lim = linklimits.limits(json.loads((RUN / "facts.json").read_text()))
    assert lim == {"gpu-gpu": 478.1, "host-gpu": 63.0}  # 18 x 26.5625 (nvidia-smi nvlink -s), Gen5 x16


def test_synthesised_hgx_h100_and_cpu_host_limits():
    assert linklimits.limits(gather(str(FIX / "hosts" / "hgx-h100-8gpu-8roce")))["gpu-gpu"] == 478.1
    assert linklimits.limits({"gpus": {"present": False}}) == {"gpu-gpu": None, "host-gpu": None}


def test_down_link_lowers_the_limit():
    facts = json.loads((RUN / "facts.json").read_text())
    facts["gpus"]["devices"][1]["nvlinks"][0]["active"] = False
    assert linklimits.limits(facts)["gpu-gpu"] == round(17 * 26.5625, 1)


def test_recorded_validate_transfer_becomes_checks():
    report = json.loads((RUN / "transfer.json").read_text())
    res = transfer_checks.to_checks(report, "h200x2")
    by = {r.id: r for r in res}
    one_gib = by["transfer.gpu-gpu READ 1x1GiB"]
    assert one_gib.verdict == "pass" and "cuda_ipc" in one_gib.evidence and "of the 478 GB/s link" in one_gib.evidence
    kv = by["transfer.gpu-gpu READ kv:gpt-oss-120b 8192tok B16 contig prepped"]
    assert "36864 desc" in kv.evidence
    assert {r.verdict for r in res if r.id.startswith("transfer.host-gpu")} == {"warn"}
    assert not [r for r in res if r.verdict == "fail"]


def test_recorded_run_meets_the_issue_targets():
    rows = {r["case"]: r for r in json.loads((RUN / "transfer.json").read_text())["results"] if r["pair"] == "gpu-gpu"}
    assert rows["READ 1x1GiB"]["eff_copy"] >= 0.9 and rows["WRITE 1x1GiB"]["eff_copy"] >= 0.9
    assert rows["READ kv:gpt-oss-120b 8192tok B16 contig prepped"]["eff_copy"] >= 0.8


def test_compact_plan_on_a_cpu_host_is_small():
    cfg = transfer_checks.compact_config({"gpus": {"present": False}})
    assert cfg.model_shape == "tiny" and max(cfg.sizes) <= 16 * 1024**2 and cfg.link_gbps is None


def test_the_validator_also_measures_the_recorded_busy_layout():
    """Besides adjacent blocks, the KV request is replayed with the block layout the local stack's decode
    instances recorded under a recycled pool (shipped with pdinfra, so every node has it)."""
    assert transfer_checks.BUSY_TRACE.is_file()
    cfg = transfer_checks.compact_config({"gpus": {"present": True, "count": 2}})
    assert cfg.layouts == ("contig", "trace") and cfg.kv_trace is not None
    cases = T.plan_cases(
        ("READ",),
        (),
        (),
        cfg.layouts,
        kvshape.get_shape(cfg.model_shape),
        8192,
        cfg.block_sizes,
        cfg.tp,
        kv_trace=cfg.kv_trace,
    )
    contig, busy = cases
    assert busy.layout == "trace" and busy.kv["trace"] == "local-busy.jsonl"
    assert busy.descs == contig.descs and busy.span > contig.span  # same blocks, runs broken as recorded
    assert 1 < busy.kv["runs"] <= kvshape.blocks_for_prompt(8192, cfg.block_sizes[0])
