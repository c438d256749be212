"""The ``pdinfra`` typer app: every command and command group, registered in the order ``pdinfra --help`` lists
them. Each group's commands live in their own module of pdinfra.cli; what they share (the -i option, loading
the cluster, the progress line) in pdinfra.cli.common."""

from __future__ import annotations

import sys

import typer

from pdinfra.cli import bench, collection, inventory, kvtrace, testhosts, tinymodel
from pdinfra.cli.advise import advise_cmd
from pdinfra.cli.deploy import PASS_THROUGH, check_config_cmd, deploy_cmd, down_cmd, up_cmd
from pdinfra.cli.host import facts_cmd, validate_cmd
from pdinfra.cli.loop import loop_cmd
from pdinfra.cli.plan import plan_cmd
from pdinfra.cli.serving import probe_cmd, smoke_cmd
from pdinfra.cli.transfer import transfer_cmd, transfer_target_cmd
from pdinfra.cli.wheelhouse import wheelhouse_cmd

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="pdinfra: provision, deploy, validate and benchmark prefill/decode-disaggregated vLLM on bare metal.",
)
app.add_typer(testhosts.app, name="hosts")
app.add_typer(inventory.app, name="inventory")
app.add_typer(tinymodel.app, name="model")
app.add_typer(bench.app, name="bench")
app.add_typer(kvtrace.app, name="kv-trace")
app.add_typer(collection.app, name="collection")


@app.command()
def version() -> None:
    """Print the pdinfra version."""
    from pdinfra import __version__

    typer.echo(__version__)


app.command("check-config")(check_config_cmd)
app.command("deploy", context_settings=PASS_THROUGH)(deploy_cmd)
app.command("up")(up_cmd)
app.command("down")(down_cmd)
app.command("smoke")(smoke_cmd)
app.command("probe")(probe_cmd)
app.command("advise")(advise_cmd)
app.command("plan")(plan_cmd)
app.command("loop")(loop_cmd)
# controller helpers: wheelhouse for pd_runtime, the peer side of `validate --transfer --peer`
app.command("wheelhouse")(wheelhouse_cmd)
app.command("transfer-target", hidden=True)(transfer_target_cmd)
app.command("facts")(facts_cmd)
app.command("validate")(validate_cmd)
app.command("transfer")(transfer_cmd)


# Modules that only the controller extra installs (pyproject.toml): a command that needs one says so.
CONTROLLER_ONLY = frozenset(
    [
        "ansible",
        "ansible_runner",
        "mitogen",
        "matplotlib",
        "numpy",
        "scipy",
        "statsmodels",
        "ruamel",
        "tokenizers",
        "safetensors",
    ]
)


def run() -> None:
    """The console script: the app, with a missing extra as one line and exit 2 instead of a traceback."""
    try:
        app()
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in CONTROLLER_ONLY:
            raise
        print(
            f"pdinfra: this command needs {top}, which the controller extra installs: "
            "pip install 'pdinfra[controller]'",
            file=sys.stderr,
        )
        sys.exit(2)
