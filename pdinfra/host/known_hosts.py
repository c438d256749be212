"""First contact with a host's SSH key (``pdinfra inventory trust``): scan each address with ``ssh-keyscan``, print
every key's fingerprint, and record the keys that are new in a known_hosts file. A key that differs from the one
already recorded for the address is never recorded over it: that is the attack (or the reinstall) host key checking
exists to stop, and the operator decides (``ssh-keygen -R <address>``) after checking the fingerprint out of band.
Ansible then verifies every host against that file (ansible.cfg keeps ``host_key_checking``; docs/security.md)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

KEY_TYPES = "ed25519,ecdsa,rsa"


@dataclass(frozen=True)
class Scanned:
    host: str
    address: str
    state: str  # known | new | changed | unreachable
    fingerprints: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()  # the known_hosts lines scanned (what would be recorded)
    detail: str = ""


def _recorded(known_hosts: Path, address: str) -> set[tuple[str, str]]:
    """(key type, key) recorded for ``address`` (hashed entries included: ``ssh-keygen -F`` finds them)."""
    if not known_hosts.exists():
        return set()
    res = subprocess.run(["ssh-keygen", "-F", address, "-f", str(known_hosts)], capture_output=True, text=True)
    out = set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) < 3:
            continue
        out.add((parts[-2], parts[-1]))
    return out


def _fingerprint(line: str) -> str:
    res = subprocess.run(["ssh-keygen", "-lf", "-"], input=line + "\n", capture_output=True, text=True)
    return res.stdout.strip() or line


def scan(host: str, address: str, known_hosts: Path, port: int = 22, timeout_s: int = 5) -> Scanned:
    cmd = ["ssh-keyscan", "-T", str(timeout_s), "-t", KEY_TYPES, "-p", str(port), address]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s * 4 + 5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Scanned(host, address, "unreachable", detail=str(exc))
    lines = tuple(ln for ln in res.stdout.splitlines() if ln and not ln.startswith("#"))
    if not lines:
        return Scanned(host, address, "unreachable", detail=(res.stderr.strip() or "no key answered")[-300:])
    fps = tuple(_fingerprint(ln) for ln in lines)
    have = _recorded(known_hosts, address if port == 22 else f"[{address}]:{port}")
    got = {(ln.split()[1], ln.split()[2]) for ln in lines}
    have_types = {t for t, _ in have}
    if have and any(t in have_types and (t, k) not in have for t, k in got):
        return Scanned(host, address, "changed", fps, lines, "a recorded key of the same type differs")
    if got <= have:
        return Scanned(host, address, "known", fps, lines)
    return Scanned(host, address, "new", fps, lines)


def record(known_hosts: Path, scanned: list[Scanned]) -> int:
    """Append the new hosts' keys (never a changed one's); how many lines were written."""
    new = [ln for s in scanned if s.state == "new" for ln in s.lines]
    if not new:
        return 0
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with known_hosts.open("a", encoding="utf-8") as fh:
        fh.write("".join(ln + "\n" for ln in new))
    return len(new)
