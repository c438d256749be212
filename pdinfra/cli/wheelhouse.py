"""``pdinfra wheelhouse``: the controller helper pd_runtime calls to build the nodes' wheelhouse (registered by
pdinfra.cli.main)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pdinfra.cli.common import console


def wheelhouse_cmd(
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
