"""Mutation testing of the host check catalog and the cluster resolver: does a test notice a wrong rule?

Each mutant changes one thing in one module: a comparison (``<`` for ``<=``, ``==`` for ``!=``, ...), a number
(a threshold, a limit, an index), a boolean operator (``and`` for ``or``), a ``not`` dropped, or a verdict
(``fail`` for ``warn``, ``warn`` for ``ok``, ``ok`` for ``warn``). The mutated module replaces the original in a
copy of the package, and the unit tests that guard that module run against the copy (``pytest -x``); a mutant is
*killed* when they fail (or hang past the timeout) and *survives* when they pass. The kill rate and every survivor,
with its line, go to the report: a survivor is a test to write, or a mutation that changes nothing observable
(an equivalent mutant), and the report says which.

    .venv/bin/python benchmarks/mutation.py --out docs/runs/2026-12-06-mutation [--group checks] [--sample 0]

Runs two mutants at a time (2 cores); about 2 s a mutant. Sites are enumerated in source order; ``--sample N``
takes N per group with a fixed seed (0: all). The figures are a record (docs/testing.md quotes them), not a test.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUPS = {
    "checks": (
        sorted(str(p.relative_to(REPO)) for p in (REPO / "pdinfra/host/checks").glob("*.py")
               if p.name not in ("__init__.py", "registry.py", "fleet.py")),  # fmt: skip
        ["tests/unit/test_check_fail_paths.py", "tests/unit/test_checks.py", "tests/unit/test_health_checks.py"],
    ),
    "resolve": (
        ["pdinfra/cluster/resolve.py", "pdinfra/cluster/resolve_hosts.py", "pdinfra/cluster/resolve_services.py"],
        ["tests/unit/test_cluster_resolve.py", "tests/unit/test_resolve_fuzz.py",
         "tests/unit/test_cluster_expectations.py"],
    ),
}  # fmt: skip
CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}  # fmt: skip
VERDICT_SWAP = {"fail": "warn", "warn": "ok", "ok": "warn"}


@dataclass
class Mutant:
    file: str
    line: int
    kind: str
    what: str
    index: int  # the site's number in the file's walk: the transformer finds it again
    status: str = ""
    seconds: float = 0.0


def _docstring_ids(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str, str]]:
    """(node, kind, description) of every place a mutant can change, in walk order."""
    docs = _docstring_ids(tree)
    out: list[tuple[ast.AST, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in CMP_SWAP:
            op = type(node.ops[0])
            out.append((node, "compare", f"{op.__name__} -> {CMP_SWAP[op].__name__}"))
        elif isinstance(node, ast.BoolOp):
            other = "Or" if isinstance(node.op, ast.And) else "And"
            out.append((node, "boolop", f"{type(node.op).__name__} -> {other}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, "not", "drop not"))
        elif (
            isinstance(node, ast.Constant)
            and id(node) not in docs
            and type(node.value) in (int, float)
            and not isinstance(node.value, bool)
        ):
            out.append((node, "number", f"{node.value!r} -> {_bump(node.value)!r}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in VERDICT_SWAP:
            out.append((node, "verdict", f"{node.func.id} -> {VERDICT_SWAP[node.func.id]}"))
    return out


def _bump(v: int | float) -> int | float:
    if isinstance(v, int):
        return v + 1
    return v * 1.5 if v else 0.5


def _apply(node: ast.AST, kind: str) -> None:
    if kind == "compare":
        node.ops[0] = CMP_SWAP[type(node.ops[0])]()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "number":
        node.value = _bump(node.value)
    elif kind == "verdict":
        node.func.id = VERDICT_SWAP[node.func.id]


def _mutated_source(source: str, index: int) -> str:
    tree = ast.parse(source)
    node, kind, _ = _sites(tree)[index]
    if kind == "not":  # replace the UnaryOp by its operand: find its parent
        for parent in ast.walk(tree):
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, node.operand)
                elif isinstance(value, list) and node in value:
                    value[value.index(node)] = node.operand
    else:
        _apply(node, kind)
    return ast.unparse(ast.fix_missing_locations(tree))


def enumerate_mutants(files: list[str]) -> list[Mutant]:
    out = []
    for f in files:
        tree = ast.parse((REPO / f).read_text())
        for i, (node, kind, what) in enumerate(_sites(tree)):
            out.append(Mutant(f, getattr(node, "lineno", 0), kind, what, i))
    return out


def _workspace(root: Path) -> None:
    """A copy of the package, everything else of the checkout linked (tests, roles, inventories: pdinfra.paths finds
    them beside the package): pytest runs from here, so ``pdinfra`` is the copy."""
    shutil.copytree(REPO / "pdinfra", root / "pdinfra", ignore=shutil.ignore_patterns("__pycache__"))
    for entry in REPO.iterdir():
        if entry.name not in ("pdinfra", ".git", ".venv", "out") and not (root / entry.name).exists():
            (root / entry.name).symlink_to(entry)


def _pytest(root: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    env = dict(
        os.environ,
        PYTHONPATH=str(root),
        PYTHONDONTWRITEBYTECODE="1",
        PDINFRA_STATE_DIR=str(REPO / "out" / "check-state"),
    )
    t0 = time.monotonic()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.monotonic() - t0
    return ("survived" if res.returncode == 0 else "killed"), time.monotonic() - t0


def run_one(m: Mutant, tests: list[str], timeout: float) -> Mutant:
    with tempfile.TemporaryDirectory(prefix="pdinfra-mut-") as tmp:
        root = Path(tmp)
        _workspace(root)
        src = (REPO / m.file).read_text()
        (root / m.file).write_text(_mutated_source(src, m.index))
        m.status, m.seconds = _pytest(root, tests, timeout)
    return m


def baseline(files: list[str], tests: list[str], timeout: float) -> str:
    """The tests pass on the copy with every module only re-printed by ast.unparse (no mutation), and fail on a
    copy whose target module raises at import: the copy, not the checkout, is what they import."""
    with tempfile.TemporaryDirectory(prefix="pdinfra-mut-") as tmp:
        root = Path(tmp)
        _workspace(root)
        for f in files:
            (root / f).write_text(ast.unparse(ast.parse((REPO / f).read_text())))
        clean, _ = _pytest(root, tests, timeout)
        (root / files[0]).write_text("raise ImportError('mutation baseline')\n")
        broken, _ = _pytest(root, tests, timeout)
    if clean != "survived" or broken == "survived":
        raise SystemExit(f"baseline: unmutated {clean}, import error {broken}: the runner does not test the copy")
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", choices=sorted(GROUPS), action="append", help="default: every group")
    ap.add_argument("--sample", type=int, default=0, help="mutants per group, fixed seed (0: all)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--out", type=Path, required=True, help="directory for mutation.json and mutation.md")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[Mutant]] = {}
    for group in args.group or sorted(GROUPS):
        files, tests = GROUPS[group]
        baseline(files, tests, args.timeout)
        mutants = enumerate_mutants(files)
        total = len(mutants)
        if args.sample and args.sample < total:
            mutants = sorted(random.Random(20261206).sample(mutants, args.sample), key=lambda m: (m.file, m.line))
        print(f"{group}: {len(mutants)} of {total} mutants, tests: {' '.join(tests)}", flush=True)
        done: list[Mutant] = []
        with cf.ThreadPoolExecutor(args.jobs) as pool:
            futs = [pool.submit(run_one, copy.copy(m), tests, args.timeout) for m in mutants]
            for n, fut in enumerate(cf.as_completed(futs), 1):
                m = fut.result()
                done.append(m)
                if m.status == "survived":
                    print(f"  [{n}/{len(mutants)}] SURVIVED {m.file}:{m.line} {m.kind} {m.what}", flush=True)
                elif n % 20 == 0:
                    print(f"  [{n}/{len(mutants)}] ...", flush=True)
        results[group] = sorted(done, key=lambda m: (m.file, m.line, m.index))
        write(args.out, results)


def write(out: Path, results: dict[str, list[Mutant]]) -> None:
    """mutation.json and mutation.md, merged with the groups an earlier run wrote there."""
    path = out / "mutation.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data |= {g: [asdict(m) for m in ms] for g, ms in results.items()}
    path.write_text(json.dumps(data, indent=1) + "\n")
    lines = ["| group | mutants | killed | survived | kill rate |", "| --- | --- | --- | --- | --- |"]
    for g, ms in sorted(data.items()):
        killed = sum(m["status"].startswith("killed") for m in ms)
        lines.append(f"| {g} | {len(ms)} | {killed} | {len(ms) - killed} | {killed / max(len(ms), 1):.0%} |")
    lines += ["", "Survivors:", ""]
    lines += [
        f"- {g}: `{m['file']}:{m['line']}` {m['kind']} {m['what']}"
        for g, ms in sorted(data.items())
        for m in ms
        if m["status"] == "survived"
    ]
    (out / "mutation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
