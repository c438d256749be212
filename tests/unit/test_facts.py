"""pdinfra.host.facts: replaying recorded and synthesised host trees, the live host, and the NVML recorder."""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest

from pdinfra.host import facts as F

REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "tests" / "fixtures" / "hosts"
RECORDED = "h200x2-real"
SYNTHESISED_GOOD = "hgx-h100-8gpu-8roce"
ALL_FIXTURES = sorted(p.name for p in HOSTS.iterdir() if p.is_dir() and not p.name.startswith("_"))


@pytest.fixture(scope="module")
def recorded() -> dict:
    return F.gather(str(HOSTS / RECORDED))


@pytest.fixture(scope="module")
def synthesised() -> dict:
    return F.gather(str(HOSTS / SYNTHESISED_GOOD))


def test_fixture_set_is_complete() -> None:
    assert set(ALL_FIXTURES) >= {
        RECORDED,
        SYNTHESISED_GOOD,
        "bad-proprietary-driver",
        "bad-old-kernel",
        "bad-nvlink-down",
        "bad-roce-v1-only",
        "bad-mtu-mismatch",
        "bad-tcp-fallback",
    }


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_fixture_gathers_cleanly_and_is_json(name: str) -> None:
    facts = F.gather(str(HOSTS / name))
    assert facts["errors"] == []
    assert facts["mode"] == "replay"
    assert facts["schema"] == F.SCHEMA_VERSION
    assert facts["expect"] is not None, "each fixture declares etc/pdinfra/expect.json"
    assert json.loads(json.dumps(facts)) == facts


def test_recorded_h200x2_driver_kernel_and_config(recorded: dict) -> None:
    assert recorded["hostname"] == "vm"
    assert recorded["kernel"]["release"] == "6.18.44-fc-v657-gpu"
    assert recorded["kernel"]["version"] == [6, 18, 44]
    assert recorded["kernel"]["config"]["CONFIG_DMA_SHARED_BUFFER"] == "y"
    assert recorded["kernel"]["config"]["CONFIG_PCI_P2PDMA"] == "n"
    assert recorded["kernel"]["config_source"] == "/boot/config-6.18.44-fc-v657-gpu"
    drv = recorded["nvidia_driver"]
    assert (drv["loaded"], drv["version"], drv["flavour"]) == (True, "580.159.04", "open")


def test_recorded_h200x2_gpus_nvlink_fabric_pcie(recorded: dict) -> None:
    gpus = recorded["gpus"]
    assert gpus["present"] and gpus["count"] == 2 and gpus["source"] == "record"
    assert gpus["driver_version"] == "580.159.04"
    for dev in gpus["devices"]:
        assert dev["name"] == "NVIDIA H200"
        assert dev["uuid"].startswith("GPU-")
        assert len(dev["nvlinks"]) == 18
        assert all(lk["active"] and lk["version"] == 6 for lk in dev["nvlinks"])
        assert dev["fabric"]["state"] == "Completed" and dev["fabric"]["status"] == "Success"
        assert dev["pcie"]["cur_width"] == dev["pcie"]["max_width"] == 16
        assert dev["pcie"]["sysfs"]["current_link_speed"] == "32.0 GT/s PCIe"
        assert dev["cuda"]["dma_buf_supported"] == 1
        assert dev["persistence_mode"] is None  # not in the recording
    assert gpus["p2p"] == [{"a": 0, "b": 1, "nvlink": "OK"}]


def test_recorded_h200x2_has_no_rdma_and_no_recorded_ucx(recorded: dict) -> None:
    assert recorded["rdma"]["present"] is False
    assert recorded["ucx"]["available"] is False
    assert recorded["fabric_manager"]["installed"] is False
    assert recorded["modules"]["available"] is False
    assert recorded["instances"] == []


