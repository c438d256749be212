"""``pdinfra advise --apply``: the advice's :class:`~pdinfra.bench.advise.Change` -> inventory edits -> the
serving and monitoring plays -> the same advice measured again.

Order, so that nothing on a host is touched by a change that does not resolve:

1. plan the edits (:mod:`pdinfra.cluster.edit`: only the scalars change, the rest of each file is kept byte for
   byte) and resolve a copy of the inventory with them applied; problems end here, nothing written;
2. show the edits as a unified diff (the caller asks before going on) and save it beside the run log;
3. write the inventory, run ``site.yml --tags serving,monitoring`` (a retargeted instance's old unit is retired
   by vllm_instance, the router, firewall, probe and Prometheus targets follow the model);
4. wait one window of traffic and judge it again, so the before/after pair covers the same length of time.

:func:`apply_advice` runs the four steps; the CLI gives it the options and an :class:`ApplyConsole` that shows
the diff, asks, and prints the progress.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pdinfra import paths
from pdinfra.bench import advise
from pdinfra.bench.advise import Advice, Change
from pdinfra.cluster import edit
from pdinfra.cluster.checker import ClusterError
from pdinfra.cluster.inventory import InventoryError, load_cluster
from pdinfra.cluster.model import Cluster
from pdinfra.playbook import run_playbook

# The serving plays (pd_runtime rewrites the node's cluster.json, which the probe and validate read) and monitoring.
TAGS = "serving,monitoring"


class ApplyError(RuntimeError):
    pass


class ApplyFailed(ApplyError):
    """--apply stopped on a problem (the message says what was written, if anything): the command fails."""


@dataclass
class Plan:
    change: Change
    edits: list[edit.Edit]
    after: Cluster  # the cluster model the edited inventory resolves to

    def diff(self, root: Path | None = None) -> str:
        return "".join(e.diff(root) for e in self.edits)


def edits_for(source: Path, change: Change) -> list[edit.Edit]:
    if change.kind == "retarget":
        return [edit.retarget_instance(source, change.host, change.index, change.role, change.name)]
    if change.kind == "layout":
        return [edit.set_cluster_var(source, "pdinfra_layout", change.layout, comment="set by pdinfra advise --apply")]
    raise ApplyError(f"unknown change kind {change.kind!r}")


def _inventory_copy(source: Path, dest: Path) -> Path:
    """The inventory file (or directory) with its group_vars and host_vars, copied under dest."""
    inv_dir = source if source.is_dir() else source.parent
    for sub in ("group_vars", "host_vars"):
        if (inv_dir / sub).is_dir():
            shutil.copytree(inv_dir / sub, dest / sub)
    if source.is_dir():
        for p in source.iterdir():
            if p.is_file():
                shutil.copy2(p, dest / p.name)
        return dest
    shutil.copy2(source, dest / source.name)
    return dest / source.name


def plan(source: Path, advice: Advice) -> Plan:
    """The edits of the advice's change, checked by resolving the edited inventory in a scratch copy (raises
    ClusterError / InventoryError / EditError with the variable, host and file; nothing is written)."""
    source = Path(source)
    if advice.change is None:
        actions = [a for a in advice.actions if not a.startswith("size the cluster")]
        text = f"the advice ({advice.verdict}) has no change that --apply can make: " + (
            "; ".join(actions) or "nothing to change"
        )
        if advice.verdict == "add-capacity":  # more instances: the planner sizes and places them
            text += (
                f"; advise --apply does not add instances: `pdinfra plan -i {source} -p PROFILE.json "
                f"--from-prometheus {advice.prometheus or 'URL'} --apply` sizes the cluster for the load and "
                "adds them where the inventory has free GPUs or cores"
            )
        raise ApplyError(text)
    edits = edits_for(source, advice.change)
    return Plan(advice.change, edits, resolve_edited(source, edits))


def resolve_edited(source: Path, edits: list[edit.Edit]) -> Cluster:
    """The cluster model of the inventory with the edits applied, resolved in a scratch copy (raises ClusterError /
    InventoryError naming the variable, host and file; nothing is written to the inventory)."""
    inv_dir = source if source.is_dir() else source.parent
    with tempfile.TemporaryDirectory(prefix="pdinfra-apply-") as tmp:
        copy = _inventory_copy(source, Path(tmp))
        for e in edits:
            target = Path(tmp) / e.path.relative_to(inv_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(e.after, encoding="utf-8")
        return load_cluster(copy)


# Seconds ``advise --apply`` waits beyond one window before judging again: a few scrape intervals, so that the
# window starts after Prometheus saw the new instances' warm-up (advise.SETTLED).
SETTLE_MARGIN_S = 30


def window_seconds(window: str) -> int:
    m = re.fullmatch(r"(\d+)([smhd])", window)
    if not m:
        raise ApplyError(f"window {window!r} is not a Prometheus duration such as 10m")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


class Edits(Protocol):
    """What :func:`deploy` writes: the edits, and their diff relative to a directory."""

    edits: list[edit.Edit]

    def diff(self, root: Path | None = None) -> str: ...


def deploy(source: Path, p: Edits, log_dir: Path, progress: Callable[[str], None] | None = None) -> Path:
    """Write the inventory, run the serving and monitoring plays; the diff and the play's log are kept in
    log_dir. Returns the log. A failed play leaves the edited inventory in place (the fix is to re-run, or to
    revert with the saved diff: ``patch -R -p1 < change.diff`` in the inventory directory)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    source = Path(source)
    inv_dir = source if source.is_dir() else source.parent
    (log_dir / "change.diff").write_text(p.diff(inv_dir), encoding="utf-8")
    edit.write(p.edits)
    if progress:
        progress(f"inventory written ({', '.join(e.what for e in p.edits)}); running site.yml --tags {TAGS}")
    res = run_playbook(
        source, "site.yml", ["--tags", TAGS], log=log_dir / "deploy.log", timeout_s=3600, progress=progress
    )
    if res.rc != 0:
        tail = res.summary(3000)
        raise ApplyError(
            f"the serving play failed after the inventory was changed (log: {res.log}; the diff to "
            f"revert: {log_dir / 'change.diff'}):\n{tail}"
        )
    return res.log


