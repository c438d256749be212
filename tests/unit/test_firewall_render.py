"""The pd_firewall role's table and unit, rendered with Jinja alone from a resolved cluster (no Ansible, no nft), and
its lookup of the controller's addresses as pure functions.

What is checked: the PD ports admit the cluster's peers, the admin networks and the controller that runs the play
(pdinfra_firewall_admit_controller, on by default) and nobody else; the controller's address comes from the
controller's route towards the node and from SSH_CLIENT, once, never inside an admin network (nftables refuses
overlapping elements of an interval set); stopping the unit leaves the table.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import jinja2
import pytest
from test_cluster_resolve import CPU, GROUPS

from pdinfra.cluster import resolve as R

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "pd_firewall"
_spec = importlib.util.spec_from_file_location(
    "pd_firewall_controller", ROLE / "lookup_plugins" / "pd_firewall_controller.py"
)
lookup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lookup)


def _rules(**overrides) -> dict:
    hv = copy.deepcopy(CPU)
    for h in hv.values():
        h.update(overrides)
    res = R.resolve(hv, copy.deepcopy(GROUPS))
    assert res.ok, res.problems
    return res.cluster.to_dict()["hosts"][1]["firewall"]  # node2: instances, no router port


def _render(rules: dict, controller: list[str]) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROLE / "templates"), trim_blocks=True, undefined=jinja2.StrictUndefined
    )
    return env.get_template("firewall.nft.j2").render(
        ansible_managed="managed",
        pd_firewall_rules=rules,
        pd_firewall_action="drop",
        pd_firewall_controller_addresses=controller,
    )


def _admins(text: str) -> list[str]:
    if "set admins" not in text:
        return []
    block = text.split("set admins", 1)[1].split("}", 1)[0]
    return [a.strip() for a in block.split("elements = {", 1)[1].split(",")]


def test_the_controller_is_admitted_to_the_pd_ports_by_default():
    rules = _rules()
    assert rules["admit_controller"] is True and rules["admin_networks"] == []
    text = _render(rules, ["198.18.0.1"])
    assert _admins(text) == ["198.18.0.1"]
    assert "ip saddr @admins accept" in text and "# The controller: 198.18.0.1" in text
    # the rule that admits the admins comes before the one that drops everyone else
    assert text.index("ip saddr @admins accept") < text.index("counter drop")


def test_admit_controller_false_keeps_the_controller_out():
    rules = _rules(pdinfra_firewall_admit_controller=False)
    assert rules["admit_controller"] is False
    text = _render(rules, ["198.18.0.1"])
    assert "198.18.0.1," not in text and "198.18.0.1 " not in text  # (the peers are 198.18.0.11 and .12)
    assert "set admins" not in text and "@admins" not in text and "The controller" not in text
    rules = _rules(pdinfra_firewall_admit_controller=False, pdinfra_admin_networks=["203.0.113.0/24"])
    assert _admins(_render(rules, ["198.18.0.1"])) == ["203.0.113.0/24"]


def test_admin_networks_and_the_controller_share_the_admin_set():
    rules = _rules(pdinfra_admin_networks=["203.0.113.0/24"])
    assert _admins(_render(rules, ["198.18.0.1"])) == ["203.0.113.0/24", "198.18.0.1"]
    # a controller found nowhere (no route, no SSH_CLIENT) adds nothing, and says so in the file
    text = _render(_rules(), [])
    assert "set admins" not in text and "no address of its own" in text


def test_the_controllers_address_from_its_route_and_from_ssh_client():
    route = {"198.18.0.11": "198.18.0.1"}.get
    assert lookup.controller_addresses("198.18.0.11", "198.18.0.1 51234 22", route=route) == ["198.18.0.1"]
    # behind NAT the node sees another address than the controller's own: both are admitted
    assert lookup.controller_addresses("198.18.0.11", "203.0.113.7 51234 22", route=route) == [
        "198.18.0.1",
        "203.0.113.7",
    ]
    # no route from here (a laptop off the network): SSH_CLIENT alone; no SSH_CLIENT (facts gathered through sudo)
    assert lookup.controller_addresses("198.18.0.11", "203.0.113.7 1 22", route=lambda _: None) == ["203.0.113.7"]
    assert lookup.controller_addresses("198.18.0.11", "", route=route) == ["198.18.0.1"]
    assert lookup.controller_addresses("198.18.0.11", "", route=lambda _: None) == []


def test_the_controllers_addresses_leave_out_what_a_firewall_cannot_or_need_not_admit():
    route = {"198.18.0.11": "198.18.0.1"}.get
    # inside an admin network already: nftables would refuse the overlapping element
    assert lookup.controller_addresses("198.18.0.11", "198.18.0.1 1 22", ["198.18.0.0/24"], route=route) == []
    assert lookup.controller_addresses("198.18.0.11", "203.0.113.7 1 22", ["198.18.0.1/32"], route=route) == [
        "203.0.113.7"
    ]
    # IPv6 (the table's sets are IPv4), IPv4-mapped IPv6, loopback and garbage
    assert lookup.controller_addresses("198.18.0.11", "fe80::1 1 22", route=lambda _: None) == []
    assert lookup.controller_addresses("198.18.0.11", "::ffff:198.18.0.9 1 22", route=lambda _: None) == ["198.18.0.9"]
    assert lookup.controller_addresses("127.0.0.1", "127.0.0.1 1 22", route=lambda _: "127.0.0.1") == []
    assert lookup.controller_addresses("198.18.0.11", "not-an-address", route=lambda _: "0.0.0.0") == []


def test_the_route_lookup_sends_nothing_and_answers_for_a_reachable_address():
    assert lookup.source_address("127.0.0.1") == "127.0.0.1"
    assert lookup.source_address("not an address") is None


def test_ansible_runs_the_lookup_with_its_options():
    from ansible.plugins.loader import lookup_loader

    lookup_loader.add_directory(str(ROLE / "lookup_plugins"))
    plugin = lookup_loader.get("pd_firewall_controller")
    assert plugin is not None
    out = plugin.run(["127.0.0.1"], variables={}, ssh_client="203.0.113.7 51234 22", covered=["203.0.113.0/24"])
    assert out == []  # the route gives loopback, SSH_CLIENT is covered
    assert plugin.run(["127.0.0.1"], variables={}, ssh_client="198.51.100.4 1 22") == ["198.51.100.4"]


def test_stopping_the_unit_leaves_the_table_and_the_role_deletes_it_only_when_turned_off():
    unit = (ROLE / "templates" / "pdinfra-firewall.service.j2").read_text()
    assert "ExecStop=" not in unit and "ExecStart=/usr/sbin/nft -f /etc/pdinfra/firewall.nft" in unit
    tasks = (ROLE / "tasks" / "main.yml").read_text()
    removal = tasks.split("when: pd_firewall_rules is none", 1)[1]
    assert "[/usr/sbin/nft, delete, table, inet, pdinfra]" in removal


@pytest.mark.parametrize("value", ["yes", True])
def test_admit_controller_takes_a_bool(value):
    assert _rules(pdinfra_firewall_admit_controller=value)["admit_controller"] is True


RENDER_PLAY = """
- name: Resolve the cluster model as site.yml does
  ansible.builtin.import_playbook: {repo}/playbooks/cluster.yml

