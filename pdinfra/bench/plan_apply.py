"""``pdinfra plan --apply``: the chosen configuration -> inventory edits -> the serving and monitoring plays ->
``vllm bench serve`` at the planned load -> predicted vs measured. ``--measure-only`` does the last two steps on the
deployed configuration.

Order, so that nothing on a host is touched by a change that does not fit or resolve:

1. place the configuration on the inventory's hosts (:mod:`pdinfra.bench.placement`: instances kept, retargeted,
   removed, added on free GPUs or cores); a configuration that does not fit is refused whole, naming what to add;
2. turn it into edits (:func:`pdinfra.cluster.edit.set_instances` per host whose list changes, ``pdinfra_layout``
   when the layout does) and resolve a copy of the inventory with them; problems end here, nothing written;
3. show the changes and the unified diff; ask (unless ``yes``);
4. write the inventory, run ``site.yml --tags serving,monitoring`` (:func:`pdinfra.bench.apply.deploy`);
5. measure at the planned rate and compare with the prediction (:mod:`pdinfra.bench.plan_check`).

A run directory keeps ``plan.json`` (the plan and the placement), ``change.diff``, ``deploy.log``, ``measure.json``
(the bench runner's record with vLLM's result) and ``compare.json``. :func:`apply_plan` and :func:`measure_deployed`
are what the CLI calls, with a :class:`PlanConsole` that shows, asks and prints the progress.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pdinfra.bench import apply, placement, plan_check
from pdinfra.bench.plan import BenchPoint
from pdinfra.bench.planner import Hardware, Option, Plan
from pdinfra.bench.predict import Config, Load, Prediction, predict
from pdinfra.cluster import edit
from pdinfra.cluster.checker import ClusterError
from pdinfra.cluster.inventory import InventoryError
from pdinfra.cluster.model import Cluster

TAGS = apply.TAGS
COMMENT = "set by pdinfra plan --apply"
DEFAULT_MEASURE_PROMPTS = 300


class PlanApplyFailed(RuntimeError):
    """``plan --apply`` or ``--measure-only`` stopped (the message says what was written, if anything)."""


@dataclass
class Change:
    """The planned change: the configuration placed, its edits (none when the inventory already has it) and the
    cluster model the edited inventory resolves to."""

    before: str  # the deployed configuration, e.g. "PD 1P:2D"
    config: Config
    placement: placement.Placement
    edits: list[edit.Edit]
    after: Cluster

    def diff(self, root: Path | None = None) -> str:
        return "".join(e.diff(root) for e in self.edits)

    @property
    def summary(self) -> str:
        return f"{self.before} -> {shape(self.after)} ({self.config.label})"


def shape(c: Cluster) -> str:
    if c.layout == "pd":
        return f"PD {len(c.by_role('prefill'))}P:{len(c.by_role('decode'))}D"
    return f"agg {len(c.instances)}x"


class PlanConsole(Protocol):
    """What :func:`apply_plan` and :func:`measure_deployed` show and ask on the way; the CLI prints it."""

    def change(self, change: Change, inv_dir: Path) -> None:
        """The placement's lines and the inventory diff (relative to inv_dir), before anything is written."""

    def confirm(self) -> bool:
        """Whether to write the inventory and deploy (not asked with ``yes``)."""

    def progress(self, message: str) -> None:
        """A step: the inventory written, the play's progress lines, the warm-up."""

    def measuring(self, point: BenchPoint, prediction: Prediction) -> None:
        """The measurement starts: its rate, prompts and the prediction it is compared with."""


@dataclass
class Outcome:
    """How it ended: ``declined`` (nothing written), or measured (``comparison``; ``applied`` when the inventory
    was changed and deployed), with the run directory."""

    applied: bool = False
    declined: bool = False
    reason: str = ""
    diff: str = ""
    run_dir: Path | None = None
    comparison: plan_check.Comparison | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "declined": self.declined,
            "reason": self.reason,
            "diff": self.diff,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "comparison": self.comparison.to_dict() if self.comparison else None,
        }


def edits_for(source: Path, cluster: Cluster, placed: placement.Placement) -> list[edit.Edit]:
    """``pdinfra_instances`` of each host whose list changes, and ``pdinfra_layout`` when the layout does."""
    out: list[edit.Edit] = []
    for h in cluster.pd_hosts:
        slots = placed.host_slots(h.name)
        if [(s.index, s.values) for s in slots] == [(i.index, {}) for i in h.instances]:
            continue
        items = [edit.Item(s.values, s.index, s.like) for s in slots]
        what = f"pdinfra_instances on {h.name}: {', '.join(i.name for i in h.instances) or 'none'} -> " + (
            ", ".join(s.name for s in slots) or "none"
        )
        out.append(edit.set_instances(source, h.name, items, what))
    if placed.layout != cluster.layout:
        out.append(edit.set_cluster_var(source, "pdinfra_layout", placed.layout, comment=COMMENT))
    return out


def prepare(source: Path, cluster: Cluster, config: Config, hw: Hardware) -> Change:
    """Place, edit and resolve (raises PlacementError, EditError, ClusterError, InventoryError; nothing written)."""
    placed = placement.place(cluster, config, hw)
    edits = edits_for(source, cluster, placed)
    after = apply.resolve_edited(source, edits) if edits else cluster
    return Change(shape(cluster), config, placed, edits, after)


