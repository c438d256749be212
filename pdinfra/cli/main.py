"""pdinfra command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from pdinfra import paths
from pdinfra.cli.bench import bench_plan_cmd, bench_report_cmd
from pdinfra.cli.host import facts_cmd, validate_cmd
from pdinfra.cli.transfer import transfer_cmd

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="pdinfra: provision, deploy, validate and benchmark prefill/decode-disaggregated vLLM on bare metal.",
)
hosts_app = typer.Typer(no_args_is_help=True, help="Local test hosts (systemd-nspawn nodes) of an inventory.")
model_app = typer.Typer(no_args_is_help=True, help="Models pdinfra builds itself.")
bench_app = typer.Typer(no_args_is_help=True, help="SLO benchmarks: vllm bench serve sweeps, analysis, report.")
app.add_typer(hosts_app, name="hosts")
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")
kvtrace_app = typer.Typer(
    no_args_is_help=True,
    help="KV layout traces: the block IDs decode instances really read (vllm_instance_kv_trace: true).",
)
app.add_typer(kvtrace_app, name="kv-trace")
console = Console(stderr=True, soft_wrap=True)

DEFAULT_INV = paths.REPO / "inventory" / "local" / "hosts.yml"
_said: set[Path] = set()


def _deployed_record() -> Path:
    """Where `pdinfra up` records the inventory the running local cluster was deployed from."""
    return paths.state_dir() / "testhosts" / "deployed-inventory"


def _inventory(inv: Path) -> Path:
    """The inventory a command works on: without -i, the one the running local cluster was deployed from by
    `pdinfra up -i ...` (said once on stderr), else the local one."""
    if inv != DEFAULT_INV:
        return inv
    try:
        recorded = Path(_deployed_record().read_text().strip())
    except OSError:
        return inv
    if recorded != DEFAULT_INV and recorded.is_file():
        if recorded not in _said:
            _said.add(recorded)
            typer.echo(f"» inventory {recorded} (the local cluster was deployed from it by pdinfra up; -i chooses "
                       "another)", err=True)  # fmt: skip
        return recorded
    return inv


def _inventory_option(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """-i's callback: an inventory given on the command line is used as it is, the default follows the deploy."""
    source = ctx.get_parameter_source(param.name or "")
    if getattr(source, "name", "") == "COMMANDLINE":  # by name: typer may carry its own copy of click's enum
        return value
    return _inventory(value)


def _remember(inv: Path) -> None:
    try:
        rec = _deployed_record()
        rec.parent.mkdir(parents=True, exist_ok=True)
        rec.write_text(f"{inv.absolute()}\n")  # not resolve(): an overlay's hosts.yml is a link
    except OSError:
        pass


# Every command's -i; without it, the inventory `pdinfra up` last deployed the local cluster from (_inventory).
Inv = Annotated[
    Path,
    typer.Option("--inventory", "-i", callback=_inventory_option,
                 help="Ansible inventory (default: the one the local cluster was deployed from, else "
                      "inventory/local)."),
]  # fmt: skip
# `pdinfra up`'s -i: what it deploys, inventory/local unless given (it does not follow the last deploy).
UpInv = Annotated[
    Path, typer.Option("--inventory", "-i", help="Ansible inventory (default: the local two-node cluster).")
]


def _load(inv: Path):
    """The raw inventory (the test hosts read it)."""
    from pdinfra.cluster.inventory import InventoryError, load

    try:
        return load(inv)
    except InventoryError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def _cluster(inv: Path, secrets: bool = False):
    """The resolved cluster (with ``secrets``: and its API key); problems are printed (each naming its variable and
    host) and end the command."""
    from pdinfra.cluster.inventory import InventoryError, load_cluster
    from pdinfra.cluster.resolve import ClusterError
    from pdinfra.playbook import AnsibleMissing

    try:
        if inv == DEFAULT_INV:
            from pdinfra.testhosts import nspawn

            nspawn.api_key_file()  # the local inventory reads its API key from the test hosts' state
        return load_cluster(inv, secrets=secrets)
    except ClusterError as exc:  # plain text, one problem a line: easy to grep, never wrapped
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from exc
    except (InventoryError, AnsibleMissing) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _progress(msg: str) -> None:
    console.print(f"[cyan]»[/] {msg}")


