"""KV-cache geometry of the models pdinfra serves, and what moving it from prefill to decode costs.

The numbers come from the models' published ``config.json`` files. The descriptor layout follows vLLM 0.32/0.33's
``NixlConnector`` with the FlashAttention cache (``[num_blocks, kv_heads, block_size, 2 * head_dim]`` per layer:
K and V packed in the content dimension, HND, the connector's default): every attention layer registers one
region, and a request moves one descriptor per layer per block, each
``block_size * kv_heads_per_rank * 2 * head_dim * dtype_bytes`` long (vLLM's ``nixl/base_worker.py``: "K and V
are packed into the content dim, so each attention layer is a single NIXL region"). Before 0.32 (and in the
first pdinfra plans, recorded under docs/runs/ until 2026-12-01) K and V were two regions: twice the descriptors
of half the length. With cross-layer blocks (one block holds every layer) a request moves one descriptor per
block; vLLM 0.33's NixlConnector does that only for MLA models (``VLLM_KV_CACHE_LAYOUT=BLHNC``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVShape:
    """The parts of a decoder's config that fix the size of its KV cache."""

    name: str
    hf_id: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    num_attention_heads: int = 0  # query heads: tensor parallelism must divide them
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = field(default_factory=tuple)
    note: str = ""


# vLLM 0.33's NixlConnector supports the hybrid KV-cache manager (SupportsHMA), so vLLM keeps it on with the
# connector and a sliding-window layer moves only its window's tail: ceil(window / block_size) + 1 blocks
# (nixl/base_scheduler.py). Earlier vLLMs turned it off with any connector, and every layer moved every block.
SWA_TRIM = True


def _alternating(num_layers: int) -> tuple[int, ...]:
    return tuple(range(0, num_layers, 2))


PRESETS: dict[str, KVShape] = {
    "gpt-oss-120b": KVShape(
        name="gpt-oss-120b",
        hf_id="openai/gpt-oss-120b",
        num_layers=36,
        num_kv_heads=8,
        head_dim=64,
        dtype="bfloat16",
        dtype_bytes=2,
        num_attention_heads=64,
        sliding_window=128,
        # config.json layer_types alternates, starting with "sliding_attention" at layer 0.
        sliding_layers=_alternating(36),
        note="18 of 36 layers use a 128-token sliding window; with vLLM 0.33's NixlConnector (hybrid KV cache "
        "manager on) those layers move only the window's last blocks",
    ),
    "llama-3.1-8b": KVShape(
        name="llama-3.1-8b",
        hf_id="meta-llama/Llama-3.1-8B-Instruct",
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        dtype="bfloat16",
        dtype_bytes=2,
        num_attention_heads=32,
    ),
    "llama-3.1-70b": KVShape(
        name="llama-3.1-70b",
        hf_id="meta-llama/Llama-3.1-70B-Instruct",
        num_layers=80,
        num_kv_heads=8,
        head_dim=128,
        dtype="bfloat16",
        dtype_bytes=2,
        num_attention_heads=64,
    ),
    "tiny": KVShape(
        name="tiny",
        hf_id="local tiny Llama (pdinfra.serving.tinymodel)",
        num_layers=2,
        num_kv_heads=4,
        head_dim=64,  # hidden 256 / 4 attention heads
        dtype="float32",
        dtype_bytes=4,
        num_attention_heads=4,
        note="the CPU test model: 2 layers, hidden 256, 4 heads, 4 KV heads; its config says float32, the local "
        "cluster serves it in bfloat16 (pdinfra_dtype), which halves its KV bytes",
    ),
}


def get_shape(name: str) -> KVShape:
    """Look a preset up by name (case-insensitive)."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[key]


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1}


def for_dtype(shape: KVShape, dtype: str | None) -> KVShape:
    """The shape with the KV cache in ``dtype`` (the dtype vLLM serves with; ``auto`` keeps the model's)."""
    if not dtype or dtype == "auto" or dtype == shape.dtype:
        return shape
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}")
    return dataclasses.replace(shape, dtype=dtype, dtype_bytes=DTYPE_BYTES[dtype])


def tp_problem(shape: KVShape, tp: int) -> str | None:
    """Why vLLM would refuse this tensor-parallel size for the model, or None."""
    if tp < 1:
        return f"tensor_parallel_size must be >= 1, not {tp}"
    if shape.num_attention_heads and shape.num_attention_heads % tp:
        return (
            f"tensor_parallel_size {tp} does not divide {shape.name}'s {shape.num_attention_heads} attention heads "
            "(vLLM refuses to start)"
        )
    if shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        return (
            f"tensor_parallel_size {tp} neither divides nor is a multiple of {shape.name}'s {shape.num_kv_heads} "
            "KV heads"
        )
    return None


