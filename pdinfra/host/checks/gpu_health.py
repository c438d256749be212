"""GPU health (ECC, HBM repair, clocks, NVLink errors, Xid): what the field's acceptance gates
(azurehpc-health-checks, DCGM diag, GCM) look at first."""

from __future__ import annotations

import re
from typing import Any

from pdinfra.cluster.expect import Expect
from pdinfra.host.checks.common import gpu_name, join_items
from pdinfra.host.checks.registry import Facts, Outcome, check, devices_of, fail, na, ok, warn
from pdinfra.host.facts import decode_clock_reasons


def _health(d: dict[str, Any]) -> dict[str, Any]:
    return d.get("health") or {}


GPU_RESET = "drain the GPU (stop its instances), then `nvidia-smi -r -i <index>` or reboot the node"


@check("gpu.ecc", "ECC on, no uncorrectable memory error since boot", "gpu", gpu_only=True)
def gpu_ecc(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `gpus.devices[].health`: `ecc_mode`, `ecc_uncorrected` and `sram_uncorrected` {`volatile`, `aggregate`}
    (NVML)

    Rule: fail if an uncorrectable DRAM error, or SRAM error where NVML gives that count, was counted since boot
    (volatile > 0), or ECC is off where `ecc` is declared (also when it is on only after a reboot); warn if ECC is off
    and undeclared, if only the aggregate (lifetime) count is > 0, or if not recorded

    Remedy: reset the GPU (the row is remapped then); RMA on repeated errors; `nvidia-smi -e 1` and reboot
    """
    devices = devices_of(facts)
    off: list[str] = []
    pending_on, bad, past, unknown, seen, no_sram = [], [], [], [], [], []
    for d in devices:
        h, name = _health(d), gpu_name(d)
        mode = h.get("ecc_mode")
        dram, sram = h.get("ecc_uncorrected") or {}, h.get("sram_uncorrected") or {}
        if mode is False:
            (pending_on if h.get("ecc_mode_pending") else off).append(name)
            continue
        if mode is None or dram.get("volatile") is None:
            unknown.append(name)
            continue
        vol = int(dram["volatile"]) + int(sram.get("volatile") or 0)
        agg = int(dram.get("aggregate") or 0) + int(sram.get("aggregate") or 0)
        if vol:
            bad.append(f"{name}: {dram['volatile']} DRAM + {sram.get('volatile') or 0} SRAM uncorrectable since boot")
        elif agg:
            past.append(
                f"{name}: {agg} uncorrectable in its lifetime (aggregate: DRAM {dram.get('aggregate')}, "
                f"SRAM {sram.get('aggregate')}), none since boot"
            )
        seen.append(name.split()[0])
        if sram.get("volatile") is None:
            no_sram.append(name.split()[0])
    if bad:
        return fail(
            join_items(bad),
            f"An uncorrectable ECC error corrupted GPU memory: {GPU_RESET}; the driver remaps the "
            "row at the reset (gpu.row_remap). Repeated uncorrectable errors on one GPU: open an RMA.",
        )
    if off or pending_on:
        where = ", ".join(off + [f"{n} (on at the next reboot)" for n in pending_on])
        remedy = (
            "`nvidia-smi -e 1` then reboot (the pending ones only need the reboot): without ECC, HBM bit flips "
            "silently corrupt weights and KV caches."
        )
        if expect.ecc:
            return fail(f"ECC off on {where}; the hardware profile expects it on", remedy)
        if expect.ecc is None:
            return warn(f"ECC off on {where} (not declared either way)", remedy + " Or declare `ecc: false`.")
    if unknown:
        return warn(
            f"cannot verify: ECC mode or counters not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host (nvidia-ml-py); `nvidia-smi -q -d ECC` shows the same.",
        )
    if past:
        return warn(
            join_items(past),
            "Watch gpu.row_remap: a remapped row repaired it; more uncorrectable errors on one GPU "
            "mean an RMA (`nvidia-smi -q -d ECC,ROW_REMAPPER`).",
        )
    declared_off = f"; ECC off as declared on {', '.join(off + pending_on)}" if off or pending_on else ""
    memories = f"DRAM; NVML gives no SRAM count on {', '.join(no_sram)}" if no_sram else "DRAM and SRAM"
    return ok(f"ECC on, 0 uncorrectable since boot on {len(seen)} GPU(s) ({memories}){declared_off}")


@check("gpu.row_remap", "No HBM row remapping pending or failed", "gpu", gpu_only=True)
def gpu_row_remap(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `health.remapped_rows` {`corrected`, `uncorrected`, `pending`, `failure`}, `health.retired_pages_pending`
    (pre-Ampere; NotSupported, so null, on H100/H200)

    Rule: fail if a remap (or page retirement) is pending or remapping failed; pass with the counts where rows were
    remapped and nothing is pending; warn if not recorded

    Remedy: pending: drain and reset the GPU (`nvidia-smi -r`) or reboot; failure: RMA
    """
    devices = devices_of(facts)
    failed_, pending, unknown, counts = [], [], [], []
    for d in devices:
        h, name = _health(d), gpu_name(d)
        rows = h.get("remapped_rows")
        retired = h.get("retired_pages_pending")
        if rows is None and retired is None:
            unknown.append(name)
            continue
        if rows is not None:
            remapped = f"{rows.get('uncorrected')} uncorrectable + {rows.get('corrected')} correctable rows remapped"
            if rows.get("failure"):
                failed_.append(f"{name}: row remapping failed ({remapped})")
            if rows.get("pending"):
                pending.append(f"{name}: remap pending ({remapped})")
            if rows.get("corrected") or rows.get("uncorrected"):
                counts.append(f"{name.split()[0]}: {remapped}")
        if retired:
            pending.append(f"{name}: page retirement pending")
    if failed_ or pending:
        remedy = []
        if pending:
            remedy.append(f"A pending remap (or page retirement) takes effect at the next GPU reset: {GPU_RESET}.")
        if failed_:
            remedy.append(
                "A remapping failure means a bank ran out of spare rows: the GPU cannot repair its memory, "
                "open an RMA (NVIDIA's memory error management guide)."
            )
        return fail(join_items(failed_ + pending), " ".join(remedy))
    if unknown:
        return warn(
            f"cannot verify: remapped rows not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host; `nvidia-smi -q -d ROW_REMAPPER` shows the same.",
        )
    if counts:
        return ok(f"none pending or failed on {len(devices)} GPU(s); repaired before: {join_items(counts, 8)}")
    return ok(f"no row remapped, none pending, none failed on {len(devices)} GPU(s)")


# Clock event reasons (facts.CLOCK_EVENT_REASONS) that mean the hardware is protecting itself: HW slowdown (set by
# thermal or power-brake events: azurehpc-health-checks' check_gpu_clock_throttling flags it), HW thermal slowdown,
# HW power brake (the PSU/BMC asserted it).
CLOCKS_FAIL = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
CLOCKS_WARN = {"sw_thermal_slowdown"}
CLOCKS_FINE = {"gpu_idle", "applications_clocks_setting", "sw_power_cap", "sync_boost", "display_clock_setting"}


def _clock_names(h: dict[str, Any]) -> list[str] | None:
    mask = h.get("clock_event_reasons")
    if isinstance(mask, int):
        return decode_clock_reasons(mask)
    names = h.get("clock_event_names")
    return list(names) if isinstance(names, list) else None


@check("gpu.clocks", "No hardware clock slowdown (thermal, power brake)", "gpu", gpu_only=True)
def gpu_clocks(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `health.clock_event_reasons` (NVML bitmask, decoded as `clock_event_names`)

    Rule: fail on HW slowdown, HW thermal slowdown or HW power brake; warn on SW thermal slowdown or a bit pdinfra does
    not know; pass on idle, application clocks, SW power cap, sync boost; warn if not recorded

    Remedy: cooling, inlet temperature, BMC/PSU power events; RMA a GPU that alone runs hot
    """
    devices = devices_of(facts)
    hw, sw, odd, unknown, seen = [], [], [], [], set()
    for d in devices:
        names = _clock_names(_health(d))
        if names is None:
            unknown.append(gpu_name(d))
            continue
        seen.add(", ".join(names) or "none")
        if set(names) & CLOCKS_FAIL:
            hw.append(f"{gpu_name(d)}: {', '.join(names)}")
        elif set(names) & CLOCKS_WARN:
            sw.append(f"{gpu_name(d)}: {', '.join(names)}")
        elif set(names) - CLOCKS_FINE:
            odd.append(f"{gpu_name(d)}: {', '.join(names)}")
    if hw:
        return fail(
            join_items(hw),
            "The GPU slows its clocks to protect itself: check inlet temperature and fans "
            "(`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`), the BMC's power and PSU events (power brake), and "
            "reseat or RMA a GPU that alone runs hot; its throughput drops for every instance on it.",
        )
    if sw or odd:
        return warn(
            join_items(sw + odd),
            "Software thermal slowdown: the GPU is near its temperature limit; check cooling "
            "and the data-center inlet temperature (`nvidia-smi -q -d TEMPERATURE`).",
        )
    if unknown:
        return warn(
            f"cannot verify: clock event reasons not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host; `nvidia-smi -q -d PERFORMANCE` shows the same.",
        )
    return ok(f"{len(devices)} GPU(s), active reasons: {'; '.join(sorted(seen))}")


NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


def _nvlink_counts(d: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, int | None]]]]:
    """('link', [(where, counters)] per active link), or ('gpu', [(GPU, totals)]) where no link had its counters."""
    links = [
        (f"{gpu_name(d)} link {lk.get('link')}", lk.get("errors") or {})
        for lk in d.get("nvlinks") or []
        if lk.get("active")
    ]
    if any(v is not None for _, c in links for v in c.values()):
        return "link", links
    totals = _health(d).get("nvlink_errors_total") or {}
    return "gpu", [(gpu_name(d), totals)] if any(v is not None for v in totals.values()) else []


@check("gpu.nvlink_errors", "NVLink error counters below the thresholds (recovery, CRC, replay)", "gpu", gpu_only=True)
def gpu_nvlink_errors(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `nvlinks[].errors` {`replay`, `recovery`, `crc_flit`, `crc_data`} of active links;
    `health.nvlink_errors_total` (field values) where no link has them

    Rule: fail if recovery > `nvlink_recovery_max` or CRC data > `nvlink_crc_data_max` on a link; warn if replay >
    `nvlink_replay_max`, or not recorded; CRC flit is reported only; n/a for PCIe-only GPUs

    Remedy: `nvidia-smi nvlink -e`, `dcgmi diag -r 3`; power cycle; baseboard RMA
    """
    devices = devices_of(facts)
    if not any(d.get("nvlinks") for d in devices) and expect.nvlinks_per_gpu is None:
        return na("no NVLinks reported and none declared (PCIe-only GPUs)")
    bad, noisy, unknown, total, links = [], [], [], dict.fromkeys(NVLINK_COUNTERS, 0), 0
    # a GPU without an active link has no counts to judge (gpu.nvlink reports its links)
    devices = [d for d in devices if any(lk.get("active") for lk in d.get("nvlinks") or [])]
    if not devices:
        return na("no active NVLink to count errors on (gpu.nvlink judges the links)")
    for d in devices:
        scope, rows = _nvlink_counts(d)
        if not rows:
            unknown.append(gpu_name(d))
            continue
        for where, c in rows:
            links += scope == "link"
            where += " (all links)" if scope == "gpu" else ""
            for key in NVLINK_COUNTERS:
                total[key] += int(c.get(key) or 0)
            if int(c.get("recovery") or 0) > expect.nvlink_recovery_max:
                bad.append(f"{where}: {c['recovery']} recovery > {expect.nvlink_recovery_max}")
            if int(c.get("crc_data") or 0) > expect.nvlink_crc_data_max:
                bad.append(f"{where}: {c['crc_data']} CRC data > {expect.nvlink_crc_data_max}")
            if int(c.get("replay") or 0) > expect.nvlink_replay_max:
                noisy.append(f"{where}: {c['replay']} replay > {expect.nvlink_replay_max}")
    remedy = (
        "A NVLink that retrains or corrupts data slows every transfer over it: read `nvidia-smi nvlink -e -i "
        "<index>` and the kernel log (Xid 74), run `dcgmi diag -r 3`; a link that keeps failing on HGX needs "
        "a full power cycle and, if it persists, a baseboard RMA. The counters restart with the driver."
    )
    if bad:
        return fail(join_items(bad), remedy)
    if noisy:
        return warn(join_items(noisy), remedy)
    if unknown:
        return warn(
            f"cannot verify: NVLink error counters not recorded for {', '.join(unknown)}",
            "Gather facts with NVML on the host; `nvidia-smi nvlink -e` shows the same.",
        )
    sums = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in total.items())
    return ok(
        f"{links or len(devices)} {'links' if links else 'GPUs'}: {sums} (max per link: recovery "
        f"{expect.nvlink_recovery_max}, CRC data {expect.nvlink_crc_data_max}, replay {expect.nvlink_replay_max})"
    )


# NVIDIA Xid events (docs.nvidia.com/deploy/xid-errors) that mean the GPU, its memory, its links or the driver's GSP
# firmware is in trouble: every one azurehpc-health-checks' check_gpu_xid fails on (48 56 57 58 62 63 64 65 68 69 73
# 74 79 80 81 92 119 120), plus those the Xid catalog resolves with a GPU reset or RMA: 94/95 (contained/uncontained
# ECC error), 121 (C2C link), 140 (unrecovered ECC) and 154 (the driver's recovery action is no longer "none").
XID_HARDWARE = {
    48: "double-bit ECC error", 56: "display engine error", 57: "error programming video memory interface",
    58: "unstable video memory interface", 62: "internal micro-controller halt",
    63: "row remapping / page retirement event (reset pending)", 64: "row remapping / page retirement failure",
    65: "video processor exception", 68: "NVDEC0 exception", 69: "graphics engine class error", 73: "NVENC2 error",
    74: "NVLink error", 79: "GPU has fallen off the bus", 80: "corrupted data sent to GPU", 81: "VGA subsystem error",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error", 140: "unrecovered ECC error",
    154: "GPU recovery action changed",
}  # fmt: skip
# Xids the catalog resolves by restarting the application (its own fault, or a fault it caused): warn, since one
# GPU that keeps raising them is worth a look.
XID_APPLICATION = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
}  # fmt: skip


