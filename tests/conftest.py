"""Shared by every test.

Tiers (markers given here by directory, ``slow`` by the tests themselves): ``unit`` (tests/unit, no root, no
network: ``./pd check``), ``slow`` (unit tests that run Ansible, a browser or a Debian tool that ``./pd test``
installs), ``e2e`` (tests/e2e, the local cluster, root). Every run ends with the time report of
tests/timebudget.py against tests/time-budget.toml.

The local inventory reads its API key from the test hosts' state (``pdinfra_api_key_file``), which ``pdinfra hosts
create`` writes; make sure it exists before any test resolves that inventory (under PDINFRA_STATE_DIR, which
``./pd check`` points into out/ so that no root is needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from timebudget import TimeReport

from pdinfra.testhosts import nspawn

TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimeReport(config), "pdinfra-time-report")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.resolve().relative_to(TESTS).parts[0]
        if tier == "unit":
            item.add_marker(pytest.mark.unit)
        elif tier == "e2e":
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True, scope="session")
def _local_api_key() -> None:
    nspawn.api_key_file()


@pytest.fixture(scope="session")
def installed_pdinfra(tmp_path_factory: pytest.TempPathFactory):
    """The wheel and the collection built from a clean clone of HEAD and installed outside the checkout, once per
    session (tests/install_pdinfra.py): the packaging test and the e2e converge through the collection share them."""
    import install_pdinfra  # tests/install_pdinfra.py

    return install_pdinfra.install(tmp_path_factory.mktemp("installed"))