@app.command()
def version() -> None:
    """Print the pdinfra version."""
    from pdinfra import __version__

    typer.echo(__version__)


@app.command("check-config")
def check_config(
    inventory: Inv = DEFAULT_INV,
    json_out: Annotated[bool, typer.Option("--json", help="Print the resolved cluster model as JSON.")] = False,
) -> None:
    """Resolve and check the cluster description (no host is contacted): the same check site.yml runs first."""
    cluster = _cluster(inventory)
    if json_out:
        typer.echo(json.dumps(cluster.to_dict(), indent=1))
        return
    table = Table("host", "address", "hardware", "instances", title=f"{inventory}", title_justify="left")
    for h in cluster.hosts:
        insts = ", ".join(
            f"{i.name} {i.role} :{i.port} tp{i.tp}" + (f" gpus {','.join(map(str, i.gpus))}" if i.gpus else "")
            for i in h.instances
        )
        table.add_row(h.name + (" (router)" if h.router else ""), h.address or "-", h.hardware, insts or "-")
    Console(stderr=True).print(table)
    console.print(
        f"[green]ok[/] {len(cluster.pd_hosts)} PD hosts, {len(cluster.instances)} instances; {cluster.profile} "
        f"profile, {cluster.model.name} ({cluster.model.shape or 'no shape'}), block size {cluster.block_size}, "
        f"dtype {cluster.dtype}, layout {cluster.layout}, router {cluster.router.url}"
    )


# ----------------------------------------------------------------------------- test hosts
@hosts_app.command("create")
def hosts_create(inventory: Inv = DEFAULT_INV) -> None:
    """Boot the inventory's test hosts (Debian 12, systemd as PID 1, SSH) on this machine."""
    from pdinfra import testhosts

    hosts = testhosts.from_inventory(_load(inventory))
    if not hosts:
        console.print(f"{inventory} declares no test hosts (pdinfra_testhost: true)")
        return
    try:
        testhosts.create(hosts, progress=_progress)
    except testhosts.TestHostError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc


@hosts_app.command("destroy")
def hosts_destroy(
    inventory: Inv = DEFAULT_INV,
    keep_disk: Annotated[
        bool, typer.Option(help="Keep each host's overlay (installed venv) for a faster re-create.")
    ] = False,
) -> None:
    """Stop the test hosts and remove every process, mount, namespace, veth, bridge and cgroup they used."""
    from pdinfra import testhosts

    hosts = testhosts.from_inventory(_load(inventory))
    testhosts.destroy(hosts, progress=_progress, keep_disk=keep_disk)
    _deployed_record().unlink(missing_ok=True)
    left = testhosts.leftovers(hosts)
    if left:
        console.print("[red]left behind:[/] " + ", ".join(left))
        raise typer.Exit(1)
    console.print("[green]destroyed[/]: nothing left behind")


@hosts_app.command("status")
def hosts_status(inventory: Inv = DEFAULT_INV) -> None:
    """Show which test hosts are running."""
    from pdinfra import testhosts

    table = Table("host", "address", "state", "nspawn pid")
    for h in testhosts.from_inventory(_load(inventory)):
        pid = testhosts.running_pid(h)
        table.add_row(h.name, h.address, "[green]running[/]" if pid else "stopped", str(pid or "-"))
    Console().print(table)


# ----------------------------------------------------------------------------- deploy
def run_playbook(inventory: Path, extra: list[str] | None = None, check: bool = False) -> int:
    """Run site.yml: one line per step with its elapsed time; the full Ansible log goes to out/logs/."""
    from pdinfra.playbook import run_playbook as run

    return run(inventory, "site.yml", extra, check=check, progress=_progress).rc


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def deploy(
    ctx: typer.Context,
    inventory: Inv = DEFAULT_INV,
    check: Annotated[bool, typer.Option("--check", help="Ansible check mode: report what would change.")] = False,
) -> None:
    """Run site.yml against the inventory (extra arguments go to ansible-playbook)."""
    rc = run_playbook(inventory, list(ctx.args), check)
    raise typer.Exit(rc)


