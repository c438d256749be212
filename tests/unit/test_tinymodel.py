"""The embedded tiny model's files: its own tokenizer, the chat template that /v1/chat/completions needs, and
weights whose greedy answer depends on the whole prompt (checked on tests/unit/llama_numpy.py's forward pass)."""

from __future__ import annotations

import json

import llama_numpy
import numpy as np
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from pdinfra.serving import tinymodel


def test_the_tokenizer_config_carries_a_chat_template_that_renders_turns(tmp_path):
    dest = tinymodel.build(tmp_path / "m")
    config = json.loads((dest / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tinymodel.CHAT_TEMPLATE
    # As transformers renders it (apply_chat_template: a sandbox with trim_blocks and lstrip_blocks).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "Why?"},
    ]
    text = env.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )
    assert text == "<s>System: Be brief.\nUser: Hello there\nAssistant: Hi</s>\nUser: Why?\nAssistant:"
    # vLLM tokenizes a rendered chat without adding special tokens: the template's own <s> is the only BOS.
    ids = Tokenizer.from_file(str(dest / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert ids[0] == 1 and ids.count(1) == 1 and 2 in ids


def test_a_changed_template_is_a_new_model_directory(monkeypatch, tmp_path):
    first = tinymodel._fingerprint()
    monkeypatch.setattr(tinymodel, "CHAT_TEMPLATE", tinymodel.CHAT_TEMPLATE + " ")
    assert tinymodel._fingerprint() != first


# ----------------------------------------------------------------------------- its answer reads the whole prompt
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    dest = tinymodel.build(tmp_path_factory.mktemp("tiny") / "m")
    w = {k: v.astype(np.float32) for k, v in load_file(str(dest / "model.safetensors")).items()}
    return w, json.loads((dest / "config.json").read_text()), Tokenizer.from_file(str(dest / "tokenizer.json"))


def test_the_weights_are_a_checkpoint_vllm_loads_and_the_same_every_build(model, tmp_path):
    w, cfg, _ = model
    assert w["model.embed_tokens.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert w["lm_head.weight"].shape == (cfg["vocab_size"], cfg["hidden_size"])
    assert len(w) == 3 + 9 * cfg["num_hidden_layers"]
    again = tinymodel.build(tmp_path / "again")
    first = tinymodel.build(tmp_path / "first")
    assert (again / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()


def test_two_prompts_sharing_their_last_token_get_different_answers(model):
    """vLLM's dummy weights answered both with the same tokens (the answer was a function of the last token)."""
    w, cfg, tok = model
    a, b = ("The quick brown fox jumps over the lazy dog", "Completely unrelated words about weather and the dog")
    ids_a, ids_b = tok.encode(a).ids, tok.encode(b).ids
    assert ids_a[-1] == ids_b[-1]
    assert llama_numpy.greedy(w, cfg, ids_a, 4) != llama_numpy.greedy(w, cfg, ids_b, 4)


@pytest.mark.parametrize("fault", ["swap", "shift", "garbage"])
def test_misplaced_or_corrupted_kv_blocks_change_the_answer(model, fault):
    """What the e2e KV-corruption test relies on, on a reference forward pass: blocks of 32 tokens reversed,
    rotated by one, or replaced by noise change the greedy answer of every one of 6 prompts of 3 to 6 blocks."""
    w, cfg, tok = model
    rng = np.random.default_rng(7)
    lines = tinymodel.corpus()
    block = 32
    changed = 0
    for n in range(6):
        ids = tok.encode(" ".join(rng.choice(lines, 12))).ids[: (3 + n % 4) * block + 5]
        nb = len(ids) // block
        assert 3 <= nb <= 6, len(ids)
        order = np.arange(nb * block).reshape(nb, block)
        order = {"swap": order[::-1], "shift": np.roll(order, -1, 0), "garbage": order}[fault].ravel()

        def hook(_layer, k, v, order=order, n_=nb * block):
            k, v = k.copy(), v.copy()
            if fault == "garbage":
                k[:n_], v[:n_] = rng.standard_normal(k[:n_].shape), rng.standard_normal(v[:n_].shape)
            else:
                k[:n_], v[:n_] = k[order], v[order]
            return k, v

        changed += llama_numpy.greedy(w, cfg, ids, 4, hook) != llama_numpy.greedy(w, cfg, ids, 4)
    assert changed == 6
