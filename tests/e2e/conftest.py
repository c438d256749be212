"""The local cluster, brought up once for the whole end-to-end run and destroyed at its end.

The modules share that one cluster, so their order matters (the overlays switch it to another inventory): it is
stated here, in ORDER, not left to file names. The session's teardown is part of the cluster fixture: `pdinfra
down` must leave no process, mount, namespace, bridge or cgroup behind (an error of the run if it does)."""

from __future__ import annotations

import os
import subprocess

import pytest
from e2e_helpers import BIN, INV, LOG_DIR, run

from pdinfra import testhosts
from pdinfra.cluster.inventory import load

# Modules in the order they run on the one cluster: the base inventory's modules first, then those that converge an
# overlay onto it (the KV reuse tier, then Mooncake PD, which leaves every instance on another connector).
# The API suite's burst and long streams push ITL over the SLO for minutes: it runs after the monitoring modules,
# whose "nothing firing on a healthy cluster" and advice read the last minutes of Prometheus's data.
ORDER = (
    "test_local_cluster.py",
    "test_monitoring.py",
    "test_monitoring_advise.py",
    "test_plan_loop.py",
    "test_runbooks.py",
    "test_api_conformance.py",
    "test_reliability.py",
    "test_reuse_tier.py",
    "test_switch_to_mooncake_pd.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep every other test where it is; sort the end-to-end ones by ORDER (a module not listed fails the run)."""
    e2e = [i for i in items if i.path.parent.name == "e2e"]
    unknown = sorted({i.path.name for i in e2e} - set(ORDER))
    if unknown:
        raise pytest.UsageError(f"tests/e2e/conftest.py ORDER does not place {', '.join(unknown)}")
    slots = [n for n, i in enumerate(items) if i in e2e]
    ordered = sorted(e2e, key=lambda i: ORDER.index(i.path.name))  # stable: a module keeps its own order
    for n, item in zip(slots, ordered, strict=True):
        items[n] = item


@pytest.fixture(scope="session")
def cluster():
    """`pdinfra up` from whatever state, once for the session; destroyed at the end, leaving nothing behind.

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
    down = run([str(BIN / "pdinfra"), "down"], log="90-down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert testhosts.leftovers(hosts) == [], "pdinfra down left these behind"
