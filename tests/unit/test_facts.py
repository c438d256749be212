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
        "mtu": 9000, "operstate": "up", "address": "b8:3f:d2:c4:a0:10", "speed_mbps": 400000,
    }  # fmt: skip


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


def test_facts_module_imports_only_the_standard_library_at_module_level() -> None:
    tree = ast.parse(Path(F.__file__).read_text(encoding="utf-8"), feature_version=(3, 10))
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names)


def test_module_utils_symlink_points_at_facts() -> None:
    link = REPO / "module_utils" / "pdinfra_facts.py"
    assert link.is_symlink() and os.readlink(link) == "../pdinfra/host/facts.py"
    assert link.resolve() == Path(F.__file__).resolve()


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
    return m


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
    assert dev0["persistence_mode"] is True
    assert gpus["p2p"] == [{"a": 0, "b": 1, "nvlink": "OK", "read": "OK"}]
    # cuda-bindings is absent on CPU machines (then the CUDA attributes are not read); GPU images carry it
    assert gpus["cuda"]["available"] is (importlib.util.find_spec("cuda") is not None and gpus["cuda"]["available"])


def test_a_tree_with_sys_firmware_but_no_efi_is_a_legacy_boot(tmp_path: Path) -> None:
    (tmp_path / "sys" / "firmware").mkdir(parents=True)
    assert F.gather(str(tmp_path))["boot"]["secure_boot"] == "no EFI"
