"""Tests for the host-layer roles (preflight, nvidia_driver, rdma_roce, ucx).

* Golden files: the roles' templates rendered for inventory/examples/hgx-h100 with plain
  Jinja2 plus the role-local filter plugins, compared with tests/fixtures/golden/hgx-h100.
  Regenerate with ``PDINFRA_UPDATE_GOLDEN=1 pytest tests/unit/test_host_roles.py -k golden_files``: that run writes
  them and fails (never compared in the run that wrote them); review the diff, commit it, run again.
* The GPU<->NIC affinity filter and the rdma_roce validation helpers as pure functions.
* ansible-playbook: syntax check of playbooks/host.yml; bad variables fail at role entry,
  naming the variable, before any change (run in --check against localhost, gather_facts
  on); a converge of the whole host play against localhost that writes only below
  tmp_path: --check, converge, second converge with changed=0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
INVENTORY = REPO / "inventory" / "examples" / "hgx-h100"
GOLDEN = REPO / "tests" / "fixtures" / "golden" / "hgx-h100"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
UPDATE = os.environ.get("PDINFRA_UPDATE_GOLDEN") == "1"

# Facts recorded from an HGX H100 node (Ubuntu 24.04) that the templates consume.
RECORDED_FACTS = {
    "distribution": "Ubuntu",
    "distribution_version": "24.04",
    "architecture": "x86_64",
    "kernel": "6.8.0-45-generic",
    "python": {"version": {"major": 3, "minor": 12}},  # Ubuntu 24.04's python3
}
RECORDED_GID_INDEXES = {f"mlx5_{i}": 3 for i in range(8)}


def _load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


affinity = _load_module(ROLES / "ucx" / "filter_plugins" / "ucx_affinity.py")
rnet = _load_module(ROLES / "rdma_roce" / "filter_plugins" / "rdma_roce_net.py")


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _env(role: str) -> jinja2.Environment:
    # The template module's defaults: trim_blocks on, trailing newline kept.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROLES / role / "templates")),
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(affinity.FilterModule().filters())
    env.filters.update(rnet.FilterModule().filters())
    return env


def _host_vars(host: str) -> dict:
    """Role defaults < group_vars < host_vars, plus what the roles' tasks compute."""
    variables: dict = {}
    for role in ("preflight", "nvidia_driver", "rdma_roce", "ucx"):
        variables.update(_yaml(ROLES / role / "defaults" / "main.yml"))
    variables.update(_yaml(INVENTORY / "group_vars" / "all.yml"))
    variables.update(_yaml(INVENTORY / "group_vars" / "hgx.yml"))
    variables.update(_yaml(INVENTORY / "host_vars" / f"{host}.yml"))
    variables["ansible_facts"] = RECORDED_FACTS
    variables["ucx_venv"] = "/opt/pdinfra/venv"  # pdinfra_cluster.venv
    # nvidia_driver: values tasks/setup-Debian.yml and vars/ derive.
    variables["__nvidia_driver_cuda_repo_url"] = f"{variables['nvidia_driver_cuda_repo_base_url']}/ubuntu2404/x86_64"
    variables["__nvidia_driver_cuda_key"] = "/etc/apt/keyrings/pdinfra-cuda.asc"
    # ucx: values tasks/main.yml derives (inventory topology, rail NICs present).
    variables["__ucx_gid_indexes"] = RECORDED_GID_INDEXES
    variables["__ucx_kind"] = "gpu_rdma"
    variables["__ucx_gpus"] = variables["ucx_gpus"]
    variables["__ucx_nics"] = variables["ucx_nics"]
    variables["__ucx_map"] = affinity.ucx_gpu_nic_map(variables["ucx_gpus"], variables["ucx_nics"])
    return variables


