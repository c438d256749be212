"""A reference forward pass of a Llama checkpoint in numpy (Hugging Face layout, rotate-half RoPE, no GQA), for
the tests of the embedded tiny model: what vLLM computes, in float32, with a hook on the KV cache."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

KVHook = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    t, hd = x.shape[0], x.shape[-1]
    f = np.outer(np.arange(t), 1.0 / theta ** (np.arange(0, hd, 2) / hd))
    cos, sin = (np.concatenate([g(f)] * 2, -1)[:, None, :] for g in (np.cos, np.sin))
    rot = np.concatenate([-x[..., hd // 2 :], x[..., : hd // 2]], -1)
    return x * cos + rot * sin


def logits(w: dict[str, np.ndarray], cfg: dict, ids: list[int], kv_hook: KVHook | None = None) -> np.ndarray:
    """The last position's logits; ``kv_hook(layer, k, v)`` may replace the cache (k after RoPE, [T, heads, hd])."""
    nh, hd, eps = cfg["num_attention_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][ids].astype(np.float32)
    t = len(ids)
    mask = np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = ((h @ w[p + f"self_attn.{n}_proj.weight"].T).reshape(t, nh, hd) for n in ("q", "k", "v"))
        q, k = _rope(q, cfg["rope_theta"]), _rope(k, cfg["rope_theta"])
        if kv_hook is not None:
            k, v = kv_hook(i, k, v)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", a, v).reshape(t, nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    return (_rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T)[-1]


def greedy(w: dict, cfg: dict, ids: list[int], n: int, kv_hook: KVHook | None = None) -> list[int]:
    """``n`` greedy tokens; the hook alters the prompt's part of the cache at every step (as a decode instance
    that read wrong prompt KV once keeps it)."""
    ids, out, prompt = list(ids), [], len(ids)

    def on_prompt(i: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        kp, vp = kv_hook(i, k[:prompt], v[:prompt])  # type: ignore[misc]
        return np.concatenate([kp, k[prompt:]]), np.concatenate([vp, v[prompt:]])

    for _ in range(n):
        out.append(int(logits(w, cfg, ids, on_prompt if kv_hook else None).argmax()))
        ids.append(out[-1])
    return out