def test_synthesised_hgx_platform(synthesised: dict) -> None:
    assert synthesised["os"]["id"] == "ubuntu"
    assert synthesised["boot"]["iommu"]["mode"] == "passthrough"
    assert synthesised["boot"]["secure_boot"] == "disabled"
    assert synthesised["modules"]["loaded"]["mlx5_core"] is True
    assert synthesised["modules"]["loaded"]["nouveau"] is False
    assert synthesised["modules"]["loaded"]["nvidia_peermem"] is False
    assert synthesised["fabric_manager"] == {
        "installed": True,
        "binary": "nv-fabricmanager",
        "version": "550.54.15",
        "service": "active",
    }
    assert synthesised["gpus"]["count"] == 8
    assert len(synthesised["gpus"]["p2p"]) == 28


def test_synthesised_hgx_rdma_ports_gids_and_mtus(synthesised: dict) -> None:
    rdma = synthesised["rdma"]
    assert rdma["present"] and len(rdma["devices"]) == 8
    dev0 = rdma["devices"][0]
    assert dev0["name"] == "mlx5_0" and dev0["pci"] == "0000:1a:00.0" and dev0["driver"] == "mlx5_core"
    port = dev0["ports"][0]
    assert (port["state"], port["phys_state"], port["link_layer"]) == ("ACTIVE", "LinkUp", "Ethernet")
    assert (port["active_mtu"], port["max_mtu"]) == (4096, 4096)
    v2 = [g for g in port["gids"] if g["type"] == "RoCE v2" and g["ipv4"]]
    assert v2 == [
        {
            "index": 3,
            "gid": "0000:0000:0000:0000:0000:ffff:c612:000b",
            "ipv4": "198.18.0.11",
            "type": "RoCE v2",
            "ndev": "enp26s0np0",
        }
    ]
    nets = synthesised["netdevs"]
    assert nets["source"] == "sysfs"
    assert nets["interfaces"]["enp26s0np0"] == {
        "mtu": 9000,
        "operstate": "up",
        "address": "b8:3f:d2:c4:a0:10",
        "speed_mbps": 400000,
    }


def test_synthesised_hgx_ucx_and_instances(synthesised: dict) -> None:
    transports = synthesised["ucx"]["transports"]
    assert {"cuda_ipc", "cuda_copy", "rc_mlx5", "rc_verbs", "tcp"} <= set(transports)
    assert "mlx5_3:1" in transports["rc_mlx5"]
    names = {i["name"]: i for i in synthesised["instances"]}
    assert set(names) == {"prefill", "decode"}
    assert names["prefill"]["health"] == "ok"
    assert names["decode"]["file"] == "/etc/pdinfra/instances/decode.json"


def test_synthesised_misconfigurations_show_in_facts() -> None:
    prop = F.gather(str(HOSTS / "bad-proprietary-driver"))
    assert prop["nvidia_driver"]["flavour"] == "proprietary"
    assert prop["nvidia_driver"]["version"] == "550.54.15"
    old = F.gather(str(HOSTS / "bad-old-kernel"))
    assert old["kernel"]["version"] == [5, 10, 0]
    mtu = F.gather(str(HOSTS / "bad-mtu-mismatch"))
    assert mtu["netdevs"]["interfaces"]["enp26s0np0"]["mtu"] == 1500
    assert mtu["rdma"]["devices"][0]["ports"][0]["active_mtu"] == 1024
    v1 = F.gather(str(HOSTS / "bad-roce-v1-only"))
    assert {g["type"] for d in v1["rdma"]["devices"] for p in d["ports"] for g in p["gids"]} == {"IB/RoCE v1"}


LIVE_GPU = Path("/proc/driver/nvidia/version").exists()  # the suite also runs on GPU hosts


def test_live_host_does_not_crash_and_reports_its_gpus() -> None:
    facts = F.gather("/")
    assert facts["mode"] == "live"
    assert facts["errors"] == []
    assert facts["gpus"]["present"] is LIVE_GPU or not importlib.util.find_spec("pynvml")
    assert facts["gpus"]["present"] or facts["gpus"]["reason"]
    assert facts["kernel"]["release"] == os.uname().release
    json.dumps(facts)