def new_run_dir(out: Path) -> Path:
    """``out`` created; one that already holds a record is refused (an earlier record is never overwritten)."""
    out.mkdir(parents=True, exist_ok=True)
    taken = [n for n in ("compare.json", "measure.json", "plan.json") if (out / n).exists()]
    if taken:
        raise PlanApplyFailed(f"--out {out} already holds {', '.join(taken)}: give a new directory")
    return out


def default_out() -> Path:
    return Path("out") / "plan" / time.strftime("%Y%m%d-%H%M%S")


def _write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _check(
    source: Path,
    after: Cluster,
    opt: Option,
    the_plan: Plan,
    console: PlanConsole,
    run_dir: Path,
    rate: float | None,
    prompts: int,
) -> plan_check.Comparison:
    """Measure the deployed ``after`` at the rate and compare with ``opt``'s configuration predicted there."""
    r = plan_check.rounded(rate or the_plan.planned_rate)
    pred = predict(opt.config, Load(r, the_plan.load.isl, the_plan.load.osl), the_plan.slo.attainment)
    pt = plan_check.point(after.layout, r, the_plan.load.isl, the_plan.load.osl, prompts)
    console.measuring(pt, pred)
    try:
        record = plan_check.measure(source, after, pt, the_plan.slo, run_dir)
    except plan_check.MeasureError as exc:
        raise PlanApplyFailed(str(exc)) from exc
    comparison = plan_check.compare(pred, record["result"], the_plan.slo)
    _write(run_dir / "compare.json", comparison.to_dict())
    return comparison


def apply_plan(
    source: Path,
    cluster: Cluster,
    the_plan: Plan,
    console: PlanConsole,
    *,
    yes: bool = False,
    out: Path | None = None,
    rate: float | None = None,
    prompts: int = DEFAULT_MEASURE_PROMPTS,
) -> Outcome:
    """``plan --apply``: the plan's chosen configuration placed on the inventory ``source`` (resolved as
    ``cluster``), shown, asked (unless yes), written and deployed, then measured at ``rate`` (default the planned
    rate) with at most ``prompts`` prompts and compared with its prediction there. Raises :class:`PlanApplyFailed`
    (no configuration chosen, one that does not fit or resolve: nothing written; a failed play or measurement:
    the message names the diff to revert)."""
    source = Path(source)
    if the_plan.chosen is None:
        raise PlanApplyFailed("no configuration is predicted to meet the SLO: nothing to apply (see the reasons above)")
    try:
        change = prepare(source, cluster, the_plan.chosen.config, the_plan.hardware)
    except placement.PlacementError as exc:
        raise PlanApplyFailed(f"--apply: {exc}") from exc
    except (edit.EditError, InventoryError) as exc:
        raise PlanApplyFailed(f"--apply: {exc}; nothing written") from exc
    except ClusterError as exc:
        raise PlanApplyFailed(f"--apply: the edited inventory does not resolve; nothing written:\n{exc}") from exc
    inv_dir = source if source.is_dir() else source.parent
    diff = change.diff(inv_dir)
    console.change(change, inv_dir)
    if change.edits and not yes and not console.confirm():
        return Outcome(declined=True, reason="declined: nothing written")
    run_dir = new_run_dir(out or default_out())
    _write(run_dir / "plan.json", the_plan.to_dict() | {"placement": change.placement.lines, "change": change.summary})
    if change.edits:
        try:
            apply.deploy(source, change, run_dir, progress=console.progress)
        except (apply.ApplyError, edit.EditError) as exc:
            raise PlanApplyFailed(str(exc)) from exc
    else:
        console.progress("the inventory already has this configuration: nothing to write; measuring it")
    try:
        comparison = _check(source, change.after, the_plan.chosen, the_plan, console, run_dir, rate, prompts)
    except PlanApplyFailed as exc:
        if change.edits:
            raise PlanApplyFailed(
                f"{exc} (the change is deployed; to revert it: patch -R -p1 -d {inv_dir} < "
                f"{run_dir / 'change.diff'}, then site.yml --tags {TAGS})"
            ) from exc
        raise
    return Outcome(applied=bool(change.edits), diff=diff, run_dir=run_dir, comparison=comparison)


def measure_deployed(
    source: Path,
    cluster: Cluster,
    the_plan: Plan,
    console: PlanConsole,
    *,
    out: Path | None = None,
    rate: float | None = None,
    prompts: int = DEFAULT_MEASURE_PROMPTS,
) -> Outcome:
    """``plan --measure-only``: the deployed configuration measured at ``rate`` (default the planned rate) and
    compared with the plan's prediction for it; nothing is edited."""
    if the_plan.deployed is None:
        raise PlanApplyFailed(
            "the deployed configuration cannot be predicted: a role's TP has no profile (give a "
            "profile of each deployed shape with -p)"
        )
    run_dir = new_run_dir(out or default_out())
    _write(run_dir / "plan.json", the_plan.to_dict())
    comparison = _check(Path(source), cluster, the_plan.deployed, the_plan, console, run_dir, rate, prompts)
    return Outcome(run_dir=run_dir, comparison=comparison)
