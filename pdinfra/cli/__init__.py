"""The ``pdinfra`` command: one Typer sub-app or command group per file (main: up/down/deploy/smoke/check-config
and the test hosts; host: facts and validate; transfer; bench). The CLI may import every other layer."""

from pdinfra.cli.main import app

__all__ = ["app"]