def test_nvml_disabled_is_recorded_not_queried() -> None:
    facts = F.gather(str(HOSTS / RECORDED), nvml=False)
    assert facts["gpus"]["present"] is False
    assert "disabled" in facts["gpus"]["reason"]


def test_empty_tree_is_all_absent_never_a_crash(tmp_path: Path) -> None:
    facts = F.gather(str(tmp_path))
    assert facts["errors"] == []
    assert facts["gpus"]["present"] is False and F.NVML_RECORD_FILE in facts["gpus"]["reason"]
    assert facts["nvidia_driver"]["loaded"] is False
    assert facts["rdma"]["present"] is False
    assert facts["boot"]["secure_boot"] == "unknown"  # nothing recorded is not "legacy BIOS boot"
    assert facts["os"]["present"] is False
    assert facts["expect"] is None


def test_secure_boot_enabled_and_proc_config_gz(tmp_path: Path) -> None:
    import gzip

    efivars = tmp_path / "sys/firmware/efi/efivars"
    efivars.mkdir(parents=True)
    (efivars / F.SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00\x01")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.8.0-45-generic\n")
    (tmp_path / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_DMA_SHARED_BUFFER=y\n"))
    facts = F.gather(str(tmp_path))
    assert facts["boot"]["secure_boot"] == "enabled"
    assert facts["kernel"]["config_source"] == "/proc/config.gz"
    assert facts["kernel"]["config"] == {"CONFIG_DMA_SHARED_BUFFER": "y"}


def test_parsers() -> None:
    assert (
        F.parse_nvidia_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12")["flavour"]
        == "proprietary"
    )
    assert F.gid_ipv4("0000:0000:0000:0000:0000:ffff:c612:070b") == "198.18.7.11"
    assert F.gid_ipv4("fe80:0000:0000:0000:ba3f:d2ff:fec4:a010") is None
    assert F.normalise_bdf("00000000:9A:00.0") == "0000:9a:00.0"
    assert F.command_file_name(["ucx_info", "-d"]) == "ucx_info_-d.txt"
    cfg = F.parse_kernel_config('# CONFIG_PCI_P2PDMA is not set\nCONFIG_LOCALVERSION="-x"\n')
    assert cfg == {"CONFIG_PCI_P2PDMA": "n", "CONFIG_LOCALVERSION": "-x"}
    ucx = F.parse_ucx_info("#      Transport: tcp\n#         Device: eth0\n#      Transport: self\n")
    assert ucx == {"tcp": ["eth0"], "self": []}
    assert F.parse_ucx_version("# Library version: 1.19.0\n# Library path: /x/libucs.so.0\n") == "1.19.0"
    assert F.parse_ucx_version("# UCT version=1.9.0 revision 1d0a420\n") == "1.9.0"
    assert F.parse_ucx_version("ucx_info: error") is None
    assert F.parse_ibv_fw("hca_id:\tmlx5_0\n\tfw_ver:\t\t28.39.1002\nhca_id:\tmlx5_1\n") == {"mlx5_0": "28.39.1002"}


def test_firmware_and_library_versions_for_the_fleet_view(recorded: dict, synthesised: dict, tmp_path: Path) -> None:
    """NIC firmware (sysfs fw_ver, else ibv_devinfo), GPU VBIOS (NVML) and the UCX version (ucx_info -v)."""
    assert {d["fw_ver"] for d in synthesised["rdma"]["devices"]} == {"28.39.1002"}  # from its ibv_devinfo
    assert synthesised["ucx"]["version"] is None  # ucx_info -v not recorded: unknown
    assert {d.get("vbios") for d in recorded["gpus"]["devices"]} == {None}  # not in the 2xH200 recording
    nic = tmp_path / "sys/class/infiniband/mlx5_0"
    nic.mkdir(parents=True)
    (nic / "fw_ver").write_text("28.43.2026\n")
    _cmd(tmp_path, ["ibv_devinfo"], "hca_id:\tmlx5_0\n\tfw_ver:\t\t\t\t28.39.1002\n")
    _cmd(tmp_path, ["ucx_info", "-d"], "#      Transport: tcp\n#         Device: eth0\n")
    _cmd(tmp_path, ["ucx_info", "-v"], "# Library version: 1.19.0\n# API headers version: 1.19.0\n")
    facts = F.gather(str(tmp_path))
    assert facts["rdma"]["devices"][0]["fw_ver"] == "28.43.2026"  # sysfs first
    assert facts["ucx"]["version"] == "1.19.0"


FACT_PARTS = ("facts", "facts_base", "facts_gpu", "facts_net")


@pytest.mark.parametrize("part", FACT_PARTS)
def test_facts_parts_import_only_the_standard_library_and_each_other(part: str) -> None:
    """At module level; the parts import each other as Ansible module_utils on a managed host, else from pdinfra."""
    tree = ast.parse((Path(F.__file__).parent / f"{part}.py").read_text(encoding="utf-8"), feature_version=(3, 10))
    top, siblings = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and node in tree.body:
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.col_offset == 0:
            top.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("ansible", "pdinfra")):
            siblings.add(node.module)
    assert top - {"__future__"} <= set(sys.stdlib_module_names)
    ansible = {m.removeprefix("ansible.module_utils.pdinfra_") for m in siblings if m.startswith("ansible.")}
    own = {m.removeprefix("pdinfra.host.") for m in siblings if m.startswith("pdinfra.")}
    assert ansible == own and own <= set(FACT_PARTS) - {part}, siblings  # the same names both ways