- name: Render every node's table with the role's own defaults and lookup
  hosts: pd_cluster
  connection: local
  gather_facts: true
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - name: Load the role (its defaults and lookup plugin); none of its tasks runs here
      ansible.builtin.import_role:
        name: pd_firewall
      when: false
    - name: The table
      ansible.builtin.template:
        src: {repo}/roles/pd_firewall/templates/firewall.nft.j2
        dest: "{out}/{{{{ inventory_hostname }}}}.nft"
        mode: "0644"
"""


@pytest.mark.slow
@pytest.mark.parametrize("admit", [True, False])
def test_ansible_renders_the_hgx_examples_table_with_the_controller_admitted(tmp_path, monkeypatch, admit):
    """Through Ansible (its templating, the role's defaults, the lookup, facts gathered on a local connection):
    the HGX example, which sets no admin network, admits the controller; with the switch off it does not."""
    from pdinfra.playbook import run_playbook

    monkeypatch.setenv("SSH_CLIENT", "203.0.113.9 40000 22")  # what sshd sets; the local facts read it from here
    play = tmp_path / "render.yml"
    play.write_text(RENDER_PLAY.format(repo=REPO, out=tmp_path))
    extra = ["-e", f"pdinfra_firewall_admit_controller={str(admit).lower()}"]
    res = run_playbook(
        REPO / "inventory" / "examples" / "hgx-h100" / "hosts.yml",
        play,
        extra,
        log=tmp_path / "render.log",
        timeout_s=300,
    )
    assert res.rc == 0, res.summary()
    for host in ("hgx-h100-01", "hgx-h100-02"):
        text = (tmp_path / f"{host}.nft").read_text()
        if admit:
            assert "203.0.113.9" in _admins(text) and "ip saddr @admins accept" in text, text
        else:
            assert "set admins" not in text and "203.0.113.9" not in text, text