def _rendered(host: str) -> dict[str, str]:
    v = _host_vars(host)
    out = {}
    for role, template, name in (
        ("rdma_roce", "60-pdinfra-rails.yaml.j2", "etc/netplan/60-pdinfra-rails.yaml"),
        ("rdma_roce", "60-pdinfra-rails.conf.j2", "etc/sysctl.d/60-pdinfra-rails.conf"),
        ("rdma_roce", "pdinfra-roce-qos.j2", "usr/local/sbin/pdinfra-roce-qos"),
        ("rdma_roce", "pdinfra-roce-qos.service.j2", "etc/systemd/system/pdinfra-roce-qos.service"),
        ("nvidia_driver", "blacklist-nouveau.conf.j2", "etc/modprobe.d/blacklist-nouveau.conf"),
        (
            "nvidia_driver",
            "nvidia-persistenced-override.conf.j2",
            "etc/systemd/system/nvidia-persistenced.service.d/pdinfra.conf",
        ),
        ("nvidia_driver", "cuda.sources.j2", "etc/apt/sources.list.d/pdinfra-cuda.sources"),
        ("nvidia_driver", "51pdinfra-nvidia-no-unattended.j2", "etc/apt/apt.conf.d/51pdinfra-nvidia-no-unattended"),
    ):
        out[name] = _env(role).get_template(template).render(**v)
    ucx = _env("ucx").get_template("ucx.env.j2")
    out["etc/pdinfra/ucx.env"] = ucx.render(**v, __ucx_gpu_entry={})
    for entry in v["__ucx_map"]:
        out[f"etc/pdinfra/ucx-gpu{entry['gpu']}.env"] = ucx.render(**v, __ucx_gpu_entry=entry)
    return out


HOSTS = ["hgx-h100-01", "hgx-h100-02"]


@pytest.mark.parametrize("host", HOSTS)
def test_golden_files(host):
    rendered = _rendered(host)
    base = GOLDEN / host
    if UPDATE:  # written, never compared in the run that wrote them: the diff is for review in the commit
        shutil.rmtree(base, ignore_errors=True)
        for name, text in rendered.items():
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_text(text)
        pytest.fail(
            f"golden files of {host} rewritten: review `git diff {GOLDEN.relative_to(REPO)}`, commit it, and "
            "run the test again without PDINFRA_UPDATE_GOLDEN"
        )
    committed = {str(p.relative_to(base)): p.read_text() for p in base.rglob("*") if p.is_file()}
    assert sorted(committed) == sorted(rendered), "golden file set differs (PDINFRA_UPDATE_GOLDEN=1 regenerates)"
    for name, text in rendered.items():
        assert text == committed[name], f"{host}/{name} differs from its golden file"


def test_golden_netplan_is_valid_yaml_with_one_table_per_rail():
    doc = yaml.safe_load(_rendered("hgx-h100-01")["etc/netplan/60-pdinfra-rails.yaml"])
    eths = doc["network"]["ethernets"]
    assert len(eths) == 8
    tables = set()
    for rail, cfg in eths.items():
        assert cfg["mtu"] == 9000
        table = cfg["routing-policy"][0]["table"]
        assert cfg["routing-policy"][0]["priority"] == 10 * table
        assert {r["table"] for r in cfg["routes"]} == {table}
        assert any(r.get("via", "").startswith("198.18.") for r in cfg["routes"]), rail
        tables.add(table)
    assert tables == set(range(101, 109))