@pytest.mark.parametrize("part", FACT_PARTS)
def test_module_utils_symlinks_point_at_the_facts_parts(part: str) -> None:
    link = REPO / "module_utils" / f"pdinfra_{part}.py"
    assert link.is_symlink() and os.readlink(link) == f"../pdinfra/host/{part}.py"
    assert link.resolve() == (Path(F.__file__).parent / f"{part}.py").resolve()


def test_nvml_recorder_records_what_this_host_has(tmp_path: Path) -> None:
    record = F.write_nvml_record(str(tmp_path / F.NVML_RECORD_FILE))
    assert record["format"] == F.NVML_RECORD_FORMAT and record["present"] is (LIVE_GPU and record["present"])
    replay = F.gather(str(tmp_path))
    assert replay["gpus"]["present"] is record["present"] and replay["gpus"]["source"] == "record"


class _FakeNVMLError(Exception):
    pass


def _fake_pynvml() -> types.ModuleType:
    """A stand-in pynvml for 2 GPUs with 18 NVLinks each, enough to drive gpus_live() without hardware."""
    m = types.ModuleType("pynvml")
    m.NVML_NVLINK_MAX_LINKS = 36
    m.NVML_P2P_CAPS_INDEX_NVLINK = 2
    m.NVML_P2P_CAPS_INDEX_READ = 0

    class FabricInfo(ctypes.Structure):
        _fields_ = [("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint), ("state", ctypes.c_uint)]

    def fabric_v(handle: int, ref: object) -> int:
        info = ref._obj  # type: ignore[attr-defined]  # a ctypes byref() of the struct
        info.state, info.status, info.cliqueId = 3, 0, 7
        return 0

    def link_state(handle: int, link: int) -> int:
        if link >= 18:
            raise _FakeNVMLError("Invalid Argument")
        return 0 if (handle, link) == (1, 5) else 1

    m.c_nvmlGpuFabricInfoV_t = FabricInfo
    m.nvmlDeviceGetGpuFabricInfoV = fabric_v
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    m.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}"
    m.nvmlDeviceGetVbiosVersion = lambda h: b"96.00.99.00.01"  # synthetic; some nvidia-ml-py versions return bytes
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())
    m.nvmlDeviceGetPersistenceMode = lambda h: 1
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 1
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkVersion = lambda h, link: 6
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=b"00000000:05:00.0")
    m.nvmlDeviceGetP2PStatus = lambda a, b, cap: 0
    m.nvmlErrorString = lambda code: f"error {code}"
    # health: GPU 1 had 3 uncorrectable errors in its life (none since boot) and has a remap pending; SRAM counters and
    # retired pages are NotSupported (as on Hopper); an old pynvml without ...ClocksEventReasons (the throttle name
    # answers), without the NVLink error constants (nvml.h's values are used) and without field values.
    m.nvmlDeviceGetEccMode = lambda h: [1, 1]
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 3 if (h, kind, counter) == (1, 1, 1) else 0
    m.nvmlDeviceGetMemoryErrorCounter = _not_supported
    m.nvmlDeviceGetRemappedRows = lambda h: (0, 1, 1, 0) if h == 1 else (0, 0, 0, 0)
    m.nvmlDeviceGetRetiredPagesPendingStatus = _not_supported
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x1 if h == 0 else 0x48
    m.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, counter: 5 if (h, link, counter) == (0, 2, 0) else 0
    return m


