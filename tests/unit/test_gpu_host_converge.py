"""The host layer (playbooks/host.yml) on a real one-GPU host's recorded facts, with the inventory `pdinfra inventory
init` writes from them: what benchmarks/gpu_host_converge.sh does on the host itself, here on localhost (-c local)
with the nvidia_driver role reading the recorded driver (``__nvidia_driver_root``, its two commands replayed).

The host: one H100, Ubuntu 24.04, driver 580.159.04 open loaded, no driver package in dpkg (a vendor image), a
container (as this build machine is). In check mode, with nvidia_driver_judge_in_container, the role's decision is
reached and no task installs, removes, pins or restarts anything; a real run of the ucx tag writes only the UCX
environment and changes nothing the second time; the override outside check mode stops the role at its entry.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from gpu_hosts import ONE_GPU_FACTS, PACKAGED_580, REPO, driver_tree, load

from pdinfra.cluster import inventory_init as ii

ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook not in the venv"),
]

# Modules that install, remove, pin, hold, load or restart: none may run (ok or changed) on a compliant host.
ACTING = {"apt", "ansible.builtin.apt", "package", "ansible.builtin.package", "dpkg_selections",
          "ansible.builtin.dpkg_selections", "systemd_service", "ansible.builtin.systemd_service", "systemd",
          "ansible.builtin.systemd", "service", "ansible.builtin.service", "reboot", "ansible.builtin.reboot",
          "community.general.modprobe", "modprobe", "get_url", "ansible.builtin.get_url"}  # fmt: skip
RAN = ("runner_on_ok", "runner_item_on_ok", "runner_on_failed", "runner_item_on_failed")


def _inventory(tmp: Path, host: str = "h100x1") -> tuple[Path, dict]:
    facts = load(ONE_GPU_FACTS[host])
    plan = ii.plan_inventory([ii.load_facts(facts, str(ONE_GPU_FACTS[host]))])
    ii.write(ii.render(plan, [str(ONE_GPU_FACTS[host])]), tmp / "inventory")
    return tmp / "inventory" / "hosts.yml", facts


def _extra(tmp: Path, facts: dict, dpkg: list[str] | None = None, judge: bool = True) -> list[str]:
    tree = driver_tree(facts, tmp / "host", dpkg=dpkg)
    extra = {
        "ansible_python_interpreter": sys.executable,
        "nvidia_driver_judge_in_container": judge,
        "__nvidia_driver_root": str(tree),
        "__nvidia_driver_dpkg_argv": ["cat", str(tree / "dpkg.txt")],
        "__nvidia_driver_smi_argv": ["cat", str(tree / "smi.txt")],
        "ucx_env_dir": str(tmp / "etc-pdinfra"),
    }
    return ["-c", "local", "-e", json.dumps(extra)]


def _play(tmp: Path, inventory: Path, *args: str):
    from pdinfra.playbook import run_playbook

    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    env = {"ANSIBLE_HOME": str(tmp / "ansible-home"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp")}
    log = logs / f"run{len(list(logs.glob('*.log')))}.log"
    return run_playbook(inventory, "playbooks/host.yml", list(args), log=log, timeout_s=300, env=env)


def _events(res) -> list[dict]:
    out = []
    for line in res.events.read_text().splitlines():
        ev = json.loads(line)
        data = ev.get("event_data") or {}
        if ev.get("event") in RAN or ev.get("event") == "runner_on_skipped":
            out.append(
                {
                    "event": ev["event"],
                    "task": data.get("task", ""),
                    "role": data.get("role", ""),
                    "action": data.get("task_action", ""),
                    "changed": bool((data.get("res") or {}).get("changed")),
                }
            )
    return out


def _messages(res, role: str) -> str:
    return " ".join(m for t in res.tasks if t.name.startswith(f"{role} : ") for m in t.messages.values())


def test_check_mode_on_a_compliant_host_plans_nothing_but_the_ucx_files(tmp_path):
    inventory, facts = _inventory(tmp_path)
    res = _play(tmp_path, inventory, "--check", "--skip-tags", "preflight", *_extra(tmp_path, facts))
    assert res.rc == 0, res.summary()
    events = _events(res)
    acting = [e for e in events if e["event"] in RAN and e["action"] in ACTING]
    assert acting == [], acting
    assert not any(t.handler for t in res.tasks if t.ran), [t.name for t in res.tasks if t.handler]
    changed = {e["task"] for e in events if e["changed"]}
    assert changed and all(e["role"] == "ucx" for e in events if e["changed"]), changed
    ran = [t.name for t in res.tasks if t.ran and t.name.startswith("nvidia_driver : ") and "arg spec" not in t.name]
    assert "nvidia_driver : Judge the installed driver against the pin (loaded module, packages, nvidia-smi)" in ran
    assert not any("Install" in n or "Hold" in n or "Blacklist" in n or "persistenced" in n for n in ran), ran
    said = _messages(res, "nvidia_driver")
    assert "open driver 580.159.04 installed outside packages (no driver package in dpkg)" in said, said
    assert "nvidia-smi 580.159.04; persistence mode on" in said and "CUDA repository (not contacted)" in said
    assert "rdma_roce: nothing to do" in " ".join(m for t in res.tasks for m in t.messages.values())
    assert not (tmp_path / "etc-pdinfra").exists(), "--check wrote a file"


def test_the_ucx_tag_for_real_writes_the_environment_once(tmp_path):
    inventory, facts = _inventory(tmp_path)
    extra = _extra(tmp_path, facts, judge=False)
    first = _play(tmp_path, inventory, "--tags", "ucx", *extra)
    assert first.rc == 0, first.summary()
    assert first.recap["vm"]["changed"] > 0
    assert {t.split(": ", 1)[1].split(" : ")[0] for t in first.changed_tasks()} == {"ucx"}, first.changed_tasks()
    env = (tmp_path / "etc-pdinfra" / "ucx.env").read_text()
    assert "UCX_TLS=cuda_ipc,cuda_copy,tcp,sm,self" in env and "UCX_NET_DEVICES" not in env
    second = _play(tmp_path, inventory, "--tags", "ucx", *extra)
    assert second.rc == 0, second.summary()
    assert second.recap["vm"]["changed"] == 0 and second.changed_tasks() == [], second.changed_tasks()
    # and then the whole host layer in check mode: nothing left to change
    again = _play(tmp_path, inventory, "--check", "--skip-tags", "preflight", *_extra(tmp_path, facts))
    assert again.rc == 0 and again.recap["vm"]["changed"] == 0, (again.changed_tasks(), again.summary())


def test_the_same_driver_from_packages_is_managed_in_check_mode(tmp_path):
    """The contrast: dpkg holds the driver, so the role goes the packaged way (here in a container: it says what it
    would do on a host and simulates none of it)."""
    inventory, facts = _inventory(tmp_path)
    res = _play(tmp_path, inventory, "--check", "--skip-tags", "preflight,ucx", *_extra(tmp_path, facts, PACKAGED_580))
    assert res.rc == 0, res.summary()
    said = _messages(res, "nvidia_driver")
    assert "driver from packages (nvidia-driver-580-open 580.159.04-0ubuntu1" in said, said
    assert "is a container: on a host, the role would manage the packaged driver (pin 580.159.04)" in said, said


def test_a_driver_outside_packages_at_another_pin_stops_the_role(tmp_path):
    inventory, facts = _inventory(tmp_path)
    text = inventory.parent.joinpath("host_vars", "vm.yml").read_text().replace("580.159.04", "580.95.05")
    inventory.parent.joinpath("host_vars", "vm.yml").write_text(text)
    res = _play(tmp_path, inventory, "--check", "--tags", "nvidia_driver", *_extra(tmp_path, facts))
    assert res.rc != 0
    (failure,) = res.failures
    assert failure.task == "nvidia_driver : Stop at a driver installed outside packages that is not the pin", failure
    assert "it is 580.159.04, the pin is 580.95.05" in failure.msg and "nvidia-uninstall" in failure.msg


def test_judging_a_container_outside_check_mode_is_refused_at_role_entry(tmp_path):
    inventory, facts = _inventory(tmp_path)
    res = _play(tmp_path, inventory, "--tags", "nvidia_driver", *_extra(tmp_path, facts))
    assert res.rc != 0
    (failure,) = res.failures
    assert "nvidia_driver_judge_in_container=true is for check mode only" in failure.msg, failure
    ran = [t.name for t in res.tasks if t.ran and t.name.startswith("nvidia_driver : ")]
    assert all("Validat" in n or "Check" in n for n in ran), ran
    assert res.changed_tasks() == []


def test_check_mode_says_an_unreachable_cuda_repository_and_goes_on(tmp_path):
    """A host the role would install on, in check mode, with no NVIDIA repository reachable (the GPU hosts have no
    internet): the package tasks are skipped with the repository's address, nothing fails (get_url's HEAD would)."""
    from pdinfra.playbook import run_playbook

    book = tmp_path / "repo.yml"
    book.write_text(
        json.dumps(
            [
                {
                    "name": "setup-Debian.yml with the CUDA repository out of reach",
                    "hosts": "localhost",
                    "gather_facts": True,
                    "tasks": [
                        {"ansible.builtin.include_vars": str(REPO / "roles" / "nvidia_driver" / "vars" / "Debian.yml")},
                        {
                            "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "setup-Debian.yml"},
                            "vars": {
                                "nvidia_driver_cuda_repo_base_url": "http://127.0.0.1:9/cuda",
                                "__nvidia_driver_mode": "cuda_repo",
                                "nvidia_driver_block_unattended_upgrades": False,
                            },
                        },
                    ],
                }
            ]
        )
    )
    env = {"ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_HOME": str(tmp_path / "ansible-home")}
    args = ["--check", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"]
    res = run_playbook("localhost,", book, args, log=tmp_path / "repo.log", timeout_s=180, env=env)
    assert res.rc == 0, res.summary()
    said = " ".join(m for t in res.tasks for m in t.messages.values())
    assert "the CUDA repository http://127.0.0.1:9/cuda/debian12/x86_64 did not answer" in said, said
    assert "check mode cannot resolve driver packages; the package tasks are skipped" in said
    ran = [t.name for t in res.tasks if t.ran]
    assert not any("Install" in n or "Fetch" in n or "Hold" in n for n in ran), ran
