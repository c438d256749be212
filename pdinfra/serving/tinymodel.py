"""A tiny Llama-shaped model for the local CPU profile, whose answer depends on its whole prompt.

Everything is made here, so nothing is downloaded from a model hub, and the same inputs give the same files:

- the tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a fixed corpus;
- the weights are seeded Gaussians written as ``model.safetensors`` (vLLM loads them like any checkpoint). They
  are scaled so that attention is sharp and its output outweighs the last token's embedding: the greedy
  continuation is a function of the whole context, and K/V blocks that are corrupted, shifted or swapped change
  it. vLLM's ``--load-format dummy`` (tiny uniform values) made the output a function of the last prompt token
  alone, so no check could see a wrong KV block.

What it can show: that the KV a decode instance reads is the KV its prompt produces (same text as recomputing
it; tests/unit/test_tinymodel.py measures the sensitivity on an emulation of the forward pass). What it cannot:
anything about quality, numerics of real checkpoints, or GPU kernels; its text is random tokens.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from pdinfra import paths

NAME = "pdinfra-tiny-llama"
# Layer geometry; pdinfra.cluster.kvshape keeps the same numbers for the KV-transfer budget.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
VOCAB_SIZE = 4096
SPECIALS = ["<unk>", "<s>", "</s>"]
# The tokenizer is ours, so its chat template is too: plain "Role: text" turns (no new special tokens, so the
# vocabulary and the KV geometry stay as they are), an assistant turn closed by </s>, and the generation prompt
# "Assistant:". vLLM's /v1/chat/completions refuses a tokenizer without one ("default chat template is no longer
# allowed"). List-of-parts content (the OpenAI format) is joined from its text parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join(' ') %}{% endif %}"
    "{{ message['role'] | capitalize }}: {{ text }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

_TOPICS = [
    "prefill", "decode", "KV cache", "NIXL", "UCX", "NVLink", "NVSwitch", "RoCEv2", "PCIe", "GPU",
    "router", "vLLM", "token", "latency", "throughput", "bandwidth", "memory", "request", "batch", "model",
]  # fmt: skip
_VERBS = ["moves", "reads", "writes", "serves", "measures", "routes", "caches", "checks", "schedules", "streams"]
_OBJECTS = [
    "the first token", "every block", "a long prompt", "the decode instance", "the prefill instance",
    "the physical link", "one request", "many small descriptors", "the copy engine", "the fabric",
]  # fmt: skip


def corpus() -> list[str]:
    """A fixed, generated English corpus (no download)."""
    lines = []
    for i, t in enumerate(_TOPICS):
        for j, v in enumerate(_VERBS):
            o = _OBJECTS[(i * 7 + j * 3) % len(_OBJECTS)]
            lines.append(f"The {t} {v} {o} in {i + j + 1} ms, and the operator checks it twice.")
            lines.append(f"Why does {t.lower()} {v[:-1]} {o}? Because {i * j} tokens wait for it.")
    lines += [
        "The quick brown fox jumps over the lazy dog.",
        "Hello, world! This is a tiny model that answers with random words.",
        "Prefill and decode run on different hosts; the key-value cache crosses the network.",
        "0 1 2 3 4 5 6 7 8 9 10 100 1000 2026 GB/s MB/s us ms s",
    ]
    return lines


# The weights' seed and scales (standard deviations relative to 1/sqrt(fan-in)). Query and key at 2.5 make the
# attention scores' spread about 6 (sharp, position-dependent attention through RoPE); the output projection at
# 2.0 lets what attention reads outweigh the residual. Chosen on the emulation: with these, 0 of 30 prompt pairs
# that share only their last token gave the same answer, and reversing, shifting or replacing the prompt's KV
# blocks changed the answer in 30 of 30 prompts (dummy weights: 200 of 200 unchanged).
WEIGHT_SEED = 20261206
QK_SCALE = 2.5
OUT_SCALE = 2.0


def weights(config: dict, vocab_size: int, seed: int = WEIGHT_SEED) -> dict[str, Any]:
    """The checkpoint's tensors (HF Llama names, float32 numpy arrays; served as ``pdinfra_dtype``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, inter = config["hidden_size"], config["intermediate_size"]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]

    def normal(rows: int, cols: int, std: float):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(std)).astype(np.float32)

    ones = np.ones(h, dtype=np.float32)
    out = {"model.embed_tokens.weight": normal(vocab_size, h, 1.0), "model.norm.weight": ones}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "input_layernorm.weight": ones,
            p + "post_attention_layernorm.weight": ones,
            p + "self_attn.q_proj.weight": normal(q_dim, h, QK_SCALE / h**0.5),
            p + "self_attn.k_proj.weight": normal(kv_dim, h, QK_SCALE / h**0.5),
            p + "self_attn.v_proj.weight": normal(kv_dim, h, 1 / h**0.5),
            p + "self_attn.o_proj.weight": normal(h, q_dim, OUT_SCALE / q_dim**0.5),
            p + "mlp.gate_proj.weight": normal(inter, h, 1 / h**0.5),
            p + "mlp.up_proj.weight": normal(inter, h, 1 / h**0.5),
            p + "mlp.down_proj.weight": normal(h, inter, 1 / inter**0.5),
        }
    out["lm_head.weight"] = normal(vocab_size, h, 1 / h**0.5)
    return {k: v.copy() for k, v in out.items()}  # the norms' shared array: one buffer per tensor


def _fingerprint() -> str:
    blob = json.dumps(
        [CONFIG, VOCAB_SIZE, SPECIALS, corpus(), CHAT_TEMPLATE, WEIGHT_SEED, QK_SCALE, OUT_SCALE], sort_keys=True
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build(dest: Path) -> Path:
    """Write config.json, the tokenizer files, generation_config.json and model.safetensors into ``dest``."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus() * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    config = dict(CONFIG, vocab_size=tok.get_vocab_size())
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": CONFIG["max_position_embeddings"],
                "add_bos_token": True,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    (dest / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n"
    )
    (dest / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2) + "\n"
    )
    # float16 on disk (half the bytes to push; vLLM casts to pdinfra_dtype on load).
    tensors = {k: v.astype("float16") for k, v in weights(config, tok.get_vocab_size()).items()}
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def ensure(cache: Path | None = None) -> Path:
    """The tiny model directory on the controller, built once per content fingerprint."""
    base = cache or paths.cache_dir()
    dest = base / f"model-{NAME}-{_fingerprint()}"
    if not (dest / "config.json").exists():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        tmp.rename(dest)
    return dest