@app.command()
def up(
    inventory: UpInv = DEFAULT_INV,
    destroy_first: Annotated[bool, typer.Option("--fresh", help="Destroy existing test hosts first.")] = False,
) -> None:
    """Everything in one go: test hosts (if the inventory has them), site.yml, smoke summary."""
    t0 = time.monotonic()
    _progress("resolving the cluster description")
    from pdinfra import testhosts

    inventory = inventory.absolute()
    _remember(inventory)  # later commands without -i work on this inventory (pdinfra down forgets it)
    hosts = testhosts.from_inventory(_load(inventory))
    if not hosts:  # real hosts: nothing local to remember
        _deployed_record().unlink(missing_ok=True)
    _cluster(inventory)
    if hosts:
        if destroy_first:
            testhosts.destroy(hosts, progress=_progress)
        hosts_create(inventory)
    rc = run_playbook(inventory)
    if rc != 0:
        console.print(f"[red]site.yml failed (exit {rc})[/]")
        raise typer.Exit(rc)
    smoke(inventory=inventory, json_out=False, layout=None)
    console.print(f"[green]pdinfra up: done in {time.monotonic() - t0:.0f} s[/]")


@app.command()
def down(inventory: Inv = DEFAULT_INV) -> None:
    """Destroy the inventory's local test hosts."""
    hosts_destroy(inventory, keep_disk=False)


