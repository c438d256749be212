"""``pdinfra model``: models pdinfra builds itself (the tiny test model)."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="Models pdinfra builds itself.")


@app.command("tiny")
def model_tiny(
    print_path: Annotated[bool, typer.Option("--print-path", help="Print only the directory.")] = False,
) -> None:
    """Build the tiny Llama-shaped test model (config + locally trained tokenizer) on this machine."""
    from pdinfra.serving import tinymodel

    path = tinymodel.ensure()
    typer.echo(str(path) if print_path else f"{tinymodel.NAME}: {path}")
