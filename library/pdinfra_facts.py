#!/usr/bin/python
"""Ansible module: gather pdinfra host facts (pdinfra/host/facts.py, shipped as module_utils/pdinfra_facts.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pdinfra_facts
short_description: Gather pdinfra host facts (kernel, NVIDIA driver, GPUs, NVLink, RDMA, UCX, serving instances)
description:
  - Runs C(pdinfra.host.facts.gather) on the managed host with its own python3 and returns the result as
    C(ansible_facts.pdinfra). Optional libraries (nvidia-ml-py, cuda-bindings, pyroute2) are used when present;
    their absence is recorded in the facts, never an error.
  - Read-only; supports check mode and never reports a change.
options:
  root:
    description: Host tree to read; C(/) is the managed host itself, anything else a recorded tree.
    type: str
    default: /
  nvml:
    description: Query NVML (GPU facts). Set to false to skip the GPU part.
    type: bool
    default: true
author: pdinfra
"""

EXAMPLES = r"""
- name: Gather pdinfra facts
  pdinfra_facts:

- name: Show the GPU count
  ansible.builtin.debug:
    msg: "{{ ansible_facts.pdinfra.gpus.count | default(0) }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts, under the key C(pdinfra); schema in docs/facts.md.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.pdinfra_facts import gather  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "str", "default": "/"},
            "nvml": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    facts = gather(module.params["root"], nvml=module.params["nvml"])
    module.exit_json(changed=False, ansible_facts={"pdinfra": facts})


if __name__ == "__main__":
    main()