def _not_supported(*args: object) -> int:
    raise _FakeNVMLError("Not Supported")


def test_nvml_live_path_with_fake_pynvml_round_trips_through_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    F.write_nvml_record(str(tmp_path / F.NVML_RECORD_FILE))
    gpus = F.gather(str(tmp_path))["gpus"]
    assert gpus["present"] and gpus["count"] == 2 and gpus["driver_version"] == "550.54.15"
    dev0, dev1 = gpus["devices"]
    assert dev0["bus_id"] == "0000:18:00.0" and dev1["bus_id"] == "0000:19:00.0"
    assert len(dev0["nvlinks"]) == 18 and dev0["nvlinks"][0]["remote_bus_id"] == "00000000:05:00.0"
    assert [lk["link"] for lk in dev1["nvlinks"] if not lk["active"]] == [5]
    assert dev0["fabric"] == {"state": "Completed", "status": "Success", "clique_id": 7}
    assert dev0["persistence_mode"] is True and dev0["vbios"] == "96.00.99.00.01"
    assert gpus["p2p"] == [{"a": 0, "b": 1, "nvlink": "OK", "read": "OK"}]
    assert dev0["nvlinks"][2]["errors"] == {"replay": 5, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    assert dev1["health"] == {
        "ecc_mode": True,
        "ecc_mode_pending": True,
        "ecc_uncorrected": {"volatile": 0, "aggregate": 3},
        "sram_uncorrected": {"volatile": None, "aggregate": None},  # NotSupported: unknown, not 0
        "remapped_rows": {"corrected": 0, "uncorrected": 1, "pending": True, "failure": False},
        "retired_pages_pending": None,
        "clock_event_reasons": 0x48,
        "clock_event_names": ["hw_slowdown", "hw_thermal_slowdown"],
        "nvlink_errors_total": {"replay": None, "recovery": None, "crc_flit": None, "crc_data": None},
    }
    assert dev0["health"]["clock_event_names"] == ["gpu_idle"]
    # cuda-bindings is absent on CPU machines (then the CUDA attributes are not read); GPU images carry it
    assert gpus["cuda"]["available"] is (importlib.util.find_spec("cuda") is not None and gpus["cuda"]["available"])


def test_a_tree_with_sys_firmware_but_no_efi_is_a_legacy_boot(tmp_path: Path) -> None:
    (tmp_path / "sys" / "firmware").mkdir(parents=True)
    assert F.gather(str(tmp_path))["boot"]["secure_boot"] == "no EFI"


def test_nvml_without_any_health_function_records_none_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_pynvml()
    health = ("NvLinkError", "Ecc", "Remapped", "Retired", "Clocks", "MemoryError")
    for name in [n for n in vars(fake) if n.startswith("nvmlDeviceGet") and any(h in n for h in health)]:
        delattr(fake, name)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    dev = F.gpus_live()["devices"][0]
    assert dev["health"]["ecc_mode"] is None and dev["health"]["remapped_rows"] is None
    assert dev["health"]["clock_event_reasons"] is None and dev["health"]["clock_event_names"] is None
    assert dev["nvlinks"][0]["errors"] == {"replay": None, "recovery": None, "crc_flit": None, "crc_data": None}


def test_nvlink_error_totals_from_field_values() -> None:
    class Value(ctypes.Union):
        _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ullVal", ctypes.c_ulonglong)]

    def field(ret: int, vtype: int, **v: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(nvmlReturn=ret, valueType=vtype, value=Value(**v))

    m = types.SimpleNamespace(
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL=52,
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL=45,
        nvmlDeviceGetFieldValues=lambda h, ids: [field(0, 3, ullVal=7), field(3, 3, ullVal=99)],
    )
    # replay answered 7; CRC data answered an error (3: NotSupported); recovery and CRC flit: no such constant
    assert F.nvml_field_values(m, 0, F.NVLINK_ERROR_TOTAL_FIELDS) == {
        "replay": 7,
        "recovery": None,
        "crc_flit": None,
        "crc_data": None,
    }


def test_decode_clock_reasons() -> None:
    assert F.decode_clock_reasons(0) == []
    assert F.decode_clock_reasons(0x1) == ["gpu_idle"]
    assert F.decode_clock_reasons(0x88) == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert F.decode_clock_reasons(0x804) == ["sw_power_cap", "0x800"]  # an unknown bit stays visible


XID_LOG = """\
2026-12-03T09:14:02+0000 gpu-07 kernel: NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
2026-12-03T09:40:11+0000 gpu-07 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
2026-12-03T09:40:11+0000 gpu-07 kernel: NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.
2026-12-03T10:02:45+0000 gpu-07 kernel: NVRM: Xid (PCI:0000:9a:00): 13, pid=48211, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Encoding
2026-12-03T10:15:00+0000 gpu-07 kernel: NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)
[ 5123.456789] NVRM: Xid (PCI:0000:3A:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row (0x0000000012345678) marked for remapping, reset gpu to activate.
Dec  3 10:20:01 gpu-07 kernel: [ 6001.000001] NVRM: Xid (0000:01:00): 31, Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_3456_0000.
2026-12-03T10:30:00+0000 gpu-07 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error
"""  # noqa: E501


def test_xid_kernel_log_lines_are_parsed() -> None:
    rows = F.parse_xid_lines(XID_LOG)
    # the SXid of an NVSwitch is not a GPU Xid
    assert [(r["bdf"], r["xid"]) for r in rows] == [
        ("0000:18:00.0", 79),
        ("0000:9a:00.0", 13),
        ("0000:ab:00.0", 154),
        ("0000:3a:00.0", 63),
        ("0000:01:00.0", 31),
    ]
    assert rows[0]["text"] == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert rows[0]["time"] == "2026-12-03T09:40:11+0000"
    assert rows[3]["time"] == "5123.456789 s after boot"
    assert rows[4]["time"] == "Dec  3 10:20:01"
    assert rows[2]["text"].endswith("to 0x1 (GPU Reset Required)")


# One Non-fatal event as the NVSwitch driver prints it at load on an HGX baseboard (the severity line, then its
# 'Data' and 'Severity' lines; format of NVIDIA/nvtrust issue #124's dmesg), and a Fatal one (the format gpud's
# SXid scanner matches, leptonai/gpud #338).
SXID_LOG = """\
[   38.175561] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b, 0x0000002b, 0x00000000, 0x0000002b, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt
[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00
2026-12-03T11:02:03+0000 gpu-07 kernel: nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Fatal, Link 47 egress non-posted PRIV error (First)
"""  # noqa: E501


def test_sxid_kernel_log_lines_are_parsed_one_row_per_event() -> None:
    rows = F.parse_sxid_lines(SXID_LOG + XID_LOG)
    assert [(r["switch"], r["bdf"], r["sxid"], r["fatal"]) for r in rows] == [
        (3, "0000:04:00.0", 22013, False),
        (1, "0000:84:00.0", 12028, True),
        (0, "0000:05:00.0", 12028, False),
    ]
    assert rows[0]["text"] == "Link 44 Minion Link DLREQ interrupt" and rows[0]["time"] == "38.178720 s after boot"
    assert rows[1]["text"] == "Link 47 egress non-posted PRIV error (First)"
    assert F.parse_xid_lines(SXID_LOG) == []  # an SXid is not a GPU Xid


def _cmd(root: Path, argv: list[str], text: str) -> None:
    (root / F.CMD_DIR).mkdir(parents=True, exist_ok=True)
    (root / F.CMD_DIR / F.command_file_name(argv)).write_text(text)


def test_kernel_log_from_journalctl_else_dmesg_else_unreadable(tmp_path: Path) -> None:
    journal, dmesg = list(F.KERNEL_LOG_COMMANDS[0]), list(F.KERNEL_LOG_COMMANDS[1])
    assert F.kernel_log(F.Host(str(tmp_path))) == {
        "readable": False,
        "source": None,
        "xids": [],
        "sxids": [],
        "reason": "journalctl not recorded (pdinfra-cmd/journalctl_-k_-b_--no-pager_-o_short-iso.txt); dmesg not "
        "recorded (pdinfra-cmd/dmesg.txt)",
    }
    # a user without access to the journal sees no entries: not "no Xid", the next source is asked
    _cmd(tmp_path, journal, "-- No entries --\n")
    _cmd(tmp_path, dmesg, "dmesg: read kernel buffer failed: Operation not permitted\n")
    log = F.kernel_log(F.Host(str(tmp_path)))
    assert log["readable"] is False and "Operation not permitted" in log["reason"] and "No entries" in log["reason"]
    _cmd(tmp_path, dmesg, "[    0.000000] Linux version 6.8.0-45-generic\n" + XID_LOG.splitlines()[5] + "\n")
    log = F.kernel_log(F.Host(str(tmp_path)))
    assert (log["readable"], log["source"], log["lines"]) == (True, "dmesg", 2)
    assert [x["xid"] for x in log["xids"]] == [63]
    _cmd(tmp_path, journal, XID_LOG)
    log = F.kernel_log(F.Host(str(tmp_path)))
    assert log["source"] == "journalctl -k -b --no-pager -o short-iso" and len(log["xids"]) == 5
    assert [(x["sxid"], x["fatal"]) for x in log["sxids"]] == [(12028, False)]


def test_synthesised_hgx_health_facts(synthesised: dict) -> None:
    dev = synthesised["gpus"]["devices"][7]
    assert dev["health"]["remapped_rows"] == {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False}
    assert dev["pcie"]["aer"] == {
        "correctable": 1,
        "nonfatal": 0,
        "fatal": 0,
        "detail": {"correctable": {"BadDLLP": 1}},
    }
    nic = synthesised["rdma"]["devices"][4]
    assert nic["aer"] == {"correctable": 0, "nonfatal": 0, "fatal": 0}
    assert nic["ports"][0]["counters"] == {"link_downed": 0, "link_error_recovery": 0}
    assert synthesised["kernel_log"]["readable"] and synthesised["kernel_log"]["xids"] == []
    flapping = F.gather(str(HOSTS / "bad-rail-flapping"))["rdma"]["devices"][4]["ports"][0]["counters"]
    assert flapping == {"link_downed": 3, "link_error_recovery": 17}


def test_aer_files_are_parsed_and_absent_ones_are_none(tmp_path: Path) -> None:
    base = tmp_path / "sys/bus/pci/devices/0000:18:00.0"
    base.mkdir(parents=True)
    assert F.pci_aer(F.Host(str(tmp_path)), "sys/bus/pci/devices/0000:18:00.0") is None
    (base / "aer_dev_nonfatal").write_text("Undefined 0\nDLP 0\nCmpltTO 3\nUnsupReq 1\nTOTAL_ERR_NONFATAL 4\n")
    aer = F.pci_aer(F.Host(str(tmp_path)), "sys/bus/pci/devices/0000:18:00.0")
    assert aer == {
        "correctable": None,
        "nonfatal": 4,
        "fatal": None,
        "detail": {"nonfatal": {"CmpltTO": 3, "UnsupReq": 1}},
    }
