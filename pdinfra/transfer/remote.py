"""The target side of a NIXL session on another node (``pdinfra validate --transfer --peer HOST``).

The parent starts ``pdinfra transfer-target`` on the peer through a command (SSH by default) and talks to it
over that command's stdin/stdout, one base64-encoded pickle per line, with the same messages the local
target gets through a multiprocessing pipe (worker._target_main). Both ends are pdinfra from the same
controller (the pd_runtime role pushes the source), so the pickled dataclasses match; nothing else listens:
NIXL's own data path is whatever UCX picks between the two nodes (tcp without RDMA NICs, rc_mlx5 with them).
"""

from __future__ import annotations

import base64
import os
import pickle
import select
import subprocess
import sys
import tempfile
import time
from typing import Any

from pdinfra.transfer.worker import _target_main


class LineConn:
    """A multiprocessing-Connection look-alike over two file descriptors (send, recv, poll)."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd, self._buf = rfd, wfd, b""

    def send(self, obj: Any) -> None:
        data = base64.b64encode(pickle.dumps(obj)) + b"\n"
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

    def poll(self, timeout: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._fill(left):
                return b"\n" in self._buf
        return True

    def recv(self) -> Any:
        while b"\n" not in self._buf:
            self._fill(None)
        line, _, self._buf = self._buf.partition(b"\n")
        return pickle.loads(base64.b64decode(line))  # noqa: S301 - our own process on the other end


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
    _target_main(conn, log, env, endpoint, span, cfg)


if __name__ == "__main__":
    serve()
    sys.exit(0)
