"""The target side of a NIXL session on another node (``pdinfra validate --transfer --peer HOST``).

The parent starts ``pdinfra transfer-target`` on the peer through a command (SSH by default, with the host key
checked as ssh checks it) and talks to it over that command's stdin/stdout with the same messages the local
target gets through a multiprocessing pipe (worker.target_main). Each message is one line ``pdinfra-xfer/1 <JSON>``
(bytes as base64, tuples and the endpoint tagged); lines without the prefix (a login banner, a profile's echo)
are skipped, and nothing read from the peer is ever unpickled or evaluated. Nothing else listens: NIXL's own data
path is whatever UCX picks between the two nodes (tcp without RDMA NICs, rc_mlx5 with them).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Any

from pdinfra.transfer.plan import Endpoint
from pdinfra.transfer.worker import target_main

PREFIX = b"pdinfra-xfer/1 "


def encode(obj: Any) -> Any:
    """Messages to JSON: bytes, tuples and endpoints tagged so that decode() gives them back."""
    if isinstance(obj, bytes):
        return {"__b": base64.b64encode(obj).decode()}
    if isinstance(obj, Endpoint):
        return {"__ep": dataclasses.asdict(obj)}
    if isinstance(obj, tuple):
        return {"__t": [encode(x) for x in obj]}
    if isinstance(obj, list):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot send a {type(obj).__name__} to the peer")


def decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [decode(x) for x in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__b"}:
            return base64.b64decode(obj["__b"])
        if set(obj) == {"__t"}:
            return tuple(decode(x) for x in obj["__t"])
        if set(obj) == {"__ep"}:
            return Endpoint(**{k: v for k, v in obj["__ep"].items() if k in ("mem", "gpu", "pinned")})
        return {k: decode(v) for k, v in obj.items()}
    return obj


class LineConn:
    """A multiprocessing-Connection look-alike over two file descriptors (send, recv, poll)."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd, self._buf = rfd, wfd, b""

    def send(self, obj: Any) -> None:
        data = PREFIX + json.dumps(encode(obj)).encode() + b"\n"
        while data:
            data = data[os.write(self.wfd, data) :]

    def _fill(self, timeout: float | None) -> bool:
        ready, _, _ = select.select([self.rfd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.rfd, 1 << 20)
        if not chunk:
            raise EOFError("the peer closed the channel")
        self._buf += chunk
        return True

    def _skip_noise(self) -> None:
        """Drop complete lines that are not protocol messages (banners, echoes from the login shell)."""
        while b"\n" in self._buf and not self._buf.startswith(PREFIX):
            self._buf = self._buf.partition(b"\n")[2]

    def poll(self, timeout: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        self._skip_noise()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._fill(left):
                break
            self._skip_noise()
        return b"\n" in self._buf

    def recv(self) -> Any:
        self._skip_noise()
        while b"\n" not in self._buf:
            self._fill(None)
            self._skip_noise()
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return decode(json.loads(line[len(PREFIX) :]))
        except (ValueError, TypeError) as exc:
            raise EOFError(f"unreadable message from the peer: {exc}") from None


class RemoteTarget:
    """The peer command as a process the session can wait for, terminate and kill like a local child."""

    def __init__(self, argv: list[str], log_path: str) -> None:
        self._err = open(log_path, "wb")  # noqa: SIM115 - closed in join()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.conn = LineConn(self.proc.stdout.fileno(), self.proc.stdin.fileno())
        self.pid = self.proc.pid

    def start(self) -> None:  # already running
        return None

    def is_alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.proc.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        self._err.close()

    def terminate(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        self.proc.kill()


def serve() -> None:
    """Entry on the peer: ``pdinfra transfer-target``. Reads ("start", env, endpoint, span, cfg) and then runs
    the ordinary target loop with this channel; its NIXL/UCX output goes to a log file on the peer."""
    conn = LineConn(os.dup(0), os.dup(1))
    msg = conn.recv()
    if not msg or msg[0] != "start":
        conn.send(("error", f"expected a start message, got {msg!r:.80}"))
        return
    _, env, endpoint, span, cfg = msg
    with tempfile.NamedTemporaryFile(prefix="pdinfra-peer-target-", suffix=".log", delete=False) as fh:
        log = fh.name
    target_main(conn, log, env, endpoint, span, cfg)


if __name__ == "__main__":
    serve()
    sys.exit(0)
