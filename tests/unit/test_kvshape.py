"""KV geometry checked against numbers worked out by hand from the models' config.json files."""

import json
from pathlib import Path

import pytest

from pdinfra.cluster import kvshape as K

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "transfer"


def test_bytes_per_token_by_hand():
    # 2 (K and V) x layers x KV heads x head_dim x dtype bytes
    assert K.bytes_per_token(K.get_shape("gpt-oss-120b")) == 2 * 36 * 8 * 64 * 2 == 73728
    assert K.bytes_per_token(K.get_shape("llama-3.1-8b")) == 2 * 32 * 8 * 128 * 2 == 131072
    assert K.bytes_per_token(K.get_shape("llama-3.1-70b")) == 2 * 80 * 8 * 128 * 2 == 327680
    assert K.bytes_per_token(K.get_shape("tiny")) == 2 * 2 * 4 * 64 * 4 == 4096


def test_tp_splits_heads_and_replicates_past_them():
    s = K.get_shape("Llama-3.1-70B")
    assert K.kv_heads_per_rank(s, 2) == 4
    assert K.bytes_per_token(s, 8) == 2 * 80 * 1 * 128 * 2 == 40960
    assert K.bytes_per_token(s, 16) == 40960  # 16 ranks > 8 heads: each rank keeps one (replicated) head
    with pytest.raises(ValueError):
        K.kv_heads_per_rank(s, 0)


def test_blocks_and_descriptor_length():
    s = K.get_shape("gpt-oss-120b")
    assert K.blocks_for_prompt(8192, 16) == 512
    assert K.blocks_for_prompt(8193, 16) == 513
    assert K.blocks_for_prompt(0, 16) == 0
    # vLLM 0.32/0.33: one region per layer, a block's K and V together ([blocks, heads, block, 2 * head_dim])
    assert K.block_len(s, 16) == 16 * 8 * 2 * 64 * 2 == 32768
    assert K.block_len(s, 64) == 131072
    assert K.block_len(s, 16, tp=2) == 16384


def test_descriptors_per_request_like_nixl_connector():
    s = K.get_shape("gpt-oss-120b")
    # one region per layer (K and V packed), one descriptor per block in each
    assert K.descriptors_per_request(s, 8192, 16, swa_trim=False) == 36 * 512 == 18432
    assert K.descriptors_per_request(s, 8192, 16, tp=4, swa_trim=False) == 18432  # same count, shorter ones
    assert K.descriptors_per_request(s, 8192, 16, cross_layer=True) == 512
    # vLLM 0.33 keeps the hybrid KV-cache manager with NIXL: sliding layers (window 128) move their last
    # ceil(128/16)+1 = 9 blocks (the default)
    assert K.SWA_TRIM is True
    assert K.descriptors_per_request(s, 8192, 16) == 18 * 512 + 18 * 9 == 9378
    assert K.descriptors_per_request(s, 8192, 64) == 18 * 128 + 18 * 3 == 2358
    assert K.descriptors_per_request(s, 64, 16) == 36 * 4  # short prompt: nothing to trim


def test_cross_layer_blocks_move_every_layer_of_every_block():
    b = K.kv_budget("gpt-oss-120b", 8192, 390.0, 0.0, block_size=64, cross_layer=True)
    assert b.descriptors_per_rank == 128 and b.descriptor_bytes == 36 * 131072
    assert b.bytes_per_rank == b.descriptors_per_rank * b.descriptor_bytes == 603979776  # no sliding-window trim


def test_request_bytes_whole_blocks():
    s = K.get_shape("gpt-oss-120b")
    assert K.request_bytes(s, 8192, 16, swa_trim=False) == 8192 * 73728 == 603979776
    assert K.request_bytes(s, 8190, 16, swa_trim=False) == 603979776  # a partly filled last block moves whole
    assert K.request_bytes(s, 8192, 16) == 9378 * 32768  # sliding layers' tails only
    tiny = K.get_shape("tiny")
    # 96 tokens = 6 blocks of 16: 2 layers x K,V x 6 x (16 x 4 x 64 x 4 B) = 393216 B = 0.375 MiB
    assert K.request_bytes(tiny, 96, 16) == 393216


def test_kv_budget_by_hand():
    b = K.kv_budget("llama-3.1-8b", 4096, measured_gbps=50.0, per_request_latency_s=0.002, block_size=16, tp=2)
    per_rank = 4096 * 2 * 32 * 4 * 128 * 2  # 4 heads per rank at tp=2
    assert b.bytes_per_rank == per_rank == 268435456
    assert b.bytes_total == 2 * per_rank
    assert b.descriptors_per_rank == 32 * 256
    assert b.descriptor_bytes == 16 * 4 * 2 * 128 * 2
    assert b.transfer_s == pytest.approx(per_rank / 50e9)
    assert b.added_ttft_s == pytest.approx(0.002 + per_rank / 50e9)
    with pytest.raises(ValueError):
        K.kv_budget("tiny", 10, 0.0, 0.0)
    with pytest.raises(KeyError):
        K.get_shape("no-such-model")


def test_kv_budget_predicts_the_measured_contiguous_transfer():
    """gpt-oss-120b, 8192 tokens, B16, adjacent blocks, measured on 2x H200: the prediction from the 1 GiB rate
    lands within 5% of the measured per-request time."""
    data = json.loads((FIXTURES / "h200x2-main.json").read_text())
    by_case = {(r["session"], r["case"]): r for r in data["results"]}
    single = by_case[("VRAM0->VRAM1 thr0", "READ 1x1GiB")]
    kv = by_case[("VRAM0->VRAM1 thr0", "READ kv:gpt-oss-120b 8192tok B16 contig prepped")]
    assert kv["descs"] == 36864 and kv["bytes_per_xfer"] == 603979776
    # that run moved every block of every layer (the plan before vLLM 0.33's hybrid KV-cache manager)
    b = K.kv_budget("gpt-oss-120b", 8192, single["gbps"], single["make_s"], block_size=16, swa_trim=False)
    assert b.added_ttft_s == pytest.approx(kv["latency_s"], rel=0.05)


def test_kv_budget_with_per_descriptor_cost_predicts_scattered_blocks():
    """Same request with blocks one slot apart (nothing for NIXL to merge): the per-descriptor cost measured
    on 4096 scattered 16 KiB descriptors predicts the 36864-descriptor request within 25%. (That run used the
    pre-0.32 plan, K and V in two regions: the prediction takes its descriptor count from the record.)"""
    data = json.loads((FIXTURES / "h200x2-main.json").read_text())
    by_case = {(r["session"], r["case"]): r for r in data["results"]}
    single = by_case[("VRAM0->VRAM1 thr0", "READ 1x1GiB")]
    batch = by_case[("VRAM0->VRAM1 thr0", "READ 4096x16KiB scatter prepped")]
    kv = by_case[("VRAM0->VRAM1 thr0", "READ kv:gpt-oss-120b 8192tok B16 scatter prepped")]
    per_desc = batch["latency_s"] / batch["descs"]
    b = K.kv_budget("gpt-oss-120b", 8192, single["gbps"], 0.0, block_size=16, per_descriptor_s=per_desc, swa_trim=False)
    assert b.descriptor_s == pytest.approx(18432 * per_desc)
    assert b.transfer_s + kv["descs"] * per_desc == pytest.approx(kv["latency_s"], rel=0.25)
    assert b.added_ttft_s > 20 * K.kv_budget("gpt-oss-120b", 8192, single["gbps"], 0.0, swa_trim=False).added_ttft_s