# ----------------------------------------------------------------------------- smoke
@app.command()
def smoke(
    inventory: Inv = DEFAULT_INV,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per completion.")] = 16,
    layout: Annotated[
        str | None, typer.Option(help="pd or agg (default: the inventory's pdinfra_layout, else pd).")
    ] = None,
) -> None:
    """Completion + streaming completion through the router, proof of P->D KV transfer, greedy equality."""
    from pdinfra.serving import smoke as smoke_mod

    cluster = _cluster(inventory, secrets=True)
    ep = smoke_mod.endpoints_from_cluster(cluster, api_key=cluster.secrets.api_key)
    lay = layout or cluster.layout
    result = smoke_mod.run(ep, max_tokens=max_tokens, layout=lay)
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        table = Table(title=f"pdinfra smoke: router {ep.router}", show_lines=False)
        table.add_column("proof")
        table.add_column("verdict")
        table.add_column("evidence", overflow="fold")
        for p in result.proofs:
            table.add_row(p.name, "[green]PASS[/]" if p.ok else "[red]FAIL[/]", p.evidence)
        Console(width=160).print(table)
        timing = ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items())
        Console(width=160).print(f"prefill {', '.join(ep.prefill)} -> decode {', '.join(ep.decode)}; {timing}")
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def probe(
    inventory: Inv = DEFAULT_INV,
    instance: Annotated[str | None, typer.Option(help="Only the prefill->decode pairs of this instance.")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds per HTTP request.")] = 20.0,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
) -> None:
    """Deep health from here: a one-token PD request through the router and over every prefill->decode pair,
    each of which must move KV (the router node's pdinfra-probe.timer runs the same probe every 30 s)."""
    from pdinfra.serving import probe as probe_mod

    cluster = _cluster(inventory, secrets=True)
    try:
        result = probe_mod.run(cluster, cluster.secrets.api_key, timeout, instance=instance)
    except KeyError as exc:
        typer.echo(f"error: {exc.args[0]}", err=True)
        raise typer.Exit(2) from exc
    if json_out:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        table = Table(title=f"pdinfra probe: router {cluster.router.url}")
        for col in ("path", "verdict", "seconds", "evidence"):
            table.add_column(col, overflow="fold")
        for p in result.paths:
            table.add_row(p.path, "[green]PASS[/]" if p.ok else "[red]FAIL[/]", f"{p.seconds:.2f}", p.evidence)
        Console(width=160).print(table)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def advise(
    inventory: Inv = DEFAULT_INV,
    window: Annotated[str, typer.Option(help="Prometheus range over which to judge, e.g. 10m, 1h.")] = "10m",
    prometheus: Annotated[
        str | None, typer.Option(help="Prometheus URL (default: the cluster's, from pdinfra_monitoring_host).")
    ] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds per Prometheus query.")] = 10.0,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Write the advised change into the inventory (shown as a diff first), run "
            "site.yml --tags serving,monitoring, then wait one --window of traffic and judge again.",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="With --apply: do not ask before writing the inventory.")] = False,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            help="With --apply: where the diff, the play's log and both advices go "
            "(default: the state directory's advise/<time>)."
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable advice on stdout.")] = False,
) -> None:
    """Judge the running cluster against its SLO from Prometheus's live metrics and advise: keep, rebalance
    prefill:decode, add capacity, or try PD. Every figure comes with the PromQL that produced it (--json).
    --apply makes the change that needs no new hardware and measures again."""
    import re
    import sys

    from pdinfra.bench import advise as advise_mod
    from pdinfra.bench import apply as apply_mod
    from pdinfra.cluster.edit import EditError
    from pdinfra.cluster.inventory import InventoryError
    from pdinfra.cluster.resolve import ClusterError

    if not re.fullmatch(r"\d+[smhd]", window):
        typer.echo(f"error: --window {window!r} must be a Prometheus duration such as 10m or 1h", err=True)
        raise typer.Exit(2)
    if apply and not yes and not sys.stdin.isatty():
        typer.echo("error: --apply asks before writing the inventory; without a terminal give --yes", err=True)
        raise typer.Exit(2)
    cluster = _cluster(inventory)
    con = Console(width=160, stderr=json_out)

    def judge(c) -> advise_mod.Advice:
        try:
            return advise_mod.run(c, window, prometheus, timeout)
        except advise_mod.AdviseError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc

    def show(a: advise_mod.Advice) -> None:
        con.print(f"[bold]pdinfra advise[/]: {a.shape}, last {a.window}, SLO {a.slo} (Prometheus {a.prometheus})")
        for line in a.evidence:
            con.print(f"  {line}")
        con.print(f"[bold]{a.verdict}[/]: {a.summary}")
        for act in a.actions:
            con.print(f"  -> {act}")

    before = judge(cluster)
    if json_out and not apply:
        typer.echo(json.dumps(before.to_dict(), indent=2))
        return
    show(before)
    if not apply:
        return
    try:
        plan = apply_mod.plan(inventory, before)
    except apply_mod.ApplyError as exc:
        con.print(f"--apply: nothing to apply: {exc}")
        if json_out:
            typer.echo(json.dumps({"before": before.to_dict(), "applied": False}, indent=2))
        return
    except (EditError, InventoryError) as exc:
        typer.echo(f"error: --apply: {exc}", err=True)
        raise typer.Exit(1) from exc
    except ClusterError as exc:
        typer.echo(f"error: --apply: the edited inventory does not resolve; nothing written:\n{exc}", err=True)
        raise typer.Exit(1) from exc
    inv_dir = inventory if inventory.is_dir() else inventory.parent
    con.print(f"[bold]--apply[/]: {plan.change.summary}; the inventory change ({inv_dir}):")
    con.print(plan.diff(inv_dir), markup=False, highlight=False)
    if not yes and not typer.confirm("Write it and deploy?", default=False, err=True):
        con.print("nothing written")
        raise typer.Exit(1)
    logs = log_dir or apply_mod.default_log_dir()
    try:
        apply_mod.deploy(inventory, plan, logs, progress=lambda m: con.print(f"  {m}", markup=False, highlight=False))
    except (apply_mod.ApplyError, EditError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    # One window of traffic, plus a margin of scrapes so that Prometheus has seen every new instance's warm-up
    # finish before the window begins (advise counts settled instances only: advise.SETTLED).
    wait_s = apply_mod.window_seconds(window) + apply_mod.SETTLE_MARGIN_S
    con.print(f"deployed; measuring again over {window} of traffic on the new deployment (until "
              f"{time.strftime('%H:%M:%S', time.localtime(time.time() + wait_s))})")  # fmt: skip
    t_end = time.monotonic() + wait_s
    while (left := t_end - time.monotonic()) > 0:
        time.sleep(min(30.0, left))
        if t_end - time.monotonic() > 1:
            con.print(f"  {t_end - time.monotonic():.0f} s to go")
    after = judge(plan.after)
    show(after)
    table = Table(title=f"before and after the change, each over {window}")
    for col in ("", "before", "after"):
        table.add_column(col)
    for row in apply_mod.compare(before, after):
        table.add_row(*row)
    con.print(table)
    (logs / "advice-before.json").write_text(json.dumps(before.to_dict(), indent=2) + "\n")
    (logs / "advice-after.json").write_text(json.dumps(after.to_dict(), indent=2) + "\n")
    con.print(f"diff, play log and both advices: {logs}")
    if json_out:
        typer.echo(json.dumps({"before": before.to_dict(), "applied": True, "diff": plan.diff(inv_dir),
                               "after": after.to_dict(), "log_dir": str(logs)}, indent=2))  # fmt: skip


# ----------------------------------------------------------------------------- controller helpers used by roles
@app.command()
def wheelhouse(
    python_version: Annotated[str, typer.Option(help="The nodes' Python, e.g. 3.11.")],
    glibc: Annotated[str, typer.Option(help="The nodes' glibc, e.g. 2.36.")],
    package: Annotated[list[str], typer.Option(help="A requirement to download (repeat).")],
    arch: Annotated[str, typer.Option(help="The nodes' architecture.")] = "x86_64",
    profile: Annotated[str, typer.Option(help="cpu or gpu (informational).")] = "cpu",
    extra_index_url: Annotated[list[str] | None, typer.Option(help="Extra package index (repeat).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print paths as JSON (for the pd_runtime role).")] = False,
) -> None:
    """Download every wheel the nodes need for their Python/glibc, and pack pdinfra's source (cached)."""
    from pdinfra.serving import wheelhouse as wh

    try:
        tarball, built = wh.build(package, python_version, glibc, arch, extra_index_url or [])
    except wh.WheelhouseError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from exc
    src = wh.pdinfra_source()
    info = {
        "built": built,
        "profile": profile,
        "wheelhouse": str(tarball),
        "wheelhouse_id": wh.digest(tarball),
        "wheelhouse_mb": round(tarball.stat().st_size / 1e6),
        "pdinfra_src": str(src),
        "pdinfra_src_id": wh.digest(src),
    }
    typer.echo(json.dumps(info) if json_out else "\n".join(f"{k}: {v}" for k, v in info.items()))


@app.command("transfer-target", hidden=True)
def transfer_target() -> None:
    """The target side of `pdinfra validate --transfer --peer` (started on the peer over SSH; speaks on stdin/out)."""
    from pdinfra.transfer.remote import serve

    serve()


@kvtrace_app.command("collect")
def kv_trace_collect(
    out: Annotated[Path, typer.Option("--out", "-o", help="Where the merged trace goes (JSON lines).")],
    inventory: Inv = DEFAULT_INV,
    reset: Annotated[
        bool, typer.Option("--reset", help="Empty each instance's trace after fetching it (the next load starts anew).")
    ] = False,
) -> None:
    """Fetch every decode instance's trace (/var/lib/pdinfra/<instance>/kv-trace.jsonl) into one file."""
    import tempfile

    from pdinfra.playbook import adhoc
    from pdinfra.transfer import trace as trace_mod

    cluster = _cluster(inventory)
    decodes = cluster.by_role("decode")
    if not decodes:
        typer.echo("error: the cluster has no decode instance", err=True)
        raise typer.Exit(2)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pdinfra-kvtrace-") as tmp:
        for inst in decodes:
            src = f"/var/lib/pdinfra/{inst.name}/kv-trace.jsonl"
            dest = Path(tmp) / f"{inst.name}.jsonl"
            got = adhoc(inventory, inst.host, "ansible.builtin.fetch", {"src": src, "dest": str(dest), "flat": True,
                                                                         "fail_on_missing": False})  # fmt: skip
            if got.get("failed") or got.get("unreachable"):
                typer.echo(f"error: {inst.host}: cannot fetch {src}: {got.get('msg')}", err=True)
                raise typer.Exit(1)
            if not dest.exists() and "does not exist" not in str(got.get("msg", "")).lower():
                typer.echo(f"error: {inst.host}: {src} was not fetched: {got.get('msg') or 'no reason'}", err=True)
                raise typer.Exit(1)
            if not dest.exists():
                console.print(f"{inst.name} on {inst.host}: no trace (is vllm_instance_kv_trace true, and did PD "
                              "requests run?)")  # fmt: skip
                continue
            recs = [ln for ln in dest.read_text().splitlines() if ln.strip()]
            console.print(f"{inst.name} on {inst.host}: {len(recs)} reads")
            lines += [json.dumps(json.loads(ln) | {"instance": inst.name}, separators=(",", ":")) for ln in recs]
            if reset:  # reads appended between the fetch and this are lost: reset between loads, not during one
                cut = adhoc(inventory, inst.host, "ansible.builtin.shell", {"cmd": f": > {src}"})
                if cut.get("failed") or cut.get("unreachable"):
                    typer.echo(f"error: {inst.host}: cannot empty {src}: {cut.get('msg')}", err=True)
                    raise typer.Exit(1)
    lines.sort(key=lambda ln: json.loads(ln).get("t", 0))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(ln + "\n" for ln in lines))
    try:
        trace_mod.load(out)
    except trace_mod.TraceError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    console.print(f"{len(lines)} reads -> {out}")


