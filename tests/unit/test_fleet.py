"""The fleet view (pdinfra.host.fleet, pdinfra.transfer.fleet_figures, `validate -f ... --transfer-report ...`).

The hosts are real recordings and their variants: the 2xH200 host's facts and `validate --transfer` report of
2026-12-01 (tests/fixtures/recorded/h200x2-cluster-transfer), a second real transfer run on the same host type
(h200x2-validate-transfer, 2026-11-29), and the synthesised HGX H100 host (its NICs, firmware and rails). Each
variant is one of them copied with one figure or version changed, so every flag is seen firing on the changed
host and not firing on the others.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdinfra.cli.host import validate_cmd
from pdinfra.cluster.expect import Expect
from pdinfra.host import fleet as F
from pdinfra.host.checks import run_checks
from pdinfra.host.facts import gather
from pdinfra.transfer import fleet_figures as TF

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "fixtures" / "recorded"
HOSTS = REPO / "tests" / "fixtures" / "hosts"
GPU_PAIR = "NIXL VRAM0->VRAM1 thr0"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def h200() -> tuple[dict, dict, dict]:
    """(facts, transfer report) of the 2026-12-01 run, and the report of the 2026-11-29 run on the same host type."""
    run = RECORDED / "h200x2-cluster-transfer"
    return (
        _load(run / "facts.json"),
        _load(run / "transfer.json"),
        _load(RECORDED / "h200x2-validate-transfer" / "transfer.json"),
    )


def _host(facts: dict, report: dict | None, name: str) -> tuple[dict, dict | None]:
    facts, report = copy.deepcopy(facts), copy.deepcopy(report)
    facts["hostname"] = name
    if report is not None:
        report["host"] = name
    return facts, report


def _slow_nvlink(facts: dict, gpu: int, links_down: int) -> None:
    for link in facts["gpus"]["devices"][gpu]["nvlinks"][:links_down]:
        link["active"] = False


def _slow_transfers(report: dict, factor: float, pair: str = "gpu-gpu") -> None:
    for r in report["results"]:
        if r["pair"] == pair and r["gbps"]:
            r["gbps"] *= factor


def _driver(facts: dict, version: str) -> None:
    facts["nvidia_driver"]["version"] = facts["gpus"]["driver_version"] = version


@pytest.fixture(scope="module")
def fleet4(h200: tuple[dict, dict, dict]) -> list[tuple[dict, dict | None]]:
    """vm-a: the recording; vm-b: the same facts with the other real run's report; vm-c: GPU 1 with 2 of its 18
    NVLinks down and its GPU-GPU transfers at 85 %; vm-d: another driver."""
    facts, report, other = h200
    a = _host(facts, report, "vm-a")
    b = _host(facts, other, "vm-b")
    c = _host(facts, report, "vm-c")
    _slow_nvlink(c[0], 1, 2)
    _slow_transfers(c[1], 0.85)
    d = _host(facts, report, "vm-d")
    _driver(d[0], "575.57.08")
    return [a, b, c, d]


def _view(hosts: list[tuple[dict, dict | None]], margin: float = F.DEFAULT_MARGIN) -> F.FleetView:
    """As the CLI joins them: a host without a report, beside hosts with one, has unknown NIXL and torch versions."""
    unknown = {"NIXL": None, "torch": None}
    return F.compare(
        [F.sample(f["hostname"], f, TF.figures(r) if r else {}, TF.versions(r) if r else unknown) for f, r in hosts],
        margin,
    )


def _flags(view: F.FleetView) -> dict[tuple[str, str], dict]:
    return {(r.host, r.subject): r.detail for r in view.flags()}


def test_a_host_below_the_median_is_flagged_with_figure_value_median_and_margin(fleet4: list) -> None:
    view = _view(fleet4)
    flags = _flags(view)
    nvlink = flags[("vm-c", "gpu1 NVLink GB/s")]
    assert (nvlink["value"], nvlink["median"], nvlink["margin"], nvlink["unit"]) == (425.0, 478.1, 0.1, "GB/s")
    assert nvlink["below"] == pytest.approx(1 - 425 / 478.1, abs=1e-4) and nvlink["hosts"] == 4
    row = next(r for r in view.flags() if r.subject == "gpu1 NVLink GB/s")
    assert "425 GB/s, 11.1% below the fleet median 478.1 GB/s (margin 10%, 4 hosts)" in row.evidence
    assert "nvidia-smi nvlink" in row.remedy
    slow = {s for h, s in flags if h == "vm-c" and s.startswith(GPU_PAIR)}
    assert f"{GPU_PAIR}: READ 1x1GiB" in slow and f"{GPU_PAIR}: WRITE 1024x256KiB contig prepped" in slow
    # not firing: the healthy GPU 0 of vm-c, the other hosts (vm-b's report is another real run: within 10 %)
    assert ("vm-c", "gpu0 NVLink GB/s") not in flags
    assert {h for h, _ in flags if h != "vm-d"} == {"vm-c"}
    held = {r.subject: r for r in view.rows if r.id == "fleet.figure" and r.verdict == "pass"}
    assert "gpu0 NVLink GB/s" in held and "GPUs (NVML)" in held and "gpu1 PCIe GB/s" in held
    assert held["gpu0 PCIe GB/s"].detail["median"] == 63.0  # Gen5 x16


def test_a_different_driver_is_flagged_and_agreeing_versions_pass(fleet4: list) -> None:
    view = _view(fleet4)
    versions = {(r.host, r.subject): r for r in view.rows if r.id == "fleet.version"}
    driver = versions[("vm-d", "driver")]
    assert driver.verdict == "warn" and driver.detail["value"] == "575.57.08"
    assert driver.detail["majority"] == "580.159.04" and "(3 of 4 hosts)" in driver.evidence
    assert not any(h != "vm-d" and s == "driver" for h, s in versions)
    assert versions[("*", "kernel")].verdict == "pass" and versions[("*", "NIXL")].evidence == "4 hosts on 1.5.1"
    assert versions[("*", "CUDA (driver)")].detail["majority"] == "13.0"
    assert versions[("*", "GPU")].detail["majority"] == "2x NVIDIA H200"
    # what the 2xH200 recording does not carry is said, never passed
    assert {versions[("*", k)].verdict for k in ("VBIOS", "UCX", "fabric manager")} == {"n/a"}
    assert not [k for k in versions if k[1] == "NIC firmware"]  # no RDMA device on any host: does not apply


def test_only_bandwidth_bound_cases_and_raw_copies_are_transfer_figures(h200: tuple[dict, dict, dict]) -> None:
    figures = TF.figures(h200[1])
    assert f"{GPU_PAIR}: READ 1x1GiB" in figures and f"{GPU_PAIR}: READ 1x16MiB" in figures
    assert f"{GPU_PAIR}: READ 1x64KiB" not in figures  # latency-bound
    assert f"{GPU_PAIR}: READ 1024x256KiB contig plain" not in figures  # descriptor-bound
    copies = [n for n in figures if n.startswith("raw copy VRAM0->VRAM1 thr0: READ-direction")]
    assert len(copies) == 1 and figures[copies[0]].value == pytest.approx(393.72, abs=0.01)
    tcp = figures["NIXL DRAM->VRAM0 thr0: READ 1x16MiB"]
    assert tcp.noisy and not figures[f"{GPU_PAIR}: READ 1x1GiB"].noisy
    assert TF.versions(h200[1]) == {"NIXL": "1.5.1", "torch": "2.11.0"}


def test_tcp_on_every_host_is_not_compared_and_cases_of_few_hosts_are_not_judged(fleet4: list) -> None:
    rows = {r.subject: r for r in _view(fleet4).rows if r.id == "fleet.figure" and r.host == "*"}
    assert rows["NIXL DRAM->VRAM0 thr0: READ 1x16MiB"].verdict == "n/a"
    # the 2026-11-29 run planned its KV case at block size 16, the others at 64: each is on too few hosts
    b16 = rows[f"{GPU_PAIR}: READ kv:gpt-oss-120b 8192tok B16 contig prepped"]
    assert b16.verdict == "warn" and "cannot judge: reported by 1 of 4 hosts" in b16.evidence
    b64 = f"{GPU_PAIR}: READ kv:gpt-oss-120b 8192tok B64 contig prepped"  # vm-a, vm-c, vm-d: judged
    assert b64 not in rows and _flags(_view(fleet4))[("vm-c", b64)]["hosts"] == 3


def test_the_margin_decides(fleet4: list) -> None:
    assert ("vm-c", "gpu1 NVLink GB/s") not in _flags(_view(fleet4, margin=0.2))  # 11.1 % below: within 20 %
    assert not {s for h, s in _flags(_view(fleet4, margin=0.2)) if h == "vm-c"}  # the transfers are 15 % below
    tight = _flags(_view(fleet4, margin=0.05))
    assert ("vm-c", "gpu1 NVLink GB/s") in tight and tight[("vm-c", "gpu1 NVLink GB/s")]["margin"] == 0.05
    with pytest.raises(ValueError, match="margin"):
        _view(fleet4, margin=10)


def test_two_hosts_cannot_judge_figures_but_still_report_versions(fleet4: list) -> None:
    view = _view([fleet4[2], fleet4[3]])  # vm-c (slow GPU 1) and vm-d (another driver)
    figures = [r for r in view.rows if r.id == "fleet.figure"]
    assert len(figures) == 1 and figures[0].verdict == "warn" and figures[0].host == "*"
    assert "cannot judge: 2 hosts" in figures[0].evidence and figures[0].detail["min_hosts"] == 3
    assert figures[0].detail["figures"]["gpu1 NVLink GB/s"] == {"vm-c": 425.0, "vm-d": 478.1}
    driver = {r.host: r for r in view.rows if r.subject == "driver"}
    assert set(driver) == {"vm-c", "vm-d"} and all(r.verdict == "warn" for r in driver.values())
    assert "no majority in the fleet (580.159.04 on vm-c; 575.57.08 on vm-d)" in driver["vm-c"].evidence
    same = _view([fleet4[0], fleet4[1]])  # two healthy hosts: versions agree, figures still not judged
    assert [r.verdict for r in same.rows if r.id == "fleet.figure"] == ["warn"]
    assert {r.verdict for r in same.rows if r.subject == "driver"} == {"pass"} and not same.flags()


def test_a_version_a_host_does_not_record_is_flagged_not_passed(fleet4: list) -> None:
    hosts = [fleet4[0], fleet4[1], (fleet4[3][0], None)]  # vm-d without a transfer report
    rows = {(r.host, r.subject): r for r in _view(hosts).rows if r.id == "fleet.version"}
    assert rows[("vm-d", "NIXL")].verdict == "warn" and ("*", "NIXL") not in rows  # unknown is never pass
    assert "NIXL: not recorded on this host; the fleet's: 1.5.1" in rows[("vm-d", "NIXL")].evidence
    facts = [copy.deepcopy(f) for f, _ in fleet4[:3]]
    facts[2]["kernel"]["release"] = None
    view = F.compare([F.sample(f["hostname"], f) for f in facts])
    kernel = {r.host: r for r in view.rows if r.subject == "kernel"}
    assert set(kernel) == {"vm-c"} and "not recorded on this host" in kernel["vm-c"].evidence


def test_a_host_without_gpus_is_not_flagged_for_gpu_versions(fleet4: list) -> None:
    """A CPU node (the router's, say) validated with GPU nodes: driver, VBIOS, GPU do not apply there."""
    cpu = copy.deepcopy(fleet4[0][0])
    cpu.update(hostname="cpu-1", gpus={"present": False, "reason": "no NVIDIA GPU"}, pci={"gpus": []})
    cpu["nvidia_driver"] = {"loaded": False, "version": None}
    view = F.compare([F.sample(f["hostname"], f) for f in [fleet4[0][0], fleet4[1][0], fleet4[3][0], cpu]])
    assert not [r for r in view.flags() if r.host == "cpu-1"]
    driver = {r.host: r for r in view.rows if r.subject == "driver"}
    assert set(driver) == {"vm-d"} and "(2 of 3 hosts)" in driver["vm-d"].evidence
    assert next(r for r in view.rows if r.subject == "kernel").evidence == "4 hosts on 6.18.44-fc-v973-gpu"
    assert next(r for r in view.rows if r.subject == "gpu0 NVLink GB/s").detail["hosts"] == 3


@pytest.fixture(scope="module")
def hgx() -> dict:
    return gather(str(HOSTS / "hgx-h100-8gpu-8roce"))


def _hgx_hosts(hgx: dict) -> list[dict]:
    hosts = []
    for name in ("hgx-1", "hgx-2", "hgx-3"):
        f = copy.deepcopy(hgx)
        f["hostname"] = name
        for d in f["gpus"]["devices"]:
            d["vbios"] = "96.00.89.00.01"  # synthetic: the synthesised host's NVML record has no VBIOS
        hosts.append(f)
    return hosts


def test_nic_firmware_vbios_and_a_slow_rail_are_flagged_on_the_host_that_differs(hgx: dict) -> None:
    healthy = F.compare([F.sample(f["hostname"], f) for f in _hgx_hosts(hgx)])
    assert not healthy.flags()
    versions = {r.subject: r for r in healthy.rows if r.id == "fleet.version"}
    assert versions["NIC firmware"].evidence == "3 hosts on 28.39.1002" and versions["VBIOS"].verdict == "pass"
    held = {r.subject for r in healthy.rows if r.verdict == "pass"}
    assert {"mlx5_4 port 1 Gb/s", "mlx5_4 PCIe lanes", "RDMA ports ACTIVE", "gpu7 NVLink GB/s"} <= held

    hosts = _hgx_hosts(hgx)
    hosts[1]["rdma"]["devices"][4]["fw_ver"] = "28.40.1000"
    hosts[1]["gpus"]["devices"][3]["vbios"] = "96.00.74.00.11"
    hosts[2]["rdma"]["devices"][4]["ports"][0]["rate"] = "200 Gb/sec (4X HDR)"
    hosts[2]["rdma"]["devices"][5]["pcie"]["cur_width"] = 8
    hosts[0]["gpus"]["devices"][2]["pcie"].update(cur_gen=4, max_gen=4)  # a riser that trains at Gen4
    view = F.compare([F.sample(f["hostname"], f) for f in hosts])
    flags = {(r.host, r.subject): r for r in view.flags()}
    assert set(flags) == {
        ("hgx-2", "NIC firmware"),
        ("hgx-2", "VBIOS"),
        ("hgx-3", "mlx5_4 port 1 Gb/s"),
        ("hgx-3", "mlx5_5 PCIe lanes"),
        ("hgx-1", "gpu2 PCIe GB/s"),
    }
    gen4 = flags[("hgx-1", "gpu2 PCIe GB/s")].detail
    assert (gen4["value"], gen4["median"]) == (31.5, 63.0)
    own = {r.id: r.verdict for r in run_checks(hosts[0], Expect.from_dict(hosts[0]["expect"]))}
    assert own["gpu.pcie"] == "pass"  # the host's own check does not see it: the generation is not judged
    assert flags[("hgx-2", "NIC firmware")].detail["value"] == "28.39.1002, 28.40.1000"
    assert flags[("hgx-2", "NIC firmware")].detail["majority"] == "28.39.1002"
    assert flags[("hgx-2", "VBIOS")].detail["value"] == "96.00.74.00.11, 96.00.89.00.01"
    rail = flags[("hgx-3", "mlx5_4 port 1 Gb/s")].detail
    assert (rail["value"], rail["median"], rail["unit"]) == (200.0, 400.0, "Gb/s")
    assert "mlxlink" in flags[("hgx-3", "mlx5_4 port 1 Gb/s")].remedy


def test_rows_are_check_results_with_the_comparison_under_fleet(fleet4: list) -> None:
    rows = _view(fleet4).to_dicts()
    assert all(set(r) == {"id", "title", "verdict", "evidence", "remedy", "layer", "host", "fleet"} for r in rows)
    assert {r["layer"] for r in rows} == {"fleet"} and "fail" not in {r["verdict"] for r in rows}
    json.dumps(rows)  # JSON-ready


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("validate")(validate_cmd)
    app.command("other")(lambda: None)  # two commands: typer then keeps the command name
    return app


def _invoke(app: typer.Typer, *args: str):  # noqa: ANN202
    return CliRunner().invoke(app, ["validate", *args], env={"COLUMNS": "220", "NO_COLOR": "1"})


def _write(tmp_path: Path, hosts: list[tuple[dict, dict | None]]) -> list[str]:
    args = []
    for facts, report in hosts:
        (tmp_path / f"{facts['hostname']}.json").write_text(json.dumps(facts))
        args += ["--facts", str(tmp_path / f"{facts['hostname']}.json")]
        if report is not None:
            (tmp_path / f"{facts['hostname']}.transfer.json").write_text(json.dumps(report))
            args += ["--transfer-report", str(tmp_path / f"{facts['hostname']}.transfer.json")]
    return args


def test_cli_json_carries_the_fleet_rows(cli: typer.Typer, fleet4: list, tmp_path: Path) -> None:
    res = _invoke(cli, *_write(tmp_path, fleet4), "--json")
    assert res.exit_code == 1  # vm-c's links down fail gpu.nvlink there, vm-d's driver fleet.driver_consistency
    rows = json.loads(res.stdout)
    fleet = [r for r in rows if "fleet" in r]
    assert {r["host"] for r in fleet if r["verdict"] == "warn" and r["host"] != "*"} == {"vm-c", "vm-d"}
    nvlink = next(r for r in fleet if r["title"] == "fleet median: gpu1 NVLink GB/s" and r["host"] == "vm-c")
    assert (nvlink["fleet"]["value"], nvlink["fleet"]["median"], nvlink["fleet"]["margin"]) == (425.0, 478.1, 0.1)
    assert {r["host"] for r in rows if "fleet" not in r} == {"vm-a", "vm-b", "vm-c", "vm-d", "*"}  # as before


def test_cli_a_host_every_own_check_passes_is_still_flagged_and_the_run_does_not_fail(
    cli: typer.Typer, fleet4: list, h200: tuple, tmp_path: Path
) -> None:
    """vm-e: the recording with its GPU-GPU transfers (and so their raw copies' verdicts) at 85 %: nothing on the host
    itself says so; the fleet view does, as a warning."""
    e = _host(h200[0], h200[1], "vm-e")
    _slow_transfers(e[1], 0.85)
    res = _invoke(cli, *_write(tmp_path, [fleet4[0], fleet4[1], e]), "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    flagged = {r["fleet"]["figure"] for r in rows if "fleet" in r and r["host"] == "vm-e"}
    assert f"{GPU_PAIR}: READ 1x1GiB" in flagged and not any(f.startswith("gpu") for f in flagged)
    assert not [r for r in rows if "fleet" in r and r["host"] in ("vm-a", "vm-b")]


def test_cli_table_after_the_per_host_table_and_the_margin_option(
    cli: typer.Typer, fleet4: list, tmp_path: Path
) -> None:
    args = _write(tmp_path, fleet4)
    res = _invoke(cli, *args)
    assert res.exit_code == 1  # vm-d's driver also fails fleet.driver_consistency, as before
    out = res.output
    assert out.index("fleet.driver_consistency") < out.index("Fleet view: 4 hosts, margin 10%")
    assert "11.1% below the fleet median 478.1 GB/s" in out and "575.57.08, the fleet's majority 580.159.04" in out
    assert "VBIOS, fabric manager, UCX" in out and "not in any host's facts" in out
    assert "fleet view: 10 flag(s) on vm-c, vm-d; 8 figure(s) within the margin, 2 not judged" in out
    res = _invoke(cli, *args, "--fleet-margin", "12.5%")
    assert "Fleet view: 4 hosts, margin 12.5%" in res.output and "11.1% below" not in res.output


def test_cli_two_hosts_say_they_cannot_judge(cli: typer.Typer, fleet4: list, tmp_path: Path) -> None:
    res = _invoke(cli, *_write(tmp_path, [fleet4[0], fleet4[2]]))  # vm-a and vm-c, whose GPU 1 is slow
    assert "cannot judge: 2 hosts" in res.output and "11.1% below" not in res.output
    assert "fleet view: 0 flag(s); 0 figure(s) within the margin, 19 not judged" in res.output  # 5 facts, 14 report


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fleet-margin", "0"], "percentage above 0"),
        (["--fleet-margin", "abc"], "percentage above 0"),
        (["--fleet-margin", "100"], "percentage above 0"),
    ],
)
def test_cli_bad_margin_is_exit_2(cli: typer.Typer, fleet4: list, tmp_path: Path, extra: list, message: str) -> None:
    res = _invoke(cli, *_write(tmp_path, fleet4[:3]), *extra)
    assert res.exit_code == 2 and message in res.output


