"""The embedded tiny model's files: its own tokenizer and the chat template that /v1/chat/completions needs."""

from __future__ import annotations

import json

from jinja2.sandbox import ImmutableSandboxedEnvironment
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
