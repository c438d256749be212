"""Gather everything pdinfra needs to know about one host into a single JSON-serialisable dict.

This file and its parts (facts_base, facts_gpu, facts_net) are also shipped to managed hosts as the Ansible
``module_utils/pdinfra_facts*.py`` and run there with the host's own python3 (3.10 or newer). They therefore import
only the standard library (and each other) at module level;
optional libraries (nvidia-ml-py's ``pynvml``, ``cuda.bindings``, ``pyroute2``) are imported inside the
functions that use them, and their absence is recorded as a fact instead of raised.

``gather(root)`` with ``root != "/"`` replays a recorded host: procfs/sysfs/etc/boot are read below ``root``,
the NVML/CUDA part comes from ``<root>/pdinfra-nvml.json``, command outputs from ``<root>/pdinfra-cmd/`` and
HTTP health probes from ``<root>/pdinfra-health.json``. The schema is documented in docs/facts.md.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

try:  # on a managed host: the module_utils files Ansible ships beside this one
    from ansible.module_utils.pdinfra_facts_base import (  # noqa: F401
        CMD_DIR,
        HEALTH_FILE,
        HEALTH_TIMEOUT_S,
        KERNEL_CONFIG_KEYS,
        KERNEL_LOG_COMMANDS,
        MAX_XID_ROWS,
        NVLINK_ERROR_TOTAL_FIELDS,
        NVLINK_VERSION_NAMES,
        NVML_RECORD_FILE,
        NVML_RECORD_FORMAT,
        PEERMEM_SYSFS,
        RDMA_PORT_COUNTERS,
        SCHEMA_VERSION,
        SECURE_BOOT_VAR,
        WATCHED_MODULES,
        Host,
        command_file_name,
        error_fact,
        normalise_bdf,
        parse_version_tuple,
        pci_aer,
    )
    from ansible.module_utils.pdinfra_facts_gpu import (  # noqa: F401
        add_sysfs_pcie,
        decode_clock_reasons,
        fabric_manager,
        gpus_live,
        gpus_replay,
        nvidia_driver,
        nvml_field_values,
        parse_nvidia_version,
        pci_nvidia,
        pcie_acs,
        write_nvml_record,
    )
    from ansible.module_utils.pdinfra_facts_net import (  # noqa: F401
        all_qos,
        gid_ipv4,
        netdevs,
        parse_env_file,
        parse_ibv_fw,
        parse_ucx_info,
        parse_ucx_version,
        rdma,
        ucx,
    )
except ImportError:  # pdinfra itself (the controller, `pdinfra facts`)
    from pdinfra.host.facts_base import (  # noqa: F401
        CMD_DIR,
        HEALTH_FILE,
        HEALTH_TIMEOUT_S,
        KERNEL_CONFIG_KEYS,
        KERNEL_LOG_COMMANDS,
        MAX_XID_ROWS,
        NVLINK_ERROR_TOTAL_FIELDS,
        NVLINK_VERSION_NAMES,
        NVML_RECORD_FILE,
        NVML_RECORD_FORMAT,
        PEERMEM_SYSFS,
        RDMA_PORT_COUNTERS,
        SCHEMA_VERSION,
        SECURE_BOOT_VAR,
        WATCHED_MODULES,
        Host,
        command_file_name,
        error_fact,
        normalise_bdf,
        parse_version_tuple,
        pci_aer,
    )
    from pdinfra.host.facts_gpu import (  # noqa: F401
        add_sysfs_pcie,
        decode_clock_reasons,
        fabric_manager,
        gpus_live,
        gpus_replay,
        nvidia_driver,
        nvml_field_values,
        parse_nvidia_version,
        pci_nvidia,
        pcie_acs,
        write_nvml_record,
    )
    from pdinfra.host.facts_net import (  # noqa: F401
        all_qos,
        gid_ipv4,
        netdevs,
        parse_env_file,
        parse_ibv_fw,
        parse_ucx_info,
        parse_ucx_version,
        rdma,
        ucx,
    )


# --------------------------------------------------------------------------- OS, kernel, boot


def os_release(host: Host) -> dict[str, Any]:
    text = host.read("etc/os-release") or host.read("usr/lib/os-release")
    if text is None:
        return {"present": False, "reason": "no /etc/os-release"}
    data: dict[str, Any] = {"present": True}
    for raw in text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if sep and key and not key.startswith("#"):
            data[key.lower()] = value.strip().strip('"').strip("'")
    return data


def parse_kernel_config(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"#\s*(CONFIG_\w+) is not set", line)
        if m:
            values[m.group(1)] = "n"
            continue
        key, sep, value = line.partition("=")
        if sep and key.startswith("CONFIG_"):
            values[key] = value.strip('"')
    return values


def kernel(host: Host) -> dict[str, Any]:
    release = host.line("proc/sys/kernel/osrelease")
    if release is None and host.live:
        release = os.uname().release
    data: dict[str, Any] = {
        "release": release,
        "version": parse_version_tuple(release or ""),
        "config_source": None,
        "config": {},
    }
    text: str | None = None
    raw = host.read_bytes("proc/config.gz")
    if raw is not None:
        try:
            text = gzip.decompress(raw).decode("utf-8", "replace")
            data["config_source"] = "/proc/config.gz"
        except (OSError, EOFError):
            text = None
    if text is None and release:
        text = host.read(f"boot/config-{release}")
        if text is not None:
            data["config_source"] = f"/boot/config-{release}"
    if text is not None:
        parsed = parse_kernel_config(text)
        data["config"] = {k: parsed[k] for k in KERNEL_CONFIG_KEYS if k in parsed}
    else:
        data["config_reason"] = "neither /proc/config.gz nor /boot/config-<release> is readable"
    return data


def boot(host: Host) -> dict[str, Any]:
    cmdline = host.line("proc/cmdline")
    tokens = cmdline.split() if cmdline else []
    iommu_flags = [t for t in tokens if "iommu" in t.lower()]
    units = host.listdir("sys/class/iommu")
    if units is None:
        mode = "unknown"
    elif any(t in ("iommu=pt", "iommu.passthrough=1") for t in tokens):
        mode = "passthrough"
    elif any(t in ("intel_iommu=off", "amd_iommu=off", "iommu=off") for t in tokens) or not units:
        mode = "off"
    else:
        mode = "translated"
    return {
        "cmdline": cmdline,
        "iommu": {"units": units, "cmdline_flags": iommu_flags, "mode": mode},
        "secure_boot": secure_boot(host),
    }


def secure_boot(host: Host) -> str:
    if not host.exists("sys/firmware"):
        return "unknown"  # a recorded tree without /sys/firmware: not recorded, not "legacy boot"
    if not host.exists("sys/firmware/efi"):
        return "no EFI"
    raw = host.read_bytes(f"sys/firmware/efi/efivars/{SECURE_BOOT_VAR}")
    if raw is None or len(raw) < 5:
        return "unknown"
    return "enabled" if raw[4] == 1 else "disabled"


def modules(host: Host) -> dict[str, Any]:
    text = host.read("proc/modules")
    peermem_sysfs = next((f"/{p}" for p in PEERMEM_SYSFS if host.exists(p)), None)
    if text is None:
        return {"available": False, "reason": "no /proc/modules", "peermem_sysfs": peermem_sysfs}
    names = sorted({ln.split()[0] for ln in text.splitlines() if ln.strip()})
    return {
        "available": True,
        "count": len(names),
        "loaded": {m: m in names for m in WATCHED_MODULES},
        "peermem_sysfs": peermem_sysfs,
    }


# --------------------------------------------------------------------------- kernel log (Xid events)

# 'NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.' (older drivers: no 'PCI:', or a function)
XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.([0-7]))?\): (\d+),?\s*(.*)"
)
# 'nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt': one event is
# several lines with the same SXid (its severity line, then 'Severity ...' and 'Data {...}'); the severity line is
# the event.
SXID_RE = re.compile(
    r"nvidia-nvswitch(\d+): SXid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.([0-7]))?\): "
    r"(\d+), (Fatal|Non-fatal),?\s*(.*)"
)
# A kernel message line as journalctl -o short-iso, dmesg or syslog print it.
LOG_LINE_RE = re.compile(r"^(?:\d{4}-\d\d-\d\dT\S+\s|\[\s*\d+\.\d+\]|\w{3} [ \d]\d \d\d:\d\d:\d\d )")
LOG_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\S+)|^\[\s*(\d+\.\d+)\]|^(\w{3} [ \d]\d \d\d:\d\d:\d\d)")


def parse_xid_lines(text: str) -> list[dict[str, Any]]:
    """Kernel log text -> one {bdf, xid, text, time} row per NVIDIA Xid event, in log order."""
    rows = []
    for line in text.splitlines():
        m = XID_RE.search(line)
        if not m:
            continue
        t = LOG_TIME_RE.match(line.strip())
        when = None if t is None else t.group(1) or (f"{t.group(2)} s after boot" if t.group(2) else t.group(3))
        rows.append(
            {
                "bdf": normalise_bdf(f"{m.group(1)}.{m.group(2) or '0'}"),
                "xid": int(m.group(3)),
                "text": m.group(4).strip()[:300],
                "time": when,
            }
        )
    return rows


def parse_sxid_lines(text: str) -> list[dict[str, Any]]:
    """Kernel log text -> one {switch, bdf, sxid, fatal, text, time} row per NVSwitch SXid event, in log order."""
    rows = []
    for line in text.splitlines():
        m = SXID_RE.search(line)
        if not m:
            continue
        t = LOG_TIME_RE.match(line.strip())
        when = None if t is None else t.group(1) or (f"{t.group(2)} s after boot" if t.group(2) else t.group(3))
        rows.append(
            {
                "switch": int(m.group(1)),
                "bdf": normalise_bdf(f"{m.group(2)}.{m.group(3) or '0'}"),
                "sxid": int(m.group(4)),
                "fatal": m.group(5) == "Fatal",
                "text": m.group(6).strip()[:300],
                "time": when,
            }
        )
    return rows


def kernel_log(host: Host) -> dict[str, Any]:
    """The NVIDIA Xid and NVSwitch SXid events of this boot, from ``journalctl -k -b`` (else ``dmesg``; replayed from
    ``pdinfra-cmd/``). ``readable`` is False when neither printed a single kernel message line (not installed, not
    permitted, not recorded): no Xid then means "not known", never "none"."""
    tried = []
    for argv in KERNEL_LOG_COMMANDS:
        found, out = host.run(list(argv))
        if not found:
            where = "on PATH" if host.live else f"recorded ({CMD_DIR}/{command_file_name(list(argv))})"
            tried.append(f"{argv[0]} not {where}")
            continue
        lines = sum(1 for line in out.splitlines() if LOG_LINE_RE.match(line))
        if not lines:
            first = next((line.strip() for line in out.splitlines() if line.strip()), "no output")
            tried.append(f"{argv[0]}: {first[:160]}")
            continue
        xids = parse_xid_lines(out)
        sxids = parse_sxid_lines(out)
        return {
            "readable": True,
            "source": " ".join(argv),
            "lines": lines,
            "xids": xids[-MAX_XID_ROWS:],
            "xids_dropped": max(0, len(xids) - MAX_XID_ROWS),
            "sxids": sxids[-MAX_XID_ROWS:],
            "sxids_dropped": max(0, len(sxids) - MAX_XID_ROWS),
        }
    return {"readable": False, "source": None, "reason": "; ".join(tried), "xids": [], "sxids": []}


# --------------------------------------------------------------------------- serving instances, expectations


def _probe(port: int, host: str = "127.0.0.1") -> str:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=HEALTH_TIMEOUT_S) as resp:
            return "ok" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except Exception as exc:
        return f"unreachable: {error_fact(exc)}"


# Files the vllm_instance role writes beside the instance descriptors (<name>.json) that are not descriptors: the KV
# reuse tier's store client file (LMCache's are .yaml).
NOT_DESCRIPTORS = (".kv-store.json",)


def instances(host: Host) -> list[dict[str, Any]]:
    recorded: dict[str, Any] = {}
    if not host.live:
        try:
            recorded = json.loads(host.read(HEALTH_FILE) or "{}")
        except ValueError:
            recorded = {}
    result = []
    for path in sorted(glob.glob(host.path("etc/pdinfra/instances/*.json"))):
        if path.endswith(NOT_DESCRIPTORS):  # the files vllm_instance writes beside each descriptor
            continue
        rel = "/" + os.path.relpath(path, host.root)
        try:
            with open(path, encoding="utf-8") as fh:
                inst = json.load(fh)
            if not isinstance(inst, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            result.append({"file": rel, "error": error_fact(exc), "health": "unknown"})
            continue
        inst["file"] = rel
        port = inst.get("port")
        if not isinstance(port, int):
            inst["health"] = "no port"
        elif host.live:
            # Instances listen on the node's cluster address (older deployments on 0.0.0.0: loopback works too).
            inst["health"] = _probe(port, str(inst.get("side_channel_host") or "127.0.0.1"))
        else:
            status = recorded.get(str(port))
            inst["health"] = (
                "ok"
                if status == 200
                else f"HTTP {status}"
                if isinstance(status, int)
                else status
                if status
                else "not probed"
            )
        result.append(inst)
    return result


# What vLLM's run-time compilers call: torch inductor's C++ backend (vLLM CPU: the sampler's logprobs kernels) looks
# for g++ (torch._inductor.config.cpp.cxx), Triton (vLLM GPU) for a C compiler (gcc/cc) and Python.h for its launcher.
TOOLCHAIN_COMMANDS = ("g++", "gcc")


def toolchain(host: Host) -> dict[str, Any]:
    """The compilers and Python headers on this host. ``known`` is False for a recorded tree without a record of them
    (``pdinfra-cmd/g___--version.txt`` and ``gcc_--version.txt``, empty when the command was not installed)."""
    compilers: dict[str, str | None] = {}
    recorded = host.live
    for name in TOOLCHAIN_COMMANDS:
        found, out = host.run([name, "--version"])
        if not host.live and host.exists(f"{CMD_DIR}/{command_file_name([name, '--version'])}"):
            recorded = True
        first = out.strip().splitlines()[0] if found and out.strip() else ""
        compilers[name] = first if first and not first.startswith("error:") else None
    headers = sorted("/" + os.path.relpath(p, host.root) for p in glob.glob(host.path("usr/include/python3*/Python.h")))
    return {"known": recorded, "compilers": compilers, "python_headers": headers}


PROBE_DIR = "var/lib/pdinfra/probe"
PROBE_TIMER = "etc/systemd/system/pdinfra-probe.timer"


def deep_health(host: Host) -> dict[str, Any]:
    """The deep-health probe's last result on this node (pdinfra.serving.probe, run by pdinfra-probe.timer)."""
    timer = host.read(PROBE_TIMER)
    if timer is None:
        return {"deployed": False}
    m = re.search(r"^OnUnitActiveSec=(\d+)s?\s*$", timer, re.M)
    out: dict[str, Any] = {"deployed": True, "interval_s": int(m.group(1)) if m else None, "last": None}
    text = host.read(f"{PROBE_DIR}/last.json")
    if text is None:
        return out
    try:
        last = json.loads(text)
        if not isinstance(last, dict) or not isinstance(last.get("paths"), list):
            raise ValueError("not a probe result")
    except ValueError as exc:
        return out | {"error": f"/{PROBE_DIR}/last.json: {error_fact(exc)}"}
    out["last"] = last
    if host.live and isinstance(last.get("started"), (int, float)):
        out["age_s"] = round(time.time() - float(last["started"]), 1)
    return out


