"""Where pdinfra keeps its caches and state on the controller."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Downloads and builds that can be reused between runs (wheelhouse, base root filesystem)."""
    d = Path(os.environ.get("PDINFRA_CACHE_DIR", Path.home() / ".cache" / "pdinfra"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def state_dir() -> Path:
    """Live state of the local test hosts (overlay roots, pid files, SSH key)."""
    d = Path(os.environ.get("PDINFRA_STATE_DIR", "/var/lib/pdinfra"))
    d.mkdir(parents=True, exist_ok=True)
    return d