def _xid_recovered(row: dict[str, Any]) -> bool:
    """Xid 154 reporting the recovery action back at 'None' (0x0): the GPU was reset and needs nothing more."""
    m = re.search(r"\bto 0x([0-9a-fA-F]+)", str(row.get("text") or ""))
    return row.get("xid") == 154 and m is not None and int(m.group(1), 16) == 0


def _settled_154(rows: list[dict[str, Any]]) -> set[str]:
    """GPUs whose last Xid 154 put the recovery action back at None: their earlier 154s were acted upon."""
    last = {row.get("bdf"): row for row in rows if row.get("xid") == 154}
    return {bdf for bdf, row in last.items() if _xid_recovered(row)}


@check("gpu.xid", "No hardware or driver Xid in this boot's kernel log", "gpu")
def gpu_xid(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `kernel_log.xids` (this boot's `journalctl -k`, else `dmesg`)

    Rule: fail on Xids of hardware or driver trouble: 48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92
    (azurehpc-health-checks' list), 94, 95, 119, 120, 121, 140, 154 (not when 154 reports the recovery action back at
    None); warn on application Xids (13, 31, 43, 45) and unclassified ones; warn if the log was not readable

    Remedy: per NVIDIA's Xid catalog: GPU reset (63, 94, 95, 154), RMA (64, 92, repeated 48/74/79), driver update (119,
    120); reboot to clear the log
    """
    if not expect.gpu:
        return na("CPU-role host")
    log = facts.get("kernel_log")
    if not log or not log.get("readable"):
        reason = (log or {}).get("reason") or "kernel log not in these facts"
        return warn(
            f"cannot verify: kernel log not read ({reason})",
            "Gather facts as root on the host (`journalctl -k -b` or `dmesg` must be readable).",
        )
    gpus = {d.get("bus_id"): d.get("index") for d in devices_of(facts)}
    hard, app, other = {}, {}, {}
    rows = log.get("xids") or []
    settled = _settled_154(rows)
    for row in rows:
        if row.get("xid") == 154 and row.get("bdf") in settled:
            continue
        xid = int(row.get("xid", -1))
        where = f"GPU{gpus[row.get('bdf')]} {row.get('bdf')}" if row.get("bdf") in gpus else f"{row.get('bdf')}"
        bucket = hard if xid in XID_HARDWARE else app if xid in XID_APPLICATION else other
        key = (where, xid)
        n, _ = bucket.get(key, (0, row))
        bucket[key] = (n + 1, row)  # the last occurrence, with how many

    def show(b: dict[tuple[str, int], tuple[int, dict[str, Any]]], names: dict[int, str]) -> list[str]:
        return [
            f"{where}: Xid {xid} ({names.get(xid, 'unclassified')}) x{n}, last {row.get('time') or '?'}: "
            f"{str(row.get('text'))[:100]}"
            for (where, xid), (n, row) in b.items()
        ]

    source = f"{log.get('source')}, {log.get('lines')} lines"
    if hard:
        return fail(
            join_items(show(hard, XID_HARDWARE)) + f" [{source}]",
            f"Follow NVIDIA's Xid catalog for each: 63/94/95/154 need a GPU reset ({GPU_RESET}), 64/92 and "
            "repeated 48/74/79 an RMA, 119/120 (GSP) a reset and a driver update; check gpu.row_remap and "
            "gpu.ecc. The events stay in this boot's log: after acting on them, reboot the node to clear "
            "the record.",
        )
    if app or other:
        return warn(
            join_items(show(app, XID_APPLICATION) + show(other, {})) + f" [{source}]",
            "Application Xids (13, 31, 43, 45) come from a process's own fault; if they repeat on one GPU "
            "across workloads, run `dcgmi diag -r 3` on it. Look up unclassified ones in NVIDIA's Xid "
            "catalog.",
        )
    return ok(f"no Xid in this boot's kernel log ({source})")


@check("nvswitch.sxid", "No fatal NVSwitch SXid in this boot's kernel log", "gpu", gpu_only=True)
def nvswitch_sxid(facts: Facts, expect: Expect) -> Outcome:
    """Reads: `kernel_log.sxids` (the `nvidia-nvswitchN: SXid (PCI:...): <sxid>, Fatal|Non-fatal, ...` lines of this
    boot's `journalctl -k`, else `dmesg`) and `pci.nvswitches`

    Rule: n/a without an NVSwitch on the PCI bus; fail on a Fatal SXid (NVLink traffic through that switch port
    stalls, CUDA jobs abort with Xid 45); warn on Non-fatal ones (some appear at driver load), and if the log was
    not readable

    Remedy: per NVIDIA's SXid catalog (Fabric Manager user guide): stop the instances, reset the baseboard's GPUs
    and NVSwitches (reboot the node), then `pdinfra validate` again; a Fatal SXid that returns on the same switch
    and link needs the baseboard serviced
    """
    switches = (facts.get("pci") or {}).get("nvswitches")
    if switches is not None and not switches:
        return na("no NVSwitch on this host's PCI bus")
    log = facts.get("kernel_log")
    if not log or not log.get("readable") or "sxids" not in log:
        reason = (log or {}).get("reason") or "kernel log (SXids) not in these facts"
        return warn(
            f"cannot verify: kernel log not read ({reason})",
            "Gather facts as root on the host (`journalctl -k -b` or `dmesg` must be readable).",
        )
    fatal: dict[tuple[str, int], tuple[int, dict[str, Any]]] = {}
    other: dict[tuple[str, int], tuple[int, dict[str, Any]]] = {}
    for row in log.get("sxids") or []:
        bucket = fatal if row.get("fatal") else other
        key = (f"nvswitch{row.get('switch')} {row.get('bdf')}", int(row.get("sxid", -1)))
        n, _ = bucket.get(key, (0, row))
        bucket[key] = (n + 1, row)

    def show(b: dict[tuple[str, int], tuple[int, dict[str, Any]]]) -> list[str]:
        return [
            f"{where}: SXid {sxid} x{n}, last {row.get('time') or '?'}: {str(row.get('text'))[:100]}"
            for (where, sxid), (n, row) in b.items()
        ]

    source = f"{log.get('source')}, {log.get('lines')} lines"
    if fatal:
        return fail(
            join_items(show(fatal)) + f" [{source}]",
            "A Fatal SXid stalls NVLink traffic through that switch: stop the node's instances, reboot it to reset "
            "the GPUs and NVSwitches together (Fabric Manager restarts with them), and validate again; if the same "
            "SXid returns on the same switch and link, have the baseboard serviced.",
        )
    if other:
        return warn(
            join_items(show(other)) + f" [{source}]",
            "Non-fatal SXids are corrected by the switch; a few at driver load are common. Look each up in "
            "NVIDIA's SXid catalog (Fabric Manager user guide); if they keep coming under load, watch "
            "gpu.nvlink_errors and run `dcgmi diag -r 2`.",
        )
    n = len(switches or [])
    return ok(f"no SXid in this boot's kernel log ({n} NVSwitch(es); {source})")