@kvtrace_app.command("show")
def kv_trace_show(
    files: Annotated[list[Path], typer.Argument(help="Trace files (pdinfra kv-trace collect).")],
    json_out: Annotated[bool, typer.Option("--json", help="The summaries as JSON.")] = False,
) -> None:
    """Run lengths of a trace: how many descriptors per layer NIXL really moves per request, and the merge
    factor (blocks per descriptor). Runs count only where decode and prefill block IDs both go up by one."""
    from pdinfra.transfer import trace as trace_mod

    sums = []
    for f in files:
        try:
            sums.append(trace_mod.summary(trace_mod.load(f)))
        except trace_mod.TraceError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    if json_out:
        typer.echo(json.dumps(sums, indent=2))
        return
    buckets = sorted({k for s in sums for k in s["blocks_in_runs"]}, key=lambda k: int(k.split("-")[0]))
    table = Table(title="KV layout traces: share of moved blocks by the length of the run they are in")
    for col in ("trace", "reads", "blocks/read p50", "runs", "blocks/run", "sorted: blocks/run", *buckets):
        table.add_column(col, justify="right" if col != "trace" else "left")
    for s in sums:
        shares = [f"{s['blocks_in_runs'].get(b, 0) * 100:.0f}%" for b in buckets]
        table.add_row(Path(s["file"]).name, str(s["reads"]), f"{s['blocks_per_read']['median']:g}", str(s["runs"]),
                      f"{s['merge_factor']:.2f}", f"{s['merge_factor_sorted']:.2f}", *shares)  # fmt: skip
    Console(width=160).print(table)