def kv_heads_per_rank(shape: KVShape, tp: int = 1) -> int:
    """KV heads each tensor-parallel rank holds; vLLM replicates heads when tp exceeds them."""
    if tp < 1:
        raise ValueError("tp must be >= 1")
    return max(1, shape.num_kv_heads // tp)


def bytes_per_token(shape: KVShape, tp: int = 1) -> int:
    """K and V bytes one token occupies on one TP rank, all layers together."""
    return 2 * shape.num_layers * kv_heads_per_rank(shape, tp) * shape.head_dim * shape.dtype_bytes


def block_len(shape: KVShape, block_size: int, tp: int = 1) -> int:
    """Bytes of one descriptor: one block of one layer, K and V together, on one rank."""
    return 2 * block_size * kv_heads_per_rank(shape, tp) * shape.head_dim * shape.dtype_bytes


def blocks_for_prompt(prompt_tokens: int, block_size: int) -> int:
    """Cache blocks a prompt of ``prompt_tokens`` fills (the last one may be partly used)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    return math.ceil(max(0, prompt_tokens) / block_size)


def blocks_per_layer(shape: KVShape, prompt_tokens: int, block_size: int, swa_trim: bool = SWA_TRIM) -> list[int]:
    """Blocks each layer moves. With ``swa_trim`` sliding-window layers move only their window's blocks."""
    full = blocks_for_prompt(prompt_tokens, block_size)
    out = []
    for layer in range(shape.num_layers):
        if swa_trim and shape.sliding_window and layer in shape.sliding_layers:
            out.append(min(full, math.ceil(shape.sliding_window / block_size) + 1))
        else:
            out.append(full)
    return out


def descriptors_per_request(
    shape: KVShape,
    prompt_tokens: int,
    block_size: int,
    tp: int = 1,
    cross_layer: bool = False,
    swa_trim: bool = SWA_TRIM,
) -> int:
    """Descriptors one request's transfer holds on one rank, as vLLM's NixlConnector lays them out."""
    del tp  # every rank moves the same number of descriptors; only their length depends on tp
    if cross_layer:
        return blocks_for_prompt(prompt_tokens, block_size)
    return sum(blocks_per_layer(shape, prompt_tokens, block_size, swa_trim))


def request_bytes(shape: KVShape, prompt_tokens: int, block_size: int, tp: int = 1, swa_trim: bool = SWA_TRIM) -> int:
    """Bytes one rank moves for one request (whole blocks, so a partly filled last block counts in full)."""
    return sum(blocks_per_layer(shape, prompt_tokens, block_size, swa_trim)) * block_len(shape, block_size, tp)


@dataclass(frozen=True)
class KVBudget:
    """What moving one request's KV cache costs, predicted from a measured transfer rate."""

    shape: str
    prompt_tokens: int
    block_size: int
    tp: int
    blocks: int
    descriptors_per_rank: int
    descriptor_bytes: int
    bytes_per_rank: int
    bytes_total: int
    measured_gbps: float
    per_request_latency_s: float
    per_descriptor_s: float
    transfer_s: float
    descriptor_s: float
    added_ttft_s: float


def kv_budget(
    shape: KVShape | str,
    prompt_tokens: int,
    measured_gbps: float,
    per_request_latency_s: float,
    block_size: int = 16,
    tp: int = 1,
    cross_layer: bool = False,
    swa_trim: bool = SWA_TRIM,
    per_descriptor_s: float = 0.0,
) -> KVBudget:
    """Bytes moved for one prompt and the TTFT the transfer adds.

    Ranks move their shares in parallel over their own links, so the added time is the fixed per-request
    latency, plus one rank's bytes at ``measured_gbps`` (GB/s, 1e9 bytes), plus ``per_descriptor_s`` for each
    descriptor NIXL cannot merge (blocks not adjacent on both sides; about 3.8 us each over cuda_ipc on H200,
    see docs/transfer.md). Pass 0 for a request whose blocks are adjacent.
    """
    if isinstance(shape, str):
        shape = get_shape(shape)
    if measured_gbps <= 0:
        raise ValueError("measured_gbps must be > 0")
    if cross_layer:  # a cross-layer block holds every layer: nothing is trimmed for the sliding window
        swa_trim = False
    per_rank = request_bytes(shape, prompt_tokens, block_size, tp, swa_trim)
    transfer_s = per_rank / (measured_gbps * 1e9)
    descs = descriptors_per_request(shape, prompt_tokens, block_size, tp, cross_layer, swa_trim)
    descriptor_s = descs * per_descriptor_s
    return KVBudget(
        shape=shape.name,
        prompt_tokens=prompt_tokens,
        block_size=block_size,
        tp=tp,
        blocks=blocks_for_prompt(prompt_tokens, block_size),
        descriptors_per_rank=descs,
        descriptor_bytes=block_len(shape, block_size, tp) * (shape.num_layers if cross_layer else 1),
        bytes_per_rank=per_rank,
        bytes_total=per_rank * tp,
        measured_gbps=measured_gbps,
        per_request_latency_s=per_request_latency_s,
        per_descriptor_s=per_descriptor_s,
        transfer_s=transfer_s,
        descriptor_s=descriptor_s,
        added_ttft_s=per_request_latency_s + transfer_s + descriptor_s,
    )
