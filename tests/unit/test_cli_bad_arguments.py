"""No `pdinfra` command answers bad arguments with a traceback: exit 2 and a one-line reason, before any host
or network is touched."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pdinfra.cli import app

CASES = [
    "bench plan --concurrency banana",
    "bench plan --isl -5",
    "bench report /nonexistent-run",
    "bench run --plan nosuch",
    "bench run --concurrency x",
    "smoke --max-tokens 0",
    "probe --timeout 0",
    "probe --instance decode9",
    "probe -i /nonexistent-inventory",
    "check-config -i /nonexistent-inventory",
    "validate --facts /nonexistent-facts.json",
    "validate --expect /nonexistent-expect.json",
    "validate --peer root@198.18.0.12",
    "validate --fleet-margin banana",
    "validate --transfer-report /nonexistent-transfer.json",
    "facts --root /nonexistent-tree",
    "transfer --sizes banana",
    "transfer --block-size 0",
    "transfer --gpus x",
    "transfer --model-shape foo",
    "transfer --iters 0",
    "transfer --layouts trace",
    "transfer --layouts trace:/nonexistent-trace.jsonl",
    "transfer --layouts zigzag",
    "kv-trace show /nonexistent-trace.jsonl",
    "hosts status -i /nonexistent-inventory",
    "plan --profile /nonexistent-profile.json --rate 1",
    "plan --profile /nonexistent-profile.json --rate 1 --isl 8 --osl 8",
    "plan --profile /nonexistent-profile.json --from-prometheus http://127.0.0.1:9 --horizon fortnight",
    "plan --profile /nonexistent-profile.json --rate 1 --isl 8 --osl 8 --layout mixed",
    "bench profile /nonexistent-run -o /nonexistent-dir/profile.json",
]


@pytest.mark.parametrize("line", CASES)
def test_bad_arguments_exit_2_without_a_traceback(line):
    res = CliRunner().invoke(app, line.split())
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output and not isinstance(res.exception, (KeyError, TypeError, AttributeError))