def declared_expect(host: Host) -> dict[str, Any] | None:
    text = host.read("etc/pdinfra/expect.json")
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        return {"_error": f"unreadable /etc/pdinfra/expect.json: {exc}"}
    return data if isinstance(data, dict) else {"_error": "/etc/pdinfra/expect.json is not a JSON object"}


# --------------------------------------------------------------------------- entry point


def gather(root: str = "/", *, nvml: bool = True) -> dict[str, Any]:
    """Gather all facts about the host at ``root`` ("/" = this machine, anything else = a recorded tree)."""
    host = Host(root)
    errors: list[str] = []

    def section(name: str, fn: Callable[[], Any], fallback: Any) -> Any:
        try:
            return fn()
        except Exception as exc:  # a fact-gathering bug must never hide the other facts
            errors.append(f"{name}: {error_fact(exc)}")
            return fallback

    if not nvml:
        gpus: dict[str, Any] = {"present": False, "reason": "NVML query disabled (nvml=False)"}
    elif host.live:
        gpus = section("gpus", gpus_live, {"present": False, "reason": "NVML query crashed"})
    else:
        gpus = section("gpus", lambda: gpus_replay(host), {"present": False, "reason": "bad NVML record"})
    section("gpus.sysfs", lambda: add_sysfs_pcie(host, gpus), None)

    rdma_facts = section("rdma", lambda: rdma(host), {"present": False, "devices": []})
    pci = section("pci", lambda: pci_nvidia(host), {"available": False, "reason": "sysfs PCI scan crashed"})
    name_file = None if host.live else host.line("etc/hostname")
    hostname = socket.gethostname() if host.live else name_file or os.path.basename(host.root)
    return {
        "schema": SCHEMA_VERSION,
        "mode": "live" if host.live else "replay",
        "root": host.root,
        "hostname": hostname,
        "gathered_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "os": section("os", lambda: os_release(host), {}),
        "kernel": section("kernel", lambda: kernel(host), {}),
        "boot": section("boot", lambda: boot(host), {}),
        "nvidia_driver": section("nvidia_driver", lambda: nvidia_driver(host), {"loaded": False}),
        "modules": section("modules", lambda: modules(host), {"available": False}),
        "gpus": gpus,
        "pci": pci,
        "pcie_acs": section("pcie_acs", lambda: pcie_acs(host, gpus, pci, rdma_facts), {"failed": True}),
        "fabric_manager": section("fabric_manager", lambda: fabric_manager(host), {"installed": False}),
        "rdma": rdma_facts,
        "kernel_log": section("kernel_log", lambda: kernel_log(host), {"readable": False, "xids": []}),
        "roce_qos": section("roce_qos", lambda: all_qos(host, rdma_facts), {}),
        "netdevs": section("netdevs", lambda: netdevs(host), {"interfaces": {}}),
        "ucx": section("ucx", lambda: ucx(host), {"available": False, "transports": {}}),
        "toolchain": section("toolchain", lambda: toolchain(host), {"known": False, "compilers": {}}),
        "instances": section("instances", lambda: instances(host), []),
        "expect": section("expect", lambda: declared_expect(host), None),
        "deep_health": section("deep_health", lambda: deep_health(host), {"deployed": False}),
        "errors": errors,
    }


def main(argv: list[str] | None = None) -> int:
    """``python3 -m pdinfra.host.facts [-o FILE] [ROOT]``: the facts as JSON, the same as ``pdinfra facts`` writes
    (standard library only: a bare node with pdinfra's checkout, or its ``pdinfra/`` directory, on PYTHONPATH runs
    it; tests/unit/test_first_day.py runs it in an interpreter that has nothing else)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python3 -m pdinfra.host.facts", description="Gather a host's facts as JSON.")
    ap.add_argument("root", nargs="?", default="/", help="host tree to read ('/': this machine)")
    ap.add_argument("-o", "--output", help="write the JSON to this file instead of standard output")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    text = json.dumps(gather(args.root), indent=1, sort_keys=True) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"facts written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
