"""The host contract of a PD node, checked with pytest-testinfra against any inventory and overlay.

    pytest tests/conformance --hosts=ansible://pd_cluster --ansible-inventory=inventory/<yours>/hosts.yml

What a node must hold is read from the node's own /etc/pdinfra/cluster.json (conftest.py): the serving venv with the
pinned vLLM/NIXL/router, each of its instances as an enabled, running unit on its port on the node's serving
address, run by the service user with the systemd sandbox and the KV connector the model names, its descriptor
and private environment file, the UCX environment, the firewall table, the router, the gateway and the deep-health
probe on router hosts, and no failing verdict from `pdinfra validate` on the host itself. One small class per
resource; per-instance tests are parametrized by instance.
"""

from __future__ import annotations

import json
import shlex

import pytest
from conformance.contract_facts import CONNECTOR_CLASS, PINS

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


class TestServingRuntime:
    def test_the_venv_has_the_pinned_stack(self, host, model):
        pip = host.pip.get_packages(pip_path=f"{model['venv']}/bin/pip")
        for name, version in PINS[model["profile"]].items():
            assert name in pip and pip[name]["version"] == version, (name, pip.get(name))

    def test_the_venv_is_compiled_to_bytecode(self, host, model):
        """The services run unprivileged and cannot write __pycache__ in the root-owned venv: without compiled
        bytecode every vLLM process compiles its imports at each start (twice as slow on the local nodes,
        docs/runs/2026-12-02-bytecode). ``-B``: this check writes none itself."""
        res = host.run(f"{model['venv']}/bin/python -B -c {shlex.quote(BYTECODE)} {' '.join(COMPILED)}")
        assert res.rc == 0, res.stderr
        assert res.stdout.strip() == "", f"no bytecode for: {res.stdout.strip()}"

    def test_cpu_hosts_have_no_torchvision_beside_torch_cpu(self, host, model):
        if model["profile"] != "cpu":
            pytest.skip("GPU profile keeps vLLM's own dependencies")
        pip = host.pip.get_packages(pip_path=f"{model['venv']}/bin/pip")
        assert not {"torchvision", "torchaudio", "torchcodec"} & set(pip)

    def test_the_system_libraries_and_compilers(self, host, model):
        """python3-venv and libnuma1; and what vLLM compiles with at run time (serving.toolchain)."""
        assert host.package("python3-venv").is_installed and host.package("libnuma1").is_installed
        compiler = "g++" if model["profile"] == "cpu" else "gcc"
        assert host.exists(compiler), f"no {compiler}: vLLM's first logprobs request would kill its engine"
        assert host.run("ls /usr/include/python3*/Python.h").rc == 0, "no Python.h (python3-dev)"


class TestInstance:
    def test_an_enabled_running_unit_on_its_port(self, host, node, instance):
        unit = host.service(instance["unit"].removesuffix(".service"))
        assert unit.is_enabled and unit.is_running, instance["name"]
        assert host.socket(f"tcp://{node['address']}:{instance['port']}").is_listening, instance["port"]
        assert not host.socket(f"tcp://0.0.0.0:{instance['port']}").is_listening, "binds every address"

    def test_its_descriptor_and_private_environment(self, host, node, instance):
        desc = json.loads(host.file(f"/etc/pdinfra/instances/{instance['name']}.json").content_string)
        assert desc["role"] == instance["role"] and desc["port"] == instance["port"]
        assert desc["side_channel_host"] == node["address"]
        env = host.file(f"/etc/pdinfra/instances/{instance['name']}.env")
        assert env.mode == 0o600 and env.user == "root"
        assert f"VLLM_NIXL_SIDE_CHANNEL_HOST={node['address']}" in env.content_string
        assert f"VLLM_NIXL_SIDE_CHANNEL_PORT={instance['side_channel_port']}" in env.content_string

    def test_its_unit_restarts_runs_sandboxed_and_names_the_connector(self, host, model, instance):
        unit = host.file(f"/etc/systemd/system/{instance['unit']}").content_string
        assert "Restart=always" in unit or "Restart=on-failure" in unit
        assert f"User={model['service_user']}" in unit and "NoNewPrivileges=yes" in unit
        assert "ProtectSystem=strict" in unit
        if model["layout"] == "pd":
            want = "MultiConnector" if instance.get("kv_store") else CONNECTOR_CLASS[model["connector"]]
            assert f'"kv_connector": "{want}"' in unit, want


class TestUcxEnvironment:
    def test_tcp_stays_in_ucx_tls(self, host):
        """The ucx role's file, read by every vLLM unit; tcp stays in UCX_TLS (NIXL's UCX wire-up needs it)."""
        env = host.file("/etc/pdinfra/ucx.env")
        assert env.exists
        tls = [line.split("=", 1)[1] for line in env.content_string.splitlines() if line.startswith("UCX_TLS=")]
        assert tls and "tcp" in tls[0].split(","), env.content_string


class TestRouter:
    def test_the_router_and_gateway_run_and_the_gateway_listens(self, host, model, router):
        assert host.service("pdinfra-router").is_running and host.service("pdinfra-gateway").is_running
        assert host.socket(f"tcp://0.0.0.0:{router['port']}").is_listening
        unit = host.file("/etc/systemd/system/pdinfra-router.service").content_string
        if model["layout"] == "pd" and model["connector"] != "lmcache":  # lmcache: pdinfra's proxy in its place
            assert "--vllm-pd-disaggregation" in unit and f"--kv-connector {model['connector']}" in unit
            assert all(f"--decode {url}" in unit for url in router["decode"]), router["decode"]

    def test_the_probe_timer_and_private_client_key(self, host, router):
        assert host.service("pdinfra-probe.timer").is_running
        for name in ("/etc/pdinfra/router.env", "/etc/pdinfra/gateway.env", "/etc/pdinfra/client.env"):
            f = host.file(name)
            assert f.mode == 0o600 and f.user == "root", name


class TestFirewall:
    def test_the_table_is_loaded(self, host, model):
        if not model.get("firewall", True):
            pytest.skip("pdinfra_firewall is false")
        assert host.service("pdinfra-firewall").is_enabled
        with host.sudo():
            table = host.check_output("nft list table inet pdinfra")
        assert "set peers" in table and "drop" in table


class TestValidator:
    def test_no_failure_on_the_host(self, host):
        res = host.run("pdinfra validate --json")
        assert res.rc == 0, res.stdout[-2000:] + res.stderr[-2000:]
        checks = json.loads(res.stdout)  # `pdinfra validate --json`: a list of check results
        assert checks and not [c for c in checks if c.get("verdict") == "fail"], checks
