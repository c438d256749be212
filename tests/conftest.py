"""Shared by every test: the local inventory reads its API key from the test hosts' state
(``pdinfra_api_key_file``), which ``pdinfra hosts create`` writes; make sure it exists before any test resolves
that inventory."""

from __future__ import annotations

import pytest

from pdinfra.testhosts import nspawn


@pytest.fixture(autouse=True, scope="session")
def _local_api_key() -> None:
    nspawn.api_key_file()