def test_golden_ucx_env_contents():
    files = _rendered("hgx-h100-01")
    host = dict(
        line.split("=", 1)
        for line in files["etc/pdinfra/ucx.env"].splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert host["UCX_TLS"] == "rc_x,cuda_ipc,cuda_copy,tcp,self,sm"
    assert host["UCX_NET_DEVICES"] == ",".join(f"mlx5_{i}:1" for i in range(8))
    assert host["UCX_IB_GID_INDEX"] == "3"
    # vLLM's decode READs the KV: cuda_ipc GET on, also where UCX's auto would turn it off (no active NVLink)
    assert host["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    for gpu in range(8):
        assert f"UCX_NET_DEVICES=mlx5_{gpu}:1\n" in files[f"etc/pdinfra/ucx-gpu{gpu}.env"]


def test_ucx_module_dir_venv_follows_the_nodes_python():
    """ucx_module_dir: venv (the HGX example) names the nixl-cu13 wheel's UCX in the venv under the node's Python:
    3.12 on Ubuntu 24.04, 3.10 on 22.04 (a hard-coded python3.12 path was wrong on 22.04)."""
    v = _host_vars("hgx-h100-01")
    assert v["ucx_module_dir"] == "venv"
    ucx = _env("ucx").get_template("ucx.env.j2")

    def module_dir(minor: int, **over) -> str | None:
        facts = {**RECORDED_FACTS, "python": {"version": {"major": 3, "minor": minor}}}
        text = ucx.render(**{**v, **over, "ansible_facts": facts}, __ucx_gpu_entry={})
        return next((line.split("=", 1)[1] for line in text.splitlines() if line.startswith("UCX_MODULE_DIR=")), None)

    assert module_dir(12) == "/opt/pdinfra/venv/lib/python3.12/site-packages/nixl_cu13.libs/ucx"
    assert module_dir(10) == "/opt/pdinfra/venv/lib/python3.10/site-packages/nixl_cu13.libs/ucx"
    assert module_dir(10, ucx_module_dir="/opt/ucx/lib/ucx") == "/opt/ucx/lib/ucx"
    assert module_dir(10, ucx_module_dir="") is None


def test_ucx_reads_gid_indexes_like_rdma_roce():
    assert affinity.ucx_ipv4_gid("198.18.1.11/24") == rnet.rdma_roce_ipv4_gid("198.18.1.11/24")
    results = [
        {"item": {"rdma_dev": "mlx5_0"}, "stdout": "3"},
        {"item": {"rdma_dev": "mlx5_1"}, "stdout": "none"},
        {"item": {"rdma_dev": "mlx5_2"}, "stdout": "missing"},
        {"item": {"rdma_dev": "mlx5_3"}, "skipped": True},
    ]
    assert affinity.ucx_found_gids(results) == {"mlx5_0": 3}
    assert affinity.ucx_found_gids([]) == {}
    # a rail without its GID: no UCX_IB_GID_INDEX at all (UCX picks), never the other rails' index
    v = _host_vars("hgx-h100-01")
    ucx = _env("ucx").get_template("ucx.env.j2")
    assert "UCX_IB_GID_INDEX=3\n" in ucx.render(**v, __ucx_gpu_entry={})
    partial = {**v, "__ucx_gid_indexes": {f"mlx5_{i}": 3 for i in range(7)}}
    assert "UCX_IB_GID_INDEX=" not in ucx.render(**partial, __ucx_gpu_entry={})


def test_golden_qos_script_is_valid_bash():
    script = _rendered("hgx-h100-01")["usr/local/sbin/pdinfra-roce-qos"]
    assert "PFC_VECTOR=0,0,0,1,0,0,0,0" in script and "TOS=106" in script
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


# ---------------------------------------------------------------- affinity filter


def _sw(i):
    return f"sw{i // 2}"


def test_affinity_same_switch_wins_and_balances():
    gpus = [{"index": i, "numa_node": i // 4, "pcie_switch": _sw(i)} for i in range(8)]
    nics = [{"rdma_dev": f"mlx5_{i}", "numa_node": i // 4, "pcie_switch": _sw(i)} for i in range(8)]
    result = affinity.ucx_gpu_nic_map(gpus, nics)
    assert [r["nic"] for r in result] == [f"mlx5_{i}" for i in range(8)]
    assert {r["distance"] for r in result} == {"PXB"}


def test_affinity_falls_back_to_numa_then_sys():
    gpus = [{"index": 0, "numa_node": 1}, {"index": 1, "numa_node": 0}]
    nics = [{"rdma_dev": "mlx5_0", "numa_node": 0}, {"rdma_dev": "mlx5_1", "numa_node": 1}]
    result = affinity.ucx_gpu_nic_map(gpus, nics)
    assert [(r["nic"], r["distance"]) for r in result] == [("mlx5_1", "NODE"), ("mlx5_0", "NODE")]
    far = affinity.ucx_gpu_nic_map([{"index": 0, "numa_node": 1}], [{"rdma_dev": "mlx5_0", "numa_node": 0}])
    assert far[0]["distance"] == "SYS"


def test_affinity_pcie_paths_from_sysfs():
    lines = [
        "gpu\t0000:18:00.0\t0\t/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
        "gpu\t0000:9a:00.0\t1\t/sys/devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:00.0/0000:9a:00.0",
        "nic\tmlx5_1\t0000:9c:00.0\t1\t/sys/devices/pci0000:97/0000:97:01.0/0000:98:00.0/0000:99:01.0/0000:9c:00.0\tens2np0",
        "nic\tmlx5_0\t0000:1a:00.0\t0\t/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:1a:00.0\tens1np0",
        "nic\tmlx5_9\t0000:c1:00.0\t1\t/sys/devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0\tens9np0",
    ]
    topo = affinity.ucx_parse_topology(lines, ["mlx5_0", "mlx5_1"])
    assert [g["index"] for g in topo["gpus"]] == [0, 1]
    assert [n["rdma_dev"] for n in topo["nics"]] == ["mlx5_0", "mlx5_1"]  # mlx5_9 is not a rail
    result = affinity.ucx_gpu_nic_map(topo["gpus"], topo["nics"])
    assert [(r["nic"], r["distance"]) for r in result] == [("mlx5_0", "PXB"), ("mlx5_1", "PXB")]
    host_bridge_only = {"pcie_path": ["pci0000:15", "0000:15:02.0", "0000:1b:00.0"]}
    assert affinity.ucx_pcie_distance(topo["gpus"][0], host_bridge_only) == (1, "PHB")


def test_affinity_without_nics_and_bad_input():
    result = affinity.ucx_gpu_nic_map([{"index": 1}, {"index": 0}], [])
    assert [(r["gpu"], r["nic"]) for r in result] == [(0, None), (1, None)]
    with pytest.raises(affinity._FilterError, match="duplicate GPU index"):
        affinity.ucx_gpu_nic_map([{"index": 0}, {"index": 0}], [{"rdma_dev": "mlx5_0"}])
    with pytest.raises(affinity._FilterError, match="rdma_dev"):
        affinity.ucx_gpu_nic_map([{"index": 0}], [{"netdev": "ens1np0"}])


def test_env_lines_and_net_devices():
    assert affinity.ucx_net_devices([{"rdma_dev": "mlx5_0"}, {"rdma_dev": "mlx5_1", "port": 2}]) == "mlx5_0:1,mlx5_1:2"
    assert affinity.ucx_env_lines({"B": "x y", "A": "1", "C": ""}) == 'A=1\nB="x y"\n'
    with pytest.raises(affinity._FilterError):
        affinity.ucx_env_lines({"BAD-NAME": "1"})


def test_rdma_roce_net_helpers():
    assert rnet.rdma_roce_ipv4_gid("198.18.1.11/24") == "0000:0000:0000:0000:0000:ffff:c612:010b"
    assert rnet.rdma_roce_network("198.18.1.11/24") == "198.18.1.0/24"
    assert rnet.rdma_roce_pfc_vector(3) == "0,0,0,1,0,0,0,0"
    assert not rnet.rdma_roce_is_cidr("198.18.1.11") and not rnet.rdma_roce_is_cidr("198.18.1.0/24")
    nics = [
        {"netdev": "eth0", "rdma_dev": "mlx5_0", "address": "198.18.1.11/24", "gateway": "198.18.2.1", "table": 101},
        {"netdev": "ens9", "rdma_dev": "mlx5_0", "address": "198.18.1.11/24", "table": 101},
    ]
    errors = " | ".join(rnet.rdma_roce_nic_errors(nics, ["eth0", "lo"]))
    for fragment in (
        "gateway 198.18.2.1 is not inside",
        "rdma_roce_nics[1].netdev ens9 is not an interface",
        "rdma_dev mlx5_0 is listed twice",
        "table 101 is used twice",
        "198.18.1.11 is used twice",
    ):
        assert fragment in errors


# ---------------------------------------------------------------- ansible-playbook


def _ansible_env(tmp: Path) -> dict:
    return {
        "ANSIBLE_ROLES_PATH": str(ROLES),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
    }


def _play(tmp: Path, playbook: Path, *args: str, env: dict | None = None):
    """The playbook on localhost through pdinfra.playbook (ansible-runner): a PlaybookResult."""
    from pdinfra.playbook import run_playbook

    tmp.mkdir(parents=True, exist_ok=True)
    return run_playbook(
        "localhost,",
        playbook,
        ["-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", *args],
        log=tmp / f"{playbook.stem}-{len(list(tmp.glob('*.log')))}.log",
        timeout_s=180,
        env={**_ansible_env(tmp), **(env or {})},
    )


def pytestmark_ansible(fn):
    """Runs ansible-playbook: the slow unit tier (``./pd test``, not ``./pd check``)."""
    fn = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not in the venv")(fn)
    return pytest.mark.slow(fn)


@pytestmark_ansible
def test_host_playbook_syntax_check(tmp_path):
    from pdinfra.playbook import run_playbook

    res = run_playbook(
        INVENTORY / "hosts.yml",
        "playbooks/host.yml",
        ["--syntax-check"],
        log=tmp_path / "syntax.log",
        timeout_s=120,
        env=_ansible_env(tmp_path),
    )
    assert res.rc == 0, res.summary()


BAD_VARS = {
    "unknown_driver_branch": ("nvidia_driver", {"nvidia_driver_branch": "600"}, "nvidia_driver_branch"),
    "driver_version_not_in_branch": (
        "nvidia_driver",
        {"nvidia_driver_version": "570.1.2"},
        "nvidia_driver_version=570.1.2",
    ),
    "dcgm_not_a_bool": ("nvidia_driver", {"nvidia_driver_dcgm": "maybe"}, "nvidia_driver_dcgm"),
    "mtu_20000": ("rdma_roce", {"rdma_roce_mtu": 20000}, "rdma_roce_mtu=20000"),
    "pfc_priority_9": ("rdma_roce", {"rdma_roce_pfc_priority": 9}, "rdma_roce_pfc_priority"),
    "nic_not_on_host": (
        "rdma_roce",
        {
            "rdma_roce_nics": [
                {"netdev": "pdinfra-absent0", "rdma_dev": "mlx5_0", "address": "198.18.1.11/24", "table": 101}
            ]
        },
        "rdma_roce_nics[0].netdev pdinfra-absent0 is not an interface",
    ),
}


@pytest.fixture(scope="module")
def bad_var_runs(tmp_path_factory):
    """One run per bad-variable case (in turn: ansible-runner drives each through a pty, which a multi-threaded
    process should not fork)."""
    tmp = tmp_path_factory.mktemp("badvars")
    runs = {}
    for case, (role, overrides, _) in BAD_VARS.items():
        book = tmp / f"{case}.yml"
        book.write_text(
            yaml.safe_dump(
                [{"name": f"bad variables: {case}", "hosts": "all", "gather_facts": True, "roles": [{"role": role}]}]
            )
        )
        # --check as a second safety net: even a broken guard could not change this machine.
        runs[case] = _play(tmp / case, book, "--check", "-e", json.dumps(overrides))
    return runs


@pytestmark_ansible
@pytest.mark.parametrize("case", sorted(BAD_VARS))
def test_bad_variables_fail_at_role_entry(bad_var_runs, case):
    role, _, needle = BAD_VARS[case]
    res = bad_var_runs[case]
    assert res.rc != 0, res.summary()
    (failure,) = res.failures
    assert failure.host == "localhost" and needle in failure.msg, failure
    assert res.recap["localhost"]["failed"] == 1 and res.recap["localhost"]["changed"] == 0, res.recap
    # The failure is the role's entry validation, before any task that could change something.
    tasks = res.task_names()
    assert tasks[0] == "Gathering Facts", tasks
    assert res.changed_tasks() == []
    assert all(t.startswith(f"{role} : ") and ("Validat" in t or "Check" in t) for t in tasks[1:]), tasks


@pytestmark_ansible
def test_host_play_check_converge_idempotent(tmp_path):
    """The whole host play on localhost, writing only below tmp_path, hardware untouched."""
    out = tmp_path / "root"
    extra = {
        "preflight_disk_requirements": [{"path": str(out / "opt" / "pdinfra"), "min_free_gib": 0}],
        "pdinfra_gpu": False,  # never touch a real driver on the machine running the tests
        "rdma_roce_nics": [
            {"netdev": "lo", "rdma_dev": "mlx5_0", "address": "198.18.1.11/24", "gateway": "198.18.1.1", "table": 101}
        ],
        "rdma_roce_apply": "never",
        # Some machines (gVisor) report no interfaces to Ansible; the NIC-name check has its own test above.
        "rdma_roce_check_interfaces": False,
        "rdma_roce_install_packages": False,
        "rdma_roce_netplan_file": str(out / "etc/netplan/60-pdinfra-rails.yaml"),
        "rdma_roce_sysctl_file": str(out / "etc/sysctl.d/60-pdinfra-rails.conf"),
        "rdma_roce_qos_script": str(out / "usr/local/sbin/pdinfra-roce-qos"),
        "rdma_roce_systemd_dir": str(out / "etc/systemd/system"),
        "ucx_env_dir": str(out / "etc/pdinfra"),
        "ucx_host_kind": "gpu_rdma",
        "ucx_gpus": [
            {"index": 0, "pci": "0000:18:00.0", "numa_node": 0},
            {"index": 1, "pci": "0000:2a:00.0", "numa_node": 0},
        ],
        "ucx_nics": [{"rdma_dev": "mlx5_0", "numa_node": 0}],
        "ucx_discover_topology": False,
    }
    for sub in ("etc/netplan", "etc/sysctl.d", "usr/local/sbin", "etc/systemd/system"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    # A stale per-GPU file from an earlier, larger configuration must be removed.
    (out / "etc/pdinfra").mkdir(parents=True)
    (out / "etc/pdinfra/ucx-gpu7.env").write_text("stale\n")
    args = ("-e", json.dumps(extra))
    book = REPO / "playbooks" / "host.yml"
    # Gather facts once and reuse them for the three runs (the play leaves gathering implicit).
    cache = {
        "ANSIBLE_GATHERING": "smart",
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
    }

    check = _play(tmp_path, book, "--check", *args, env=cache)
    assert check.rc == 0, check.summary()
    assert not (out / "etc/pdinfra/ucx.env").exists(), "--check wrote a file"

    # preflight is read-only (every task changed_when false) and fully ran in --check above.
    first = _play(tmp_path, book, "--skip-tags", "preflight", *args, env=cache)
    assert first.rc == 0, first.summary()
    assert first.recap["localhost"]["changed"] > 0
    env = (out / "etc/pdinfra/ucx.env").read_text()
    assert "UCX_NET_DEVICES=mlx5_0:1" in env and "UCX_TLS=rc_x,cuda_ipc,cuda_copy,tcp,self,sm" in env
    assert sorted(p.name for p in (out / "etc/pdinfra").iterdir()) == ["ucx-gpu0.env", "ucx-gpu1.env", "ucx.env"]
    assert (out / "etc/netplan/60-pdinfra-rails.yaml").stat().st_mode & 0o777 == 0o600

    second = _play(tmp_path, book, "--skip-tags", "preflight", *args, env=cache)
    assert second.rc == 0, second.summary()
    assert second.recap["localhost"]["changed"] == 0 and second.changed_tasks() == [], second.changed_tasks()


@pytestmark_ansible
def test_the_ucx_tag_alone_writes_the_gid_index(tmp_path):
    """`playbooks/host.yml --tags ucx` runs without the rdma_roce role, whose fact held the GID indexes: the ucx role
    reads them itself (here from a fake /sys/class/infiniband tree) and still writes UCX_IB_GID_INDEX."""
    sysfs = tmp_path / "infiniband"
    for dev, gid in (
        ("mlx5_0", "0000:0000:0000:0000:0000:ffff:c612:010b"),
        ("mlx5_1", "0000:0000:0000:0000:0000:ffff:c612:020b"),
    ):
        port = sysfs / dev / "ports" / "1"
        (port / "gids").mkdir(parents=True)
        (port / "gid_attrs" / "types").mkdir(parents=True)
        for n, value, kind in ((0, "fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"), (3, gid, "RoCE v2")):
            (port / "gids" / str(n)).write_text(value + "\n")
            (port / "gid_attrs" / "types" / str(n)).write_text(kind + "\n")
    out = tmp_path / "etc-pdinfra"
    rails = [{"netdev": "ens1np0", "rdma_dev": "mlx5_0", "address": "198.18.1.11/24", "table": 101},
             {"netdev": "ens2np0", "rdma_dev": "mlx5_1", "address": "198.18.2.11/24", "table": 102}]  # fmt: skip
    extra = {"pdinfra_gpu": False, "rdma_roce_nics": rails, "ucx_env_dir": str(out), "ucx_host_kind": "gpu_rdma",
             "ucx_gpus": [{"index": 0, "pci": "0000:18:00.0", "numa_node": 0}],
             "ucx_nics": [{"rdma_dev": "mlx5_0", "numa_node": 0}, {"rdma_dev": "mlx5_1", "numa_node": 0}],
             "ucx_discover_topology": False, "__ucx_infiniband_dir": str(sysfs)}  # fmt: skip
    res = _play(tmp_path, REPO / "playbooks" / "host.yml", "--tags", "ucx", "-e", json.dumps(extra))
    assert res.rc == 0, res.summary()
    assert "ucx : Read each rail's RoCE v2 GID index (the rdma_roce role did not run in this play)" in res.task_names()
    assert "UCX_IB_GID_INDEX=3\n" in (out / "ucx.env").read_text()
    # the GID of one rail gone (its address not up): no index rather than a wrong one
    (sysfs / "mlx5_1" / "ports" / "1" / "gid_attrs" / "types" / "3").write_text("IB/RoCE v1\n")
    res = _play(tmp_path, REPO / "playbooks" / "host.yml", "--tags", "ucx", "-e", json.dumps(extra))
    assert res.rc == 0, res.summary()
    assert "UCX_IB_GID_INDEX=" not in (out / "ucx.env").read_text()


@pytestmark_ansible
def test_preflight_checks_the_disk_where_the_model_goes(tmp_path):
    """The disk check measures pdinfra_model.path's filesystem (the model's one place, from the cluster model), not a
    path of its own: with more free space required than any disk has, preflight fails naming that path and the
    variable. node1 of the local inventory, run on this machine (local connection, read-only tag)."""
    extra = {"preflight_hardware_checks": "never", "preflight_disk_requirements": [],
             "preflight_model_min_free_gib": 10**6, "ansible_python_interpreter": sys.executable}  # fmt: skip
    res = _play(
        tmp_path,
        REPO / "playbooks" / "host.yml",
        "-i",
        str(REPO / "inventory" / "local" / "hosts.yml"),
        "-l",
        "node1",
        "--tags",
        "preflight",
        "-e",
        json.dumps(extra),
    )
    assert res.rc != 0, res.summary()
    msg = " ".join(f.msg for f in res.failures)
    assert "disk /opt/pdinfra/models/pdinfra-tiny-llama" in msg, msg
    assert "< 1000000 GiB (preflight_model_min_free_gib, for pdinfra_model.path)" in msg, msg