@model_app.command("tiny")
def model_tiny(
    print_path: Annotated[bool, typer.Option("--print-path", help="Print only the directory.")] = False,
) -> None:
    """Build the tiny Llama-shaped test model (config + locally trained tokenizer) on this machine."""
    from pdinfra.serving import tinymodel

    path = tinymodel.ensure()
    typer.echo(str(path) if print_path else f"{tinymodel.NAME}: {path}")


@bench_app.command("run")
def bench_run(
    inventory: Inv = DEFAULT_INV,
    plan: Annotated[
        str,
        typer.Option(help="default (the seeds' sweep: ISL 1k/8k, OSL 1k, conc. 1..32), small (CI), long (1536/64, "
                          "conc. 1..16: where PD wins on inventory/local-1p1d) or kv-trace."),
    ] = "default",
    isl: Annotated[str | None, typer.Option(help="Input lengths, e.g. 1024,8192.")] = None,
    osl: Annotated[str | None, typer.Option(help="Output lengths, e.g. 1024.")] = None,
    concurrency: Annotated[str | None, typer.Option(help="Max concurrencies, e.g. 1,2,4,8,16,32.")] = None,
    layouts: Annotated[str | None, typer.Option(help="Layouts to sweep: agg,pd.")] = None,
    prompts_per_concurrency: Annotated[int | None, typer.Option(help="num_prompts = this x concurrency.")] = None,
    request_rate: Annotated[str | None, typer.Option(help="Request rate (inf = all at once).")] = None,
    slo: Annotated[
        str | None, typer.Option(help="SLO as YAML/JSON or a file; default: the inventory's pdinfra_slo.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Where run directories are written.")] = Path("out/bench/runs"),
    report: Annotated[Path | None, typer.Option(help="Also write the report here (HTML, Markdown, plots).")] = None,
    redeploy: Annotated[
        bool,
        typer.Option(
            "--redeploy",
            help="Redeploy the same instances as aggregated servers behind the router for the agg points "
            "(same GPUs as PD), and back to PD afterwards. Without it, agg = the first decode instance direct.",
        ),
    ] = False,
    backend: Annotated[
        str,
        typer.Option(help="vllm bench serve's --backend: vllm or openai (/v1/completions), openai-chat "
                          "(/v1/chat/completions through the model's chat template)."),
    ] = "vllm",
) -> None:
    """Run `vllm bench serve` sweeps of the agg and PD layouts against the deployed cluster, save and report them."""
    from pdinfra.bench import live
    from pdinfra.bench.report import text_summary, write_report
    from pdinfra.bench.runner import run_bench
    from pdinfra.cli.bench import parse_slo, plan_from_options
    from pdinfra.cluster.slo import SLO

    try:
        if backend not in live.BACKEND_ENDPOINTS:
            raise ValueError(f"--backend {backend!r}: one of {', '.join(live.BACKEND_ENDPOINTS)}")
        the_plan = plan_from_options(plan, isl, osl, concurrency, layouts, prompts_per_concurrency, request_rate)
        the_slo = parse_slo(slo) if slo else None
    except (KeyError, ValueError, OSError) as exc:  # one line, exit 2, before any host is touched
        typer.echo(f"error: {str(exc).strip(chr(34))}", err=True)
        raise typer.Exit(2) from exc
    cluster = _cluster(inventory)
    the_slo = the_slo or SLO.from_dict(cluster.slo)
    endpoints, router = live.endpoints_from_cluster(cluster, redeploy=redeploy, backend=backend)
    deployer = live.LayoutDeployer(inventory, Path(out) / ".deploy", _progress) if redeploy else None
    executor = live.AnsibleExecutor(inventory, router, Path(out) / ".fetched", deployer=deployer)
    try:
        run_dir = run_bench(the_plan, the_slo, endpoints, executor, live.http_scrape, Path(out),
                            host={"router": router, "inventory": str(inventory), "redeploy": redeploy})  # fmt: skip
    finally:
        if deployer is not None:
            deployer.ensure("pd")  # leave the cluster as site.yml deploys it
    console.print(f"[green]run saved[/]: {run_dir}")
    if report:
        files = write_report([run_dir], report, the_slo)
        Console(width=160).print(text_summary(files.runs[0]))
        console.print(f"report: {files.html}")


