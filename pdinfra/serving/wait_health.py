"""Startup watchdog of a vLLM unit: exit 0 once the instance answers /health, 1 after a deadline.

Run as the unit's ``ExecStartPost`` (roles/vllm_instance): systemd marks the unit started only when vLLM serves,
and a start that hangs (vLLM's API server alive without a working engine, seen after a SIGKILL when NIXL's UCX
backend failed to come up) fails the unit, which ``Restart=always`` then restarts.

    python -m pdinfra.serving.wait_health URL TIMEOUT_S
"""

from __future__ import annotations

import sys
import time
import urllib.request


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    url, timeout_s = args[0], float(args[1])
    if wait(url, timeout_s):
        return 0
    print(f"{url}: no /health after {timeout_s:.0f} s; failing the start so that systemd restarts it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