def default_log_dir() -> Path:
    return paths.state_dir() / "advise" / time.strftime("%Y%m%d-%H%M%S")


def compare(before: Advice, after: Advice) -> list[tuple[str, str, str]]:
    """(quantity, before, after) rows: the same window length, the same queries, either side of the change."""

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1000:.0f} ms"

    return [
        ("deployment", before.shape, after.shape),
        ("verdict", before.verdict, after.verdict),
        ("requests/s completed", f"{before.requests_per_s:.2f}", f"{after.requests_per_s:.2f}"),
        ("client TTFT at the SLO's attainment level", ms(before.ttft_s), ms(after.ttft_s)),
        ("ITL P99", ms(before.itl_p99_s), ms(after.itl_p99_s)),
        ("SLO", before.slo, after.slo),
    ]


class ApplyConsole(Protocol):
    """What :func:`apply_advice` shows and asks on the way; the CLI prints it."""

    def change(self, plan: Plan, inv_dir: Path) -> None:
        """The planned change and its inventory diff (relative to inv_dir), before anything is written."""

    def confirm(self) -> bool:
        """Whether to write the inventory and deploy (not asked with ``yes``)."""

    def progress(self, message: str) -> None:
        """A step of the deploy: the inventory written, the play's progress lines."""

    def waiting(self, window: str, until: float) -> None:
        """Deployed; the advice is judged again over window of traffic, at wall-clock time until (epoch)."""

    def left(self, seconds: float) -> None:
        """Seconds still to wait (said every 30 s)."""


@dataclass
class Outcome:
    """How ``advise --apply`` ended. Not applied: ``reason`` says why (the advice has no change to make, or
    ``declined`` when the answer was no). Applied: the diff, the advice judged again, where the records are."""

    before: Advice
    applied: bool
    reason: str = ""
    declined: bool = False
    diff: str = ""
    after: Advice | None = None
    log_dir: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        if not self.applied:
            return {"before": self.before.to_dict(), "applied": False}
        assert self.after is not None
        return {
            "before": self.before.to_dict(),
            "applied": True,
            "diff": self.diff,
            "after": self.after.to_dict(),
            "log_dir": str(self.log_dir),
        }


def apply_advice(
    source: Path,
    before: Advice,
    window: str,
    console: ApplyConsole,
    *,
    prometheus: str | None = None,
    timeout: float = 10.0,
    yes: bool = False,
    log_dir: Path | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """``advise --apply`` on the inventory source after the advice before (judged over window): plan the
    change, show it, ask (unless yes), write and deploy it, wait one window of traffic on the new deployment
    and judge again with the same Prometheus and timeout. The diff, the play's log and both advices
    (``advice-before.json``, ``advice-after.json``) go to log_dir (default: :func:`default_log_dir`).

    Raises :class:`ApplyFailed` (an edit that cannot be made, an edited inventory that does not resolve, a
    failed play) and :class:`~pdinfra.bench.advise.AdviseError` (Prometheus, after the change)."""
    source = Path(source)
    try:
        p = plan(source, before)
    except ApplyError as exc:
        return Outcome(before, applied=False, reason=str(exc))
    except (edit.EditError, InventoryError) as exc:
        raise ApplyFailed(f"--apply: {exc}") from exc
    except ClusterError as exc:
        raise ApplyFailed(f"--apply: the edited inventory does not resolve; nothing written:\n{exc}") from exc
    inv_dir = source if source.is_dir() else source.parent
    console.change(p, inv_dir)
    if not yes and not console.confirm():
        return Outcome(before, applied=False, reason="declined: nothing written", declined=True)
    logs = log_dir or default_log_dir()
    try:
        deploy(source, p, logs, progress=console.progress)
    except (ApplyError, edit.EditError) as exc:
        raise ApplyFailed(str(exc)) from exc
    # One window of traffic, plus a margin of scrapes so that Prometheus has seen every new instance's warm-up
    # finish before the window begins (advise counts settled instances only: advise.SETTLED).
    wait_s = window_seconds(window) + SETTLE_MARGIN_S
    console.waiting(window, time.time() + wait_s)
    t_end = clock() + wait_s
    while (left := t_end - clock()) > 0:
        sleep(min(30.0, left))
        if (left := t_end - clock()) > 1:
            console.left(left)
    after = advise.run(p.after, window, prometheus, timeout)
    (logs / "advice-before.json").write_text(json.dumps(before.to_dict(), indent=2) + "\n")
    (logs / "advice-after.json").write_text(json.dumps(after.to_dict(), indent=2) + "\n")
    return Outcome(before, applied=True, diff=p.diff(inv_dir), after=after, log_dir=logs)
