"""DCGM's own diagnostic (``dcgmi diag -r LEVEL -j``) as one acceptance check, where DCGM is installed.

The nvidia_driver role installs DCGM on request (``nvidia_driver_dcgm: true``, from the CUDA repository it already
configures). ``pdinfra validate --acceptance`` then runs ``dcgmi diag`` at ``--acceptance-dcgm-level`` (1 by
default: deployment checks, seconds; 2 adds short PCIe/memory/targeted tests, about 2 minutes; 0 skips it) and judges
what it printed:

- fail when any test result is FAIL, warn when one is WARN (DCGM's own words quoted), pass when every test ran and
  passed (SKIPPED tests are listed, not counted);
- n/a without ``dcgmi`` on PATH; a warn ("cannot verify"), never a pass, when dcgmi ran but printed no test result
  (the host engine not running, an unsupported GPU, output in an unknown shape).

The JSON shape is DCGM 3's (``"DCGM GPU Diagnostic" > test_categories[] > tests[] > results[]`` with ``gpu_ids``
and ``status``, as DCGM's nvvs JsonOutput writes it); DCGM 4 also puts ``tests`` at the top of the document, and its
root may be ``"DCGM Diagnostic"``: the document is walked for both. Status words are compared case-blind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from pdinfra.host.checks import CheckResult

PASS, WARN, FAIL, NA = "pass", "warn", "fail", "n/a"
CHECK_ID = "accept.dcgm_diag"
TITLE = "DCGM diagnostic (dcgmi diag)"
REMEDY_INSTALL = "set nvidia_driver_dcgm: true and converge the host layer (installs DCGM and starts nvidia-dcgm)"
REMEDY_FAIL = (
    "run `dcgmi diag -r 3 -i <gpu>` on the failing GPU for detail; drain the node; follow NVIDIA's DCGM diagnostic "
    "guide for the failing test (reseat or replace the GPU, update the VBIOS, RMA)"
)
REMEDY_UNKNOWN = "start the DCGM host engine (systemctl start nvidia-dcgm) and run `dcgmi diag -r 1 -j` by hand"
STATUS = {"pass": PASS, "passed": PASS, "fail": FAIL, "failed": FAIL, "warn": WARN, "warning": WARN,
          "skip": "skip", "skipped": "skip", "not run": "skip", "notrun": "skip"}  # fmt: skip


def diag_argv(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(level), "-j"]


def _document(text: str) -> dict[str, Any] | None:
    """The JSON object dcgmi printed (it may print warnings before it)."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def parse(text: str) -> dict[str, Any] | None:
    """``{"version", "tests": {name: {"status", "gpus", "messages"}}}`` from dcgmi's output; None when it holds no
    test result. A test's status is its worst result's (fail > warn > pass > skip); an unknown word counts as warn."""
    doc = _document(text or "")
    if doc is None:
        return None
    root = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") or doc
    if not isinstance(root, dict):
        return None
    tests: list[dict[str, Any]] = []
    for cat in root.get("test_categories") or []:
        if isinstance(cat, dict):
            tests += [t for t in cat.get("tests") or [] if isinstance(t, dict)]
    tests += [t for t in root.get("tests") or [] if isinstance(t, dict)]
    rank = {FAIL: 3, WARN: 2, PASS: 1, "skip": 0}
    out: dict[str, dict[str, Any]] = {}
    for test in tests:
        name = str(test.get("name") or "?")
        for res in test.get("results") or []:
            if not isinstance(res, dict):
                continue
            word = str(res.get("status") or "").strip().lower()
            status = STATUS.get(word, WARN)
            entry = out.setdefault(name, {"status": "skip", "gpus": [], "messages": []})
            if rank[status] > rank[entry["status"]]:
                entry["status"] = status
            gpu = res.get("gpu_ids", res.get("entity_id"))
            if gpu is not None and status in (FAIL, WARN):
                entry["gpus"].append(str(gpu))
            if word not in STATUS:
                entry["messages"].append(f"unknown status {res.get('status')!r}")
            for key in ("warnings", "info"):
                items = res.get(key)
                items = items if isinstance(items, list) else [items] if items else []
                for w in items:
                    msg = w.get("warning") or w.get("message") if isinstance(w, dict) else w
                    if msg and status in (FAIL, WARN):
                        entry["messages"].append(str(msg).strip())
    if not out:
        return None
    return {"version": root.get("version"), "tests": out}


def section(
    level: int,
    which: Callable[[str], str | None] = shutil.which,
    execute: Callable[[list[str], float], tuple[int, str]] | None = None,
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Run dcgmi diag when it is installed and level > 0: the report's ``dcgm`` section."""
    argv = diag_argv(level)
    if level <= 0:
        return {"level": level, "skipped": "--acceptance-dcgm-level 0"}
    if not which("dcgmi"):
        return {"level": level, "missing": True}
    execute = execute or _execute
    rc, text = execute(argv, timeout_s)
    return {"level": level, "command": " ".join(argv), "rc": rc, "output": text[-20000:], "parsed": parse(text)}


def _execute(argv: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, f"dcgmi diag did not finish in {timeout_s:.0f} s"
    except OSError as exc:
        return 127, str(exc)
    return res.returncode, res.stdout + ("\n" + res.stderr if res.stderr else "")


def to_check(sec: dict[str, Any], host: str) -> CheckResult | None:
    """The section judged; None when it was skipped on purpose (level 0)."""
    if sec.get("skipped"):
        return None
    if sec.get("missing"):
        return _result(NA, "dcgmi is not installed: DCGM's diagnostic not run", REMEDY_INSTALL, host)
    parsed = sec.get("parsed")
    level = sec.get("level")
    if not parsed:
        said = " ".join(str(sec.get("output") or "").split())[:300] or "no output"
        return _result(
            WARN,
            f"cannot verify: `{sec.get('command')}` exited {sec.get('rc')} with no test result: {said}",
            REMEDY_UNKNOWN,
            host,
        )
    tests = parsed["tests"]
    bad = {n: t for n, t in tests.items() if t["status"] in (FAIL, WARN)}
    skipped = sorted(n for n, t in tests.items() if t["status"] == "skip")
    version = f"DCGM {parsed['version']}, " if parsed.get("version") else ""
    head = f"{version}level {level}: {len(tests) - len(bad) - len(skipped)} of {len(tests)} tests passed"
    tail = f"; skipped: {', '.join(skipped)}" if skipped else ""
    if not bad:
        return _result(PASS, head + tail, "", host)
    words = []
    for name, t in sorted(bad.items(), key=lambda kv: kv[1]["status"] != FAIL):
        gpus = f" (GPU {', '.join(t['gpus'])})" if t["gpus"] else ""
        msg = f": {t['messages'][0][:200]}" if t["messages"] else ""
        words.append(f"{name} {t['status'].upper()}{gpus}{msg}")
    verdict = FAIL if any(t["status"] == FAIL for t in bad.values()) else WARN
    return _result(verdict, f"{head}; " + "; ".join(words) + tail, REMEDY_FAIL, host)


def _result(verdict: str, evidence: str, remedy: str, host: str) -> CheckResult:
    return CheckResult(
        id=CHECK_ID, layer="acceptance", title=TITLE, verdict=verdict, evidence=evidence, remedy=remedy, host=host
    )
