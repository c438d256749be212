"""Startup watchdog of a vLLM unit: exit 0 once the instance answers /health (and, with ``--warmup``, has served the
warm-up requests), 1 after a deadline.

Run as the unit's ``ExecStartPost`` (roles/vllm_instance): systemd marks the unit started only when vLLM serves,
and a start that hangs (vLLM's API server alive without a working engine, seen after a SIGKILL when NIXL's UCX
backend failed to come up) fails the unit, which ``Restart=always`` then restarts.

The warm-up sends the requests whose kernels vLLM compiles on first use (logprobs, then unseeded sampling at
temperature 1: torch inductor on CPU, Triton on GPU) before the unit counts as started, so that no user request pays
the compile (44 s on a 2-core CPU node) and a node that cannot compile fails its start, not a user's request. The
compiled kernels are cached across restarts (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR in the unit). The API key is
the instance's own (VLLM_API_KEY in its environment file).

    python -m pdinfra.serving.wait_health URL TIMEOUT_S [--warmup MODEL [WARMUP_TIMEOUT_S]]
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

# vLLM 0.32's torch.compile'd sampler kernels: batched_count_greater_than (logprobs ranks) and
# compiled_random_sample (temperature > 0 without a per-request seed; a seed takes the uncompiled path).
WARMUP_BODIES = (
    {"prompt": "Warm up the sampler", "max_tokens": 2, "temperature": 0, "logprobs": 2},
    {"prompt": "Warm up the sampler", "max_tokens": 2, "temperature": 1.0, "top_p": 0.9, "top_k": 5},
)


def wait(url: str, timeout_s: float, interval_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:  # refused, reset, timeout, HTTP errors: not ready yet
            pass
        if time.monotonic() + interval_s > deadline:
            return False
        time.sleep(interval_s)


def warm_up(url: str, model: str, timeout_s: float, api_key: str = "") -> str | None:
    """Send WARMUP_BODIES one after the other; None when each was answered, else why not."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    deadline = time.monotonic() + timeout_s
    for body in WARMUP_BODIES:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"warm-up not done after {timeout_s:.0f} s"
        req = urllib.request.Request(
            url.rstrip("/") + "/v1/completions",
            method="POST",
            headers=headers,
            data=json.dumps({"model": model, **body}).encode(),
        )
        try:
            with urllib.request.urlopen(req, timeout=left) as resp:
                out = json.loads(resp.read())
            if not out.get("choices"):
                return f"warm-up {body}: no choices in {str(out)[:200]}"
        except (OSError, ValueError) as exc:  # HTTPError, refused, timeout, bad JSON
            return f"warm-up {body}: {type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = __doc__.strip().splitlines()[-1].strip()
    if len(args) not in (2, 4, 5) or (len(args) > 2 and args[2] != "--warmup"):
        print(usage, file=sys.stderr)
        return 2
    url, timeout_s = args[0], float(args[1])
    t0 = time.monotonic()
    if not wait(url, timeout_s):
        print(
            f"{url}: no /health after {timeout_s:.0f} s; failing the start so that systemd restarts it", file=sys.stderr
        )
        return 1
    if len(args) > 2:
        model, warm_s = args[3], float(args[4]) if len(args) == 5 else 300.0
        t1 = time.monotonic()
        why = warm_up(url, model, warm_s, os.environ.get("VLLM_API_KEY", ""))
        if why:
            print(f"{url}: {why}; failing the start (see serving.toolchain: `pdinfra validate`)", file=sys.stderr)
            return 1
        print(f"{url}: healthy after {t1 - t0:.1f} s, warmed up (logprobs, sampling) in {time.monotonic() - t1:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
