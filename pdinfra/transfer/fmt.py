"""Sizes, latencies and efficiencies as people read them."""

from __future__ import annotations

import math
import re

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


# --------------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------------


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def parse_size(text: str) -> int:
    """'64KiB', '1M', '1GiB', '4096' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGkmg]?)(?:i?[Bb])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    mult = {"": 1, "K": KIB, "M": MIB, "G": GIB}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


def fmt_latency(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_eff(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