@bench_app.command("latency")
def bench_latency(
    inventory: Inv = DEFAULT_INV,
    requests: Annotated[int, typer.Option("-n", "--requests", min=1, help="Requests through the router.")] = 20,
    words: Annotated[int, typer.Option(min=1, help="Prompt length in words (the report gives the tokens).")] = 200,
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per request.")] = 16,
    direct: Annotated[
        bool, typer.Option(help="Also send as many requests prefill -> decode without the router (its added latency).")
    ] = True,
    out: Annotated[Path | None, typer.Option(help="Write every sample and the medians as JSON here.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
) -> None:
    """Decompose a PD request's latency, one request at a time: router, prefill request, KV transfer, decode's
    first token, from the router's and the instances' own histograms. Run it on an otherwise idle cluster."""
    from pdinfra.bench import decompose

    cluster = _cluster(inventory, secrets=True)
    con = Console(width=160, stderr=json_out)
    try:
        targets = decompose.targets_from_cluster(cluster, api_key=cluster.secrets.api_key)
        d = decompose.run(targets, requests=requests, words=words, max_tokens=max_tokens, direct=direct,
                          progress=lambda m: con.print(f"[cyan]»[/] {m}"))  # fmt: skip
    except decompose.DecomposeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    data = d.to_dict()
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
    if json_out:
        typer.echo(json.dumps(data, indent=1))
        return
    kept = sum(1 for s in d.samples if s.path == "router")
    table = Table(title=f"PD latency, {kept} requests through {targets.router} "
                        f"({d.prompt_tokens} prompt tokens, {max_tokens} output tokens, one at a time)")  # fmt: skip
    for col, justify in (("stage", "left"), ("p50 ms", "right"), ("mean ms", "right"), ("of p50", "right")):
        table.add_column(col, justify=justify)
    for row in decompose.table_rows(d):
        table.add_row(*row)
    con.print(table)
    added = d.router_added()
    if added is not None:
        via, direct_p50 = 1000 * d.p50("router")["outside"], 1000 * d.p50("direct")["outside"]
        con.print(f"router's added latency: p50 {1000 * added:.1f} ms (outside the instances: {via:.1f} ms through "
                  f"the router, {direct_p50:.1f} ms prefill -> decode without it)")  # fmt: skip
    if d.discarded:
        con.print(f"[yellow]{len(d.discarded)} samples discarded[/] (other traffic, e.g. the deep-health probe's "
                  f"timer): {d.discarded[0]}")  # fmt: skip


@bench_app.command("reuse")
def bench_reuse(
    inventory: Inv = DEFAULT_INV,
    trials: Annotated[int, typer.Option(min=1, help="Trials per share and instance.")] = 3,
    words: Annotated[
        int, typer.Option(min=8, help="Prompt length in words (360: about 1 900 tokens of the tiny model).")
    ] = 360,
    out: Annotated[Path, typer.Option(help="Directory for reuse.json, reuse.md and reuse.png.")] = Path(
        "out/bench/reuse"
    ),
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")] = False,
) -> None:
    """The KV reuse experiment (needs pdinfra_kv_store): TTFT of prompts that share 0-100% of an earlier prompt,
    on the instance that computed it (its own prefix cache) and on one on another host (the Mooncake store).
    Sends one request at a time straight to the two instances; run it on an otherwise idle cluster."""
    from pdinfra.bench import reuse
    from pdinfra.serving import smoke as smoke_mod

    cluster = _cluster(inventory, secrets=True)
    pair = smoke_mod.store_pair(cluster)
    if pair is None:
        typer.echo(f"error: {inventory} has no KV reuse tier with two instances to compare (pdinfra_kv_store: "
                   "true, and a saving instance plus one more)", err=True)  # fmt: skip
        raise typer.Exit(2)
    con = Console(width=160, stderr=True)

    def progress(done: int, total: int, s: reuse.Sample) -> None:
        what = f"{s.ttft_ms:.0f} ms, {s.store_hits:.0f} from store" if s.ok else f"failed: {s.error}"
        con.print(f"[cyan]»[/] {done}/{total} shared {s.share}% on the {s.target} instance: {what}")

    rr = reuse.run(pair[0], pair[1], cluster.model.name, cluster.secrets.api_key, n_words=words, trials=trials,
                   progress=progress)  # fmt: skip
    files = reuse.write(rr, out)
    if json_out:
        typer.echo(json.dumps(rr.to_dict(), indent=1))
    else:
        Console(width=160).print(reuse.markdown(rr))
        con.print(f"written: {', '.join(map(str, files))}")
    if any(not s.ok for s in rr.samples):
        raise typer.Exit(1)


bench_app.command("plan")(bench_plan_cmd)
bench_app.command("report")(bench_report_cmd)
app.command("facts")(facts_cmd)
app.command("validate")(validate_cmd)
app.command("transfer")(transfer_cmd)
