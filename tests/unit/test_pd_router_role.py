"""Static checks of the pd_router role's task order (what a `--tags router` run sees)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLE = Path(__file__).parents[2] / "roles" / "pd_router"


@pytest.mark.unit
def test_the_workers_default_has_the_vcpus_it_reads_on_a_router_only_run():
    """pd_router_gateway_workers' default reads ansible_facts.processor_vcpus; the router play gathers no facts, so
    with `--tags router` (no earlier play) the role reads them itself before it writes gateway.json. Without it the
    default fell to 1 worker and restarted a gateway that a full run had given more."""
    defaults = (ROLE / "defaults" / "main.yml").read_text()
    assert "processor_vcpus" in defaults
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    first_setup = next(i for i, t in enumerate(tasks) if "ansible.builtin.setup" in t)
    first_template = next(i for i, t in enumerate(tasks) if "ansible.builtin.template" in t)
    setup = tasks[first_setup]
    assert first_setup < first_template
    assert "hardware" in setup["ansible.builtin.setup"]["gather_subset"]
    assert setup["when"] == "ansible_facts.processor_vcpus is not defined"
