"""The local cluster, brought up once for the whole end-to-end run and destroyed at its end.

The modules share that one cluster, so their order matters (the overlays switch it to another inventory): it is
stated here, in ORDER, not left to file names. The session's teardown is part of the cluster fixture: `pdinfra
down` must leave no process, mount, namespace, bridge or cgroup behind (an error of the run if it does)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest
from e2e_helpers import BIN, INV, LOG_DIR, REPO, ansible_env, run

from pdinfra import testhosts
from pdinfra.cluster.inventory import load
from pdinfra.testhosts import nspawn

# Modules in the order they run on the one cluster: the base inventory's modules first, then those that converge
# another inventory onto it (the SLO loop's change, the KV reuse tier, then Mooncake PD, which leaves every instance
# on another connector). The API suite's burst and long streams push ITL over the SLO for minutes: it runs after
# the monitoring module, whose "nothing firing on a healthy cluster" reads the last minutes of Prometheus's data.
# The SLO loop reads only the window of its own load; it leaves the cluster in the layout it chose, which the KV
# reuse tier's `pdinfra up` converges over (nothing restored in between).
ORDER = (
    "test_local_cluster.py",
    "test_monitoring.py",
    "test_runbooks.py",
    "test_api_conformance.py",
    "test_reliability.py",
    "test_slo_loop.py",
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


# The first `pdinfra up` runs in the background from the end of collection, beside the slow unit tier that comes
# before the end-to-end modules (./pd test runs both in one session): on the 2-core CI machine both are mostly one
# process each, so the up's minutes overlap theirs. The cluster fixture waits for it.
_BACKGROUND: dict = {}
UP_TIMEOUT_S = 2400


def _background_wanted(session: pytest.Session) -> bool:
    return (
        os.environ.get("PDINFRA_E2E_REUSE") != "1"
        and not session.config.option.collectonly
        and any(i.path.parent.name == "e2e" for i in session.items)
        and any(i.path.parent.name != "e2e" for i in session.items)  # nothing to overlap with otherwise
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _background_wanted(session):
        return
    run([str(BIN / "pdinfra"), "down"], log="00-down-before")
    nspawn.api_key_file()  # before the up: the session's autouse fixture would create it at the same time
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    out, err = open(LOG_DIR / "01-up.stdout", "w+"), open(LOG_DIR / "01-up.stderr", "w+")  # noqa: SIM115
    env = ansible_env(ANSIBLE_NOCOLOR="1", NO_COLOR="1", COLUMNS="200")
    proc = subprocess.Popen([str(BIN / "pdinfra"), "up"], cwd=REPO, env=env, stdout=out, stderr=err, text=True)
    _BACKGROUND.update(proc=proc, out=out, err=err, started=time.monotonic())


def _wait_background(stop: bool = False) -> subprocess.CompletedProcess | None:
    """The background up's result (it is waited for once; ``stop`` ends it first), or None when there is none."""
    proc = _BACKGROUND.pop("proc", None)
    if proc is None:
        return None
    if stop:  # the up and every process under it (ansible-runner starts Ansible in a session of its own)
        import psutil

        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.terminate()
            psutil.wait_procs(tree, timeout=20)
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.kill()
    left = UP_TIMEOUT_S - (time.monotonic() - _BACKGROUND["started"])
    try:
        rc = proc.wait(timeout=30 if stop else max(1.0, left))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    texts = []
    for f in (_BACKGROUND.pop("out"), _BACKGROUND.pop("err")):
        f.seek(0)
        texts.append(f.read())
        f.close()
    res = subprocess.CompletedProcess(proc.args, rc, texts[0], texts[1])
    (LOG_DIR / "01-up.log").write_text(f"$ {' '.join(proc.args)}\n{res.stdout}\n--- stderr ---\n{res.stderr}")
    return res


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A background up that no test waited for (the run stopped before the end-to-end modules, e.g. -x on a unit
    failure): stop it, and take the test hosts down again."""
    if _wait_background(stop=True) is not None:
        run([str(BIN / "pdinfra"), "down"], log="90-down")


@pytest.fixture(scope="session")
def cluster():
    """`pdinfra up` from whatever state, once for the session (started in the background at the end of collection
    when slow unit tests run first); destroyed at the end, leaving nothing behind.
    PDINFRA_E2E_REUSE=1 (development only): use the running cluster as it is and leave it running."""
    hosts = testhosts.from_inventory(load(INV))
    if os.environ.get("PDINFRA_E2E_REUSE") == "1":
        up = LOG_DIR / "01-up.log"
        text = up.read_text() if up.exists() else ""
        yield {"hosts": hosts, "up": subprocess.CompletedProcess([], 0, text, "")}
        return
    res = _wait_background()
    if res is None:
        run([str(BIN / "pdinfra"), "down"], log="00-down-before")
        res = run([str(BIN / "pdinfra"), "up"], log="01-up", timeout=UP_TIMEOUT_S)
    if res.returncode != 0:
        pytest.fail(
            f"pdinfra up failed ({res.returncode}); see {LOG_DIR}/01-up.log:\n{(res.stdout + res.stderr)[-5000:]}"
        )
    yield {"hosts": hosts, "up": res}
    down = run([str(BIN / "pdinfra"), "down"], log="90-down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert testhosts.leftovers(hosts) == [], "pdinfra down left these behind"
