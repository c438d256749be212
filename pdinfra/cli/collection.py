"""``pdinfra collection``: where the wheel's Ansible collection ``pdinfra.pd`` is, for a plain ``ansible-playbook``,
and its tarball for ``ansible-galaxy collection install`` (docs/collection.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="The Ansible collection pdinfra.pd: where it is, its tarball.")


@app.command("path")
def path_cmd() -> None:
    """Print the directory to put in ANSIBLE_COLLECTIONS_PATH for `ansible-playbook pdinfra.pd.site` (a checkout: the
    collection is assembled from it by `pdinfra collection build`; there is no installed one)."""
    from pdinfra import collection, paths

    if paths.CHECKOUT:
        typer.echo(
            f"pdinfra runs from a checkout ({paths.CHECKOUT}): use its site.yml, or `pdinfra collection build DIR` "
            "and ansible-galaxy collection install",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(str(collection.collections_path()))


@app.command("build")
def build_cmd(out: Annotated[Path, typer.Argument(help="Directory the tarball is written to.")]) -> None:
    """Write pdinfra-pd-<version>.tar.gz (ansible-galaxy collection build), from the checkout or from the wheel."""
    from pdinfra import collection, paths

    project = paths.CHECKOUT or paths.PACKAGE
    with tempfile.TemporaryDirectory(prefix="pdinfra-collection-") as work:
        try:
            typer.echo(str(collection.build(project, out.absolute(), Path(work))))
        except (RuntimeError, OSError) as exc:
            typer.echo(f"pdinfra collection build: {exc}", err=True)
            raise typer.Exit(1) from exc
