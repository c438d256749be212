"""`pdinfra advise --apply`'s planning half on copies of the local inventory: the change the advice carries, the
inventory edit (only the changed scalars, every comment kept), the diff, the check that the edited inventory
resolves before anything is written, and the refusals. The deploy half's play (apply.deploy: the serving play, the
retired unit) runs on the local cluster in tests/e2e/test_slo_loop.py, through the loop's change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdinfra.bench import advise, apply
from pdinfra.cluster import edit
from pdinfra.cluster.checker import ClusterError
from pdinfra.cluster.inventory import load_cluster

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "inventory" / "local"
BIN = Path(sys.executable).parent


@pytest.fixture
def inv(tmp_path) -> Path:
    dest = tmp_path / "inv"
    shutil.copytree(LOCAL, dest)
    return dest / "hosts.yml"


def advice_with(cluster, change: advise.Change | None, verdict: str = "rebalance") -> advise.Advice:
    return advise.Advice(
        cluster.layout, "1m", "http://127.0.0.1:9", "", verdict, "", [], [], {}, None, None, {}, change
    )


def test_ttft_over_the_slo_carries_a_retarget_of_the_decode_instance_beside_the_prefill_one(inv):
    cluster = load_cluster(inv)
    ch = advise.retarget(cluster, "decode", "prefill")
    # decode1 shares node1 with prefill0; node2 keeps its single role (decode)
    assert (ch.kind, ch.host, ch.index, ch.instance, ch.role, ch.name) == (
        "retarget",
        "node1",
        1,
        "decode1",
        "prefill",
        "prefill1",
    )
    assert "1P:2D -> 2P:1D" in ch.summary


def test_the_edit_changes_two_scalars_and_keeps_every_other_byte(inv):
    cluster = load_cluster(inv)
    node1 = inv.parent / "host_vars" / "node1.yml"
    before = node1.read_text()
    plan = apply.plan(inv, advice_with(cluster, advise.retarget(cluster, "decode", "prefill")))
    assert node1.read_text() == before  # planning writes nothing
    [e] = plan.edits
    assert e.path == node1
    diff = plan.diff(inv.parent)
    assert diff.startswith("--- a/host_vars/node1.yml\n+++ b/host_vars/node1.yml\n"), diff
    removed = [ln for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert removed == ["-  - name: decode1", "-    role: decode"], diff
    assert added == ["+  - name: prefill1", "+    role: prefill"], diff
    undone = e.after.replace("prefill1", "decode1").replace(
        "role: prefill\n    port: 8201", "role: decode\n    port: 8201"
    )
    assert undone == before
    # the edited inventory was resolved: 2 prefill, 1 decode, the ports kept
    assert sorted(i.name for i in plan.after.by_role("prefill")) == ["prefill0", "prefill1"]
    assert [i.name for i in plan.after.by_role("decode")] == ["decode0"]
    assert next(i for i in plan.after.instances if i.name == "prefill1").port == 8201
    edit.write(plan.edits)
    assert [i.name for i in load_cluster(inv).by_role("prefill")] == ["prefill0", "prefill1"]


def test_a_change_that_does_not_resolve_is_refused_before_anything_is_written(inv):
    """Turning the only prefill instance into a decode one leaves PD without prefill: the resolver's problem,
    naming pdinfra_instances, ends the plan; the inventory is untouched."""
    cluster = load_cluster(inv)
    node1 = inv.parent / "host_vars" / "node1.yml"
    before = node1.read_text()
    bad = advise.Change("retarget", "", host="node1", index=0, instance="prefill0", role="decode", name="decode9")
    with pytest.raises(ClusterError, match="pdinfra_instances.*no prefill instance"):
        apply.plan(inv, advice_with(cluster, bad))
    assert node1.read_text() == before


def test_layout_switch_is_added_to_group_vars_all_when_unset_and_replaced_where_set(inv):
    e = edit.set_cluster_var(inv, "pdinfra_layout", "pd", comment="set by pdinfra advise --apply")
    assert e.path == inv.parent / "group_vars" / "all" / "main.yml"
    assert e.after.endswith("# set by pdinfra advise --apply\npdinfra_layout: pd\n") and e.after.startswith(e.before)
    edit.write([e])
    e2 = edit.set_cluster_var(inv, "pdinfra_layout", "agg")
    assert e2.path == e.path and e2.after == e.after.replace("pdinfra_layout: pd", "pdinfra_layout: agg")
    assert load_cluster(inv).layout == "pd"  # e2 not written


def test_a_variable_set_in_two_places_is_not_edited(inv):
    hosts = inv.read_text().replace(
        "      pdinfra_testhost: true\n    node2:",
        "      pdinfra_testhost: true\n      pdinfra_instances: []\n    node2:",
        1,
    )
    inv.write_text(hosts)
    with pytest.raises(
        edit.EditError,
        match=r"pdinfra_instances for host node1 is set in 2 places .*node1\.yml.*"
        r"hosts\.yml \(all\.hosts\.node1\)",
    ):
        edit.retarget_instance(inv, "node1", 1, "prefill", "prefill1")


def test_a_jinja_value_and_a_group_wide_list_are_not_edited(inv):
    gv = next((inv.parent / "group_vars" / "all").glob("*.yml"))
    gv.write_text(gv.read_text() + "pdinfra_layout: \"{{ lookup('env', 'LAYOUT') }}\"\n")
    with pytest.raises(edit.EditError, match="pdinfra_layout is a Jinja expression"):
        edit.set_cluster_var(inv, "pdinfra_layout", "pd")
    (inv.parent / "host_vars" / "node2.yml").unlink()
    with pytest.raises(edit.EditError, match="pdinfra_instances for host node2 is not set in host_vars"):
        edit.retarget_instance(inv, "node2", 0, "prefill", "prefill1")


def test_write_keeps_the_file_mode(inv):
    e = edit.retarget_instance(inv, "node1", 1, "prefill", "prefill1")
    e.path.chmod(0o600)
    edit.write([e])
    assert e.path.stat().st_mode & 0o777 == 0o600 and "prefill1" in e.path.read_text()


def test_write_refuses_a_file_changed_since_the_plan(inv):
    e = edit.retarget_instance(inv, "node1", 1, "prefill", "prefill1")
    e.path.write_text(e.before + "# someone else\n")
    with pytest.raises(edit.EditError, match="changed since the edit was planned"):
        edit.write([e])
    assert e.path.read_text().endswith("# someone else\n")


def test_advice_without_a_change_has_nothing_to_apply(inv):
    with pytest.raises(apply.ApplyError, match="add-capacity.*add a prefill and a decode instance"):
        apply.plan(
            inv,
            advise.Advice(
                "pd", "1m", "", "", "add-capacity", "", ["add a prefill and a decode instance"], [], {}, None, None, {}
            ),
        )


def test_cli_apply_without_a_terminal_needs_yes():
    res = subprocess.run(
        [str(BIN / "pdinfra"), "advise", "--apply", "--prometheus", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2 and "without a terminal give --yes" in res.stderr, res.stderr


def test_window_seconds():
    assert apply.window_seconds("90s") == 90 and apply.window_seconds("2m") == 120
    with pytest.raises(apply.ApplyError, match="'ten'"):
        apply.window_seconds("ten")
