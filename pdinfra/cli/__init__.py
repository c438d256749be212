"""The ``pdinfra`` command: main assembles the typer app; one module per command group (deploy: check-config,
deploy, up, down; serving: smoke, probe; advise; wheelhouse; host: facts, validate; transfer: transfer and its
peer side; testhosts: hosts; tinymodel: model; bench; kvtrace: kv-trace), their shared options in common. The CLI
may import every other layer."""

from pdinfra.cli.main import app

__all__ = ["app"]
