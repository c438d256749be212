"""The model catalog: what the models pdinfra's examples and profiles name are, as their own files say.

A model fixes limits an inventory must keep: how long a sequence may be (its context length), which tensor-parallel
sizes split its heads, the geometry of its KV cache (the KV predictions of pdinfra.cluster.kvshape), and whether it
has a chat template (``/v1/chat/completions``, which ``pdinfra smoke`` and most clients use, answers 400 without
one). ``pdinfra check-config`` compares ``pdinfra_max_model_len``, each instance's ``tensor_parallel_size``,
``pdinfra_model.shape`` and the chat template with these figures (pdinfra.cluster.resolve_hosts).

Every figure is a field of the model's published ``config.json`` (``max_position_embeddings``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``), and the chat template is the
``chat_template`` of its ``tokenizer_config.json`` or its ``chat_template.jinja``; each entry names its files. A
model of source ``controller_dir`` is read from its own directory on the controller instead (:func:`from_dir`). A
model that is neither in the catalog nor readable is stated as unknown (``Model.catalog`` is None, and
``pdinfra check-config`` says so); its figures are never guessed from its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelFacts:
    """The limits a model sets, with where each comes from."""

    name: str  # the catalog's key (a kvshape preset's name where there is one)
    hf_id: str  # the model's id, or what it is when it has none
    context_length: int  # config.json max_position_embeddings (vLLM's limit for --max-model-len)
    num_layers: int  # num_hidden_layers
    num_attention_heads: int  # query heads: tensor parallelism must divide them
    num_kv_heads: int  # num_key_value_heads
    head_dim: int
    chat_template: bool  # tokenizer_config.json chat_template or chat_template.jinja
    shape: str | None  # the pdinfra.cluster.kvshape preset of the same geometry
    source: str  # the files the figures come from

    def describe(self) -> str:
        return (
            f"{self.hf_id}: context {self.context_length} tokens, {self.num_layers} layers, "
            f"{self.num_attention_heads} attention heads, {self.num_kv_heads} KV heads, head dim {self.head_dim}, "
            f"{'a' if self.chat_template else 'no'} chat template ({self.source})"
        )


_HF = "huggingface.co/{id}: config.json ({fields}); {chat}"
_CFG = "max_position_embeddings, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim"

CATALOG: dict[str, ModelFacts] = {
    m.name: m
    for m in (
        ModelFacts(
            "gpt-oss-120b", "openai/gpt-oss-120b", context_length=131072, num_layers=36, num_attention_heads=64,
            num_kv_heads=8, head_dim=64, chat_template=True, shape="gpt-oss-120b",
            source=_HF.format(id="openai/gpt-oss-120b", fields=_CFG, chat="chat_template.jinja (harmony)"),
        ),
        ModelFacts(
            "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", context_length=131072, num_layers=32,
            num_attention_heads=32, num_kv_heads=8, head_dim=128, chat_template=True, shape="llama-3.1-8b",
            source=_HF.format(id="meta-llama/Llama-3.1-8B-Instruct", fields=_CFG.replace(", head_dim",
                              "; head_dim = hidden_size 4096 / 32 heads"), chat="tokenizer_config.json chat_template"),
        ),
        ModelFacts(
            "llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", context_length=131072, num_layers=80,
            num_attention_heads=64, num_kv_heads=8, head_dim=128, chat_template=True, shape="llama-3.1-70b",
            source=_HF.format(id="meta-llama/Llama-3.1-70B-Instruct", fields=_CFG.replace(", head_dim",
                              "; head_dim = hidden_size 8192 / 64 heads"), chat="tokenizer_config.json chat_template"),
        ),
        ModelFacts(
            "tiny", "pdinfra-tiny-llama (pdinfra_model.source tiny)", context_length=4096, num_layers=2,
            num_attention_heads=4, num_kv_heads=4, head_dim=64, chat_template=True, shape="tiny",
            source="pdinfra.serving.tinymodel: CONFIG and CHAT_TEMPLATE, written to config.json and "
            "tokenizer_config.json by `pdinfra model tiny`",
        ),
    )
}  # fmt: skip


def by_hf_id(hf_id: str) -> ModelFacts | None:
    """The catalog's entry for a Hugging Face id (case-insensitive), or None."""
    key = hf_id.strip().lower()
    return next((m for m in CATALOG.values() if m.hf_id.lower() == key), None)


def by_shape(shape: str) -> ModelFacts | None:
    """The catalog's entry with this KV shape preset, or None."""
    key = shape.strip().lower()
    return next((m for m in CATALOG.values() if m.shape == key), None)


def context_of(config: dict[str, Any]) -> int | None:
    """The longest sequence a config allows, as vLLM derives it: the smallest of the length fields it reads (a
    multimodal model's ``text_config`` first), with YaRN's factor over its original length; None without any."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
            "model_max_length")  # fmt: skip
    found = [int(cfg[k]) for k in keys if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)]
    if not found:
        return None
    length = min(found)
    rope = cfg.get("rope_scaling")
    if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "yarn":
        original, factor = rope.get("original_max_position_embeddings"), rope.get("factor")
        if isinstance(original, int) and isinstance(factor, (int, float)):
            length = int(original * factor)
    return length


def from_dir(path: Path | str) -> ModelFacts | None:
    """The facts of a model directory on the controller (``config.json``, ``tokenizer_config.json``,
    ``chat_template.jinja``), or None when its config does not give them."""
    base = Path(path)
    try:
        config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    heads, layers = cfg.get("num_attention_heads"), cfg.get("num_hidden_layers")
    context = context_of(config)
    if not (isinstance(heads, int) and isinstance(layers, int) and heads > 0 and context):
        return None
    kv = cfg.get("num_key_value_heads") or heads
    hidden = cfg.get("hidden_size")
    head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) else 0)
    chat = (base / "chat_template.jinja").is_file() or (base / "chat_template.json").is_file()
    try:
        tok = json.loads((base / "tokenizer_config.json").read_text(encoding="utf-8"))
        chat = chat or bool(isinstance(tok, dict) and tok.get("chat_template"))
    except (OSError, ValueError):
        pass
    return ModelFacts(
        name=base.name,
        hf_id=str(base),
        context_length=context,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=int(kv),
        head_dim=int(head_dim),
        chat_template=chat,
        shape=None,
        source=f"{base}/config.json, tokenizer_config.json on the controller",
    )


def tp_problem(facts: ModelFacts, tp: int) -> str | None:
    """Why vLLM would refuse this tensor-parallel size for the model, or None (as kvshape.tp_problem)."""
    if facts.num_attention_heads % tp:
        return (
            f"tensor_parallel_size {tp} does not divide {facts.name}'s {facts.num_attention_heads} attention heads "
            "(vLLM refuses to start)"
        )
    if facts.num_kv_heads % tp and tp % facts.num_kv_heads:
        return (
            f"tensor_parallel_size {tp} neither divides nor is a multiple of {facts.name}'s {facts.num_kv_heads} "
            "KV heads"
        )
    return None
