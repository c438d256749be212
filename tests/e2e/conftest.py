"""The local cluster, brought up once for every end-to-end module (test_local_cluster, test_reliability) and
destroyed at the end (test_zz_teardown checks nothing is left behind)."""

from __future__ import annotations

import os
import subprocess

import pytest
from e2e_helpers import BIN, INV, LOG_DIR, run

from pdinfra import testhosts
from pdinfra.cluster.inventory import load


@pytest.fixture(scope="session")
def cluster():
    """`pdinfra up` from whatever state, once for the session; destroyed at the end.

    PDINFRA_E2E_REUSE=1 (development only): use the running cluster as it is and leave it running."""
    hosts = testhosts.from_inventory(load(INV))
    if os.environ.get("PDINFRA_E2E_REUSE") == "1":
        up = LOG_DIR / "01-up.log"
        text = up.read_text() if up.exists() else ""
        yield {"hosts": hosts, "up": subprocess.CompletedProcess([], 0, text, "")}
        return
    run([str(BIN / "pdinfra"), "down"], log="00-down-before")
    res = run([str(BIN / "pdinfra"), "up"], log="01-up", timeout=2400)
    if res.returncode != 0:
        pytest.fail(
            f"pdinfra up failed ({res.returncode}); see {LOG_DIR}/01-up.log:\n{(res.stdout + res.stderr)[-5000:]}"
        )
    yield {"hosts": hosts, "up": res}
    run([str(BIN / "pdinfra"), "down"], log="99-down-after")
