"""pdinfra installed the ecosystem's way (issue 42; docs/collection.md): one version everywhere, the changelog from
fragments, and (slow) the wheel and the collection built from a clean clone and used from outside the checkout."""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from pdinfra import __version__, collection

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_changelog_has_the_current_version():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "<!-- towncrier release notes start -->" in text
    assert re.search(rf"^## {re.escape(__version__)} \(\d{{4}}-\d{{2}}-\d{{2}}\)$", text, re.M), __version__


def test_the_fragments_build_into_a_changelog():
    """towncrier reads every fragment in changes/ (a misnamed one is an error) and drafts the next section."""
    res = subprocess.run(
        [str(BIN / "towncrier"), "build", "--draft", "--version", "99.0.0"], cwd=REPO, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    fragments = [p for p in (REPO / "changes").iterdir() if p.name != "README.md"]
    assert all(re.fullmatch(r"\d+\.(feature|bugfix|removal|doc|misc)\.md", p.name) for p in fragments), fragments


def test_the_collection_carries_the_version_and_every_reference_by_fqcn(tmp_path):
    root = collection.assemble(REPO, tmp_path)
    galaxy = yaml.safe_load((root / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"], galaxy["version"]) == ("pdinfra", "pd", __version__)
    assert yaml.safe_load((root / "meta" / "runtime.yml").read_text())["requires_ansible"]
    site = (root / "playbooks" / "site.yml").read_text()
    assert "import_playbook: host.yml" in site and "playbooks/" not in site
    assert "- role: pdinfra.pd.ucx" in (root / "playbooks" / "host.yml").read_text()
    assert "pdinfra.pd.pdinfra_cluster: {}" in (root / "playbooks" / "cluster.yml").read_text()
    assert "| pdinfra.pd.pdinfra_kv(" in (root / "roles" / "vllm_instance" / "vars" / "main.yml").read_text()
    assert not list(root.glob("roles/*/*_plugins")), "collection roles cannot embed plugins"
    assert not [p for p in root.rglob("*") if p.is_symlink()]
    facts = (root / "plugins" / "module_utils" / "pdinfra_facts_gpu.py").read_text()
    assert "ansible_collections.pdinfra.pd.plugins.module_utils.pdinfra_facts_base" in facts
    assert (root / "plugins" / "lookup" / "pd_firewall_controller.py").is_file()
    assert "query('pdinfra.pd.pd_firewall_controller'" in (root / "roles/pd_firewall/defaults/main.yml").read_text()


def test_the_fqcn_rewrite_leaves_variables_of_the_same_name():
    text = "- name: t\n  pdinfra_cluster: {}\n- name: u\n  ansible.builtin.set_fact:\n    pdinfra_cluster: x\n"
    out = collection._task_keys(text, collection.MODULES)
    assert "  pdinfra.pd.pdinfra_cluster: {}" in out and "    pdinfra_cluster: x" in out


# ----------------------------------------------------------------------------------------- installed, outside
def _user_playbook() -> str:
    """The playbook of docs/collection.md, as a user copies it."""
    text = (REPO / "docs" / "collection.md").read_text(encoding="utf-8")
    section = text.split("## A team's playbook", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


def _stub_collection(collections: Path) -> None:
    """The user's own collection that docs/collection.md's playbook names beside pdinfra's (ourorg.base)."""
    base = collections / "ansible_collections" / "ourorg" / "base"
    for role in ("users", "bios_settings"):
        (base / "roles" / role / "tasks").mkdir(parents=True, exist_ok=True)
        (base / "roles" / role / "tasks" / "main.yml").write_text(
            f"---\n- name: {role}\n  ansible.builtin.debug:\n    msg: {role}\n"
        )
    (base / "galaxy.yml").write_text(
        "namespace: ourorg\nname: base\nversion: 1.0.0\nauthors: [us]\nreadme: README.md\n"
    )


@pytest.mark.slow
def test_the_wheel_runs_from_outside_the_checkout(installed_pdinfra):
    """Installed from the wheel: version, check-config on an example inventory, a missing extra named in one line."""
    inst = installed_pdinfra
    with zipfile.ZipFile(inst.wheel) as whl:
        names = set(whl.namelist())
    assert "pdinfra/_ansible/ansible.cfg" in names
    assert "pdinfra/_ansible/collections/ansible_collections/pdinfra/pd/playbooks/site.yml" in names
    assert (inst.wheel.parent / f"pdinfra-{__version__}.tar.gz").is_file()  # the sdist the wheel was built from
    res = inst.run(inst.pdinfra, "version")
    assert res.returncode == 0 and res.stdout.strip() == __version__ and __version__ in inst.wheel.name
    where = inst.run(str(inst.venv / "bin" / "python"), "-c", "import pdinfra.paths as p; print(p.CHECKOUT, p.REPO)")
    assert where.stdout.split()[0] == "None" and str(inst.venv) in where.stdout, where.stdout
    example = inst.clone / "inventory" / "examples" / "hgx-h100" / "hosts.yml"
    res = inst.run(inst.pdinfra, "check-config", "-i", str(example))
    assert res.returncode == 0 and "2 PD hosts" in res.stdout + res.stderr, res.stdout + res.stderr
    # a node's validate (a recorded healthy HGX host replayed, and one with an old kernel), and the planner
    hosts = inst.clone / "tests" / "fixtures" / "hosts"
    res = inst.run(inst.pdinfra, "validate", "--root", str(hosts / "hgx-h100-8gpu-8roce"))
    assert res.returncode == 0 and "41 pass, 0 warn, 0 fail" in res.stdout, res.stdout[-2000:] + res.stderr
    res = inst.run(inst.pdinfra, "validate", "--root", str(hosts / "bad-old-kernel"))
    assert res.returncode == 1 and "os.kernel_version" in res.stdout, res.stdout[-2000:]
    profile = inst.clone / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"
    load = ["--rate", "0.5", "--isl", "1536", "--osl", "64", "--cores-per-host", "2"]
    res = inst.run(inst.pdinfra, "plan", "-p", str(profile), *load, "--slo", "{ttft_ms: 5000, itl_p99_ms: 200}")
    assert res.returncode == 0 and "chosen:" in res.stdout + res.stderr, res.stdout + res.stderr
    # a mistake in the inventory: named before any host is touched
    bad = inst.outside / "bad"
    subprocess.run(["cp", "-r", str(example.parent), str(bad)], check=True)
    vars_file = bad / "group_vars" / "all.yml"
    vars_file.write_text(vars_file.read_text() + "\npdinfra_connector: tcpstore\n")
    res = inst.run(inst.pdinfra, "check-config", "-i", str(bad / "hosts.yml"))
    assert res.returncode != 0 and "pdinfra_connector" in res.stdout + res.stderr, res.stdout + res.stderr
    # without the controller extra (ansible_runner made unimportable): one line, exit 2, no traceback
    block = inst.outside / "no-controller-extra" / "ansible_runner"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ansible_runner'\", name='ansible_runner')\n"
    )
    res = inst.run(inst.pdinfra, "deploy", "--check", "-i", str(example), PYTHONPATH=str(block.parent))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "pip install 'pdinfra[controller]'" in res.stderr


@pytest.mark.slow
def test_a_new_users_first_day_from_the_wheel(installed_pdinfra):
    """Issue 47, as docs/collection.md and README write it, from a directory that is no checkout with relative
    paths: check-config with -i as a file and as a directory, the key kept where Ansible never parses it and in no
    output; plan refuses a profile of other hardware; a plain ansible-playbook finds the wheel's collection through
    `pdinfra collection path`; `pdinfra collection build` works from the wheel."""
    inst = installed_pdinfra
    site = inst.outside / "site"
    subprocess.run(["cp", "-r", str(inst.clone / "inventory" / "examples" / "hgx-h100"), str(site)], check=True)
    outputs = []
    for form in ("site/hosts.yml", "site/", "site"):
        res = inst.run(inst.pdinfra, "check-config", "-i", form)
        outputs.append(res.stdout + res.stderr)
        assert res.returncode == 0 and "2 PD hosts" in outputs[-1], (form, outputs[-1][-2000:])
    key = (site / ".credentials" / "api.key").read_text().strip()
    assert len(key) == 40 and not (site / "credentials").exists()
    listing = inst.run(str(BIN / "ansible-inventory"), "-i", "site/", "--list")
    assert listing.returncode == 0 and "hgx-h100-01" in listing.stdout
    assert all(key not in out for out in [*outputs, listing.stdout, listing.stderr])
    profile = inst.clone / "tests" / "fixtures" / "profiles" / "local-cpu-tiny-1536.json"
    load = ["--rate", "1", "--isl", "512", "--osl", "64"]
    res = inst.run(inst.pdinfra, "plan", "-i", "site/hosts.yml", "-p", str(profile), *load)
    out = res.stdout + res.stderr
    assert res.returncode == 2 and "measured on CPU instances" in out and "GPU" in out, out[-2000:]
    where = inst.run(inst.pdinfra, "collection", "path")
    assert where.returncode == 0 and (Path(where.stdout.strip()) / "ansible_collections/pdinfra/pd").is_dir()
    env = {"ANSIBLE_COLLECTIONS_PATH": where.stdout.strip(), "ANSIBLE_CONFIG": ""}
    res = inst.run(str(BIN / "ansible-playbook"), "--syntax-check", "-i", "site/hosts.yml", "pdinfra.pd.site", **env)
    assert res.returncode == 0, res.stdout + res.stderr
    res = inst.run(inst.pdinfra, "collection", "build", "built")
    assert res.returncode == 0 and (inst.outside / "built" / f"pdinfra-pd-{__version__}.tar.gz").is_file(), res.stderr


@pytest.mark.slow
def test_a_users_playbook_uses_the_roles_by_fqcn(installed_pdinfra):
    """docs/collection.md's playbook, beside the user's own collection, syntax-checks against the installed
    collection from a directory that is no checkout; ansible-lint's production profile passes on the collection."""
    inst = installed_pdinfra
    _stub_collection(inst.collections)
    user = inst.outside / "ours"
    user.mkdir(exist_ok=True)
    (user / "site.yml").write_text(_user_playbook())
    example = inst.clone / "inventory" / "examples" / "hgx-h100" / "hosts.yml"
    book = str(user / "site.yml")
    res = inst.run(
        str(BIN / "ansible-playbook"),
        "--syntax-check",
        "-i",
        str(example),
        book,
        ANSIBLE_COLLECTIONS_PATH=str(inst.collections),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    installed = inst.collections / "ansible_collections" / "pdinfra" / "pd"
    lint = subprocess.run(
        [str(BIN / "ansible-lint"), "--offline", "--profile", "production", "."],
        cwd=installed,
        env=inst.env(ANSIBLE_COLLECTIONS_PATH=str(inst.collections)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert lint.returncode == 0, (lint.stdout + lint.stderr)[-4000:]
    with tarfile.open(inst.tarball) as tf:
        assert "CHANGELOG.md" in tf.getnames() and "galaxy.yml" not in tf.getnames()  # MANIFEST.json instead
