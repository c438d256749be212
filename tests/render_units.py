"""Render the serving units of an inventory with Ansible's own template module on the controller (no host is
contacted): what the vllm_instance, pd_kv_store and pd_router roles would write. Shared by
tests/unit/test_serving_render.py and the e2e test that feeds the rendered units to the node's vLLM parser."""

from __future__ import annotations

from pathlib import Path

from pdinfra.playbook import run_playbook

REPO = Path(__file__).resolve().parents[1]
HGX = REPO / "inventory" / "examples" / "hgx-h100" / "hosts.yml"

PLAY = """
- name: Resolve the cluster model as site.yml does
  ansible.builtin.import_playbook: {repo}/playbooks/cluster.yml

- name: Render the vLLM units of every instance
  hosts: pd_cluster
  connection: local
  gather_facts: false
  vars_files: ["{repo}/roles/vllm_instance/defaults/main.yml", "{repo}/roles/vllm_instance/vars/main.yml",
               "{repo}/roles/pd_kv_store/defaults/main.yml",
               "{repo}/roles/pd_router/defaults/main.yml", "{repo}/roles/pd_router/vars/main.yml"]
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - name: Unit
      ansible.builtin.template:
        src: "{repo}/roles/vllm_instance/templates/pdinfra-vllm.service.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-{{{{ item.name }}}}.service"
        mode: "0644"
      loop: "{{{{ vllm_instance_list }}}}"
    - name: Environment
      ansible.builtin.template:
        src: "{repo}/roles/vllm_instance/templates/instance.env.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-{{{{ item.name }}}}.env"
        mode: "0600"
      loop: "{{{{ vllm_instance_list }}}}"
    - name: KV store client configuration (the reuse tier)
      ansible.builtin.template:
        src: "{repo}/roles/vllm_instance/templates/kv-store.json.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-{{{{ item.name }}}}.kv-store.json"
        mode: "0644"
      loop: "{{{{ vllm_instance_list | selectattr('kv_store') | list }}}}"
    - name: The store master's unit
      ansible.builtin.template:
        src: "{repo}/roles/pd_kv_store/templates/pdinfra-kv-store.service.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-kv-store.service"
        mode: "0644"
      when: pd_kv_store_here | bool
    - name: LMCache configuration (pdinfra_connector lmcache)
      ansible.builtin.template:
        src: "{repo}/roles/vllm_instance/templates/lmcache.yaml.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-{{{{ item.name }}}}.lmcache.yaml"
        mode: "0644"
      loop: "{{{{ vllm_instance_list if vllm_instance_connector == 'lmcache' else [] }}}}"
    - name: The LMCache proxy's configuration
      ansible.builtin.template:
        src: "{repo}/roles/pd_router/templates/lmcache-proxy.json.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-lmcache-proxy.json"
        mode: "0644"
      when: pdinfra_node.router is not none and pd_router_kv_connector == 'lmcache'
    - name: The router's unit
      ansible.builtin.template:
        src: "{repo}/roles/pd_router/templates/pdinfra-router.service.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-router.service"
        mode: "0644"
      when: pdinfra_node.router is not none
    - name: The gateway's configuration
      ansible.builtin.template:
        src: "{repo}/roles/pd_router/templates/gateway.json.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-gateway.json"
        mode: "0644"
      when: pdinfra_node.router is not none
    - name: The gateway's unit
      ansible.builtin.template:
        src: "{repo}/roles/pd_router/templates/pdinfra-gateway.service.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-gateway.service"
        mode: "0644"
      when: pdinfra_node.router is not none
    - name: The gateway's socket
      ansible.builtin.template:
        src: "{repo}/roles/pd_router/templates/pdinfra-gateway.socket.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}-gateway.socket"
        mode: "0644"
      when: pdinfra_node.router is not none
"""


def render(tmp_path_factory, inventory: Path, *extra: str) -> Path:
    out = tmp_path_factory.mktemp("units")
    play = out / "render.yml"
    play.write_text(PLAY.format(repo=REPO, out=out))
    args = [a for e in extra for a in ("-e", e)]
    res = run_playbook(inventory, play, args, log=tmp_path_factory.mktemp("ansible") / "render.log", timeout_s=300)
    assert res.rc == 0, res.summary()
    return out
