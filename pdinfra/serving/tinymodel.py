"""A tiny Llama-shaped model for the local CPU profile.

vLLM serves it with ``--load-format dummy``: only the config and the tokenizer are real. The
tokenizer is a byte-level BPE trained here with the ``tokenizers`` library on a fixed corpus,
so nothing is downloaded from a model hub. Deterministic: the same inputs give the same files.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

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


def _fingerprint() -> str:
    blob = json.dumps([CONFIG, VOCAB_SIZE, SPECIALS, corpus(), CHAT_TEMPLATE], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build(dest: Path) -> Path:
    """Write config.json, tokenizer files and generation_config.json into ``dest``."""
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