def test_cli_transfer_report_must_match_one_host(cli: typer.Typer, fleet4: list, tmp_path: Path) -> None:
    one = _write(tmp_path, fleet4[:1])
    res = _invoke(cli, *one)
    assert res.exit_code == 2 and "two or more hosts" in res.output
    stray = copy.deepcopy(fleet4[0][1])
    stray["host"] = "elsewhere"
    (tmp_path / "stray.json").write_text(json.dumps(stray))
    res = _invoke(
        cli,
        *_write(tmp_path, [(fleet4[1][0], None), (fleet4[2][0], None)]),
        "--transfer-report",
        str(tmp_path / "stray.json"),
    )
    assert res.exit_code == 2 and "no --facts has that hostname" in res.output
    (tmp_path / "facts-as-report.json").write_text(json.dumps(fleet4[0][0]))
    res = _invoke(
        cli,
        *_write(tmp_path, [(fleet4[1][0], None), (fleet4[2][0], None)]),
        "--transfer-report",
        str(tmp_path / "facts-as-report.json"),
    )
    assert res.exit_code == 2 and "not a pdinfra transfer report" in res.output


def test_cli_hosts_of_one_name_are_told_apart_by_their_file(cli: typer.Typer, h200: tuple, tmp_path: Path) -> None:
    facts = h200[0]  # every recorded VM is called "vm"
    args = []
    for i in range(3):
        (tmp_path / f"host{i}.json").write_text(json.dumps(facts))
        args += ["--facts", str(tmp_path / f"host{i}.json")]
    res = _invoke(cli, *args, "--json")
    hosts = {r["host"] for r in json.loads(res.stdout) if "fleet" in r}
    assert hosts == {"*"}  # identical hosts: nothing flagged
    rows = [r for r in json.loads(res.stdout) if r.get("fleet", {}).get("figure") == "gpu0 NVLink GB/s"]
    assert set(rows[0]["fleet"]["values"]) == {"vm (host0.json)", "vm (host1.json)", "vm (host2.json)"}
