"""Last of the end-to-end modules (alphabetical order): the teardown leaves nothing behind."""

from __future__ import annotations

from e2e_helpers import BIN, E2E_MARKS, run

from pdinfra import testhosts

pytestmark = E2E_MARKS


def test_zz_destroy_leaves_nothing_behind(cluster):
    res = run([str(BIN / "pdinfra"), "down"], log="90-down")
    assert res.returncode == 0, res.stdout + res.stderr
    assert testhosts.leftovers(cluster["hosts"]) == []
