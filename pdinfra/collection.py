"""pdinfra's Ansible content as a collection, ``pdinfra.pd``: built from the checkout, installable by name.

The checkout keeps its plain Ansible layout (``site.yml``, ``playbooks/``, ``roles/``, ``action_plugins/``,
``filter_plugins/``, ``library/``, ``module_utils/``, ``strategy_plugins/``); :func:`assemble` writes the same content
in Galaxy's layout, where every reference is by FQCN:

- the roles, with their templates' links resolved and their role-local filters and lookups moved to ``plugins/``;
- ``plugins/action`` (``pdinfra_cluster``, ``pdinfra_host_checks``), ``plugins/modules`` (``pdinfra_facts``),
  ``plugins/module_utils`` (the facts code, ``pdinfra/host/facts*.py``, importing each other by the collection's
  path), ``plugins/filter``, ``plugins/strategy`` (``pdinfra_linear``);
- the playbooks as collection playbooks: ``ansible-playbook pdinfra.pd.site`` (``host``, ``serving``, ...);
- tasks call ``pdinfra.pd.<module>``, templates apply ``pdinfra.pd.<filter>``, plays name ``pdinfra.pd.<role>``.

``python -m pdinfra.collection build DIR`` writes the tarball (``ansible-galaxy collection build``) into DIR; the
wheel carries the assembled collection (``pdinfra/_ansible``) and runs its playbooks when there is no checkout
(:mod:`pdinfra.paths`). The action plugins import pdinfra on the controller: install the wheel there
(``pip install 'pdinfra[controller]'``). Base layer: files only.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pdinfra import __version__
from pdinfra.paths import COLLECTION

FQCN = COLLECTION  # pdinfra.pd
NAMESPACE, NAME = FQCN.split(".")
MODULES = ("pdinfra_cluster", "pdinfra_host_checks", "pdinfra_facts")  # action plugins and the module
FACT_PARTS = ("facts", "facts_base", "facts_gpu", "facts_net")
REQUIRES_ANSIBLE = ">=2.18.0"

GALAXY = """\
namespace: {namespace}
name: {name}
version: {version}
readme: README.md
authors:
  - pdinfra
description: >-
  Bring-up of bare-metal GPU servers for prefill/decode-disaggregated LLM serving: the NVIDIA open driver,
  RoCEv2 NICs and UCX by GPU-NIC affinity, vLLM prefill/decode instances joined by a KV connector, a PD router
  and gateway, a KV reuse tier and monitoring, with host checks and a smoke that proves the KV cache moved.
license:
  - Apache-2.0
tags:
  - gpu
  - nvidia
  - rdma
  - vllm
  - inference
  - infrastructure
dependencies: {{}}
repository: https://github.com/pdinfra/pdinfra
documentation: https://github.com/pdinfra/pdinfra/tree/main/docs
issues: https://github.com/pdinfra/pdinfra/issues
build_ignore:
  - "*.tar.gz"
"""

README = """\
# {fqcn}

pdinfra's roles, plugins and playbooks as an Ansible collection (version {version}). Built from the pdinfra
checkout by `python -m pdinfra.collection build`; the pdinfra Python package must be installed on the controller
(`pip install 'pdinfra[controller]'`): the action plugins resolve and check the cluster description with it.

- Playbooks: `ansible-playbook -i INVENTORY {fqcn}.site` (also `{fqcn}.host`, `{fqcn}.serving`,
  `{fqcn}.monitoring`, `{fqcn}.smoke`, `{fqcn}.preflight`).
- Roles: {roles}.
- Plugins: modules/actions `{modules}`; filters `{filters}`; strategy `{fqcn}.pdinfra_linear`.

Variables: docs/variables.md of the pdinfra repository; a playbook that uses the roles beside its own:
docs/collection.md.
"""

RUNTIME = f"""\
---
requires_ansible: "{REQUIRES_ANSIBLE}"
"""


def _load_filters(path: Path) -> list[str]:
    """The filter names a filter plugin file defines (its FilterModule)."""
    spec = importlib.util.spec_from_file_location(f"_pdinfra_filters_{path.stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return sorted(mod.FilterModule().filters())


def filter_files(project: Path) -> list[Path]:
    return sorted([*project.glob("filter_plugins/*.py"), *project.glob("roles/*/filter_plugins/*.py")])


def _task_keys(text: str, names: tuple[str, ...]) -> str:
    """``pdinfra_cluster:`` as a task's module key (two columns right of its ``- name:``) -> the FQCN; the same word
    elsewhere (a variable of set_fact, deeper) stays."""
    out, task_col = [], None
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(\s*)- name:", line)
        if m:
            task_col = len(m.group(1)) + 2
        k = re.match(rf"^(\s*)({'|'.join(names)}):", line)
        if k and task_col is not None and len(k.group(1)) == task_col:
            line = f"{k.group(1)}{FQCN}.{line[len(k.group(1)) :]}"
        out.append(line)
    return "".join(out)


def _filters_fqcn(text: str, filters: list[str]) -> str:
    alt = "|".join(sorted(filters, key=len, reverse=True))
    pattern = rf"\|\s*({alt})\b"
    return re.sub(pattern, lambda m: f"| {FQCN}.{m.group(1)}", text)


def _lookups_fqcn(text: str, lookups: list[str]) -> str:
    if not lookups:
        return text
    alt = "|".join(lookups)
    return re.sub(rf"\b(query|lookup)\((['\"])({alt})\2", rf"\1(\2{FQCN}.\3\2", text)


def _roles_fqcn(text: str, roles: list[str]) -> str:
    alt = "|".join(roles)
    text = re.sub(rf"^(\s*- role: )({alt})[ \t]*$", rf"\g<1>{FQCN}.\2", text, flags=re.M)
    return re.sub(rf"^(\s*name: )({alt})[ \t]*$", rf"\g<1>{FQCN}.\2", text, flags=re.M)


def _module_utils(text: str) -> str:
    """The facts code's imports of its parts, by the collection's path."""
    return text.replace(
        "ansible.module_utils.pdinfra_facts",
        f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils.pdinfra_facts",
    )


def assemble(project: Path, dest: Path) -> Path:
    """Write the collection ``pdinfra.pd`` from ``project`` (a checkout) under ``dest/ansible_collections``; returns
    the collection's directory. ``dest`` is replaced."""
    project, dest = project.resolve(), dest.resolve()
    root = dest / "ansible_collections" / NAMESPACE / NAME
    if root.exists():
        shutil.rmtree(root)
    roles = sorted(p.name for p in (project / "roles").iterdir() if (p / "tasks").is_dir())
    filters = [name for f in filter_files(project) for name in _load_filters(f)]
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "filter_plugins", "lookup_plugins")
    lookups = sorted(p.stem for p in project.glob("roles/*/lookup_plugins/*.py"))
    for role in roles:
        shutil.copytree(project / "roles" / role, root / "roles" / role, symlinks=False, ignore=ignore)
    plugins = root / "plugins"
    for sub, files in (
        ("action", sorted((project / "action_plugins").glob("*.py"))),
        ("filter", filter_files(project)),
        ("lookup", sorted(project.glob("roles/*/lookup_plugins/*.py"))),
        ("strategy", sorted((project / "strategy_plugins").glob("*.py"))),
        ("modules", sorted((project / "library").glob("*.py"))),
    ):
        (plugins / sub).mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, plugins / sub / f.name)
    (plugins / "module_utils").mkdir(parents=True)
    for part in FACT_PARTS:
        shutil.copyfile(project / "pdinfra" / "host" / f"{part}.py", plugins / "module_utils" / f"pdinfra_{part}.py")
    (root / "playbooks").mkdir()
    shutil.copyfile(project / "site.yml", root / "playbooks" / "site.yml")
    for book in sorted((project / "playbooks").glob("*.yml")):
        shutil.copyfile(book, root / "playbooks" / book.name)
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = text
        if path.suffix in (".yml", ".yaml", ".j2"):
            new = _lookups_fqcn(_filters_fqcn(_task_keys(new, MODULES), filters), lookups)
            if path.parent.name == "playbooks":
                new = _roles_fqcn(new.replace("import_playbook: playbooks/", "import_playbook: "), roles)
        elif path.suffix == ".py":
            new = _module_utils(new)
        if new != text:
            path.write_text(new, encoding="utf-8")
    (root / "meta").mkdir()
    (root / "meta" / "runtime.yml").write_text(RUNTIME, encoding="utf-8")
    (root / "galaxy.yml").write_text(GALAXY.format(namespace=NAMESPACE, name=NAME, version=__version__))
    (root / "README.md").write_text(
        README.format(
            fqcn=FQCN,
            version=__version__,
            roles=", ".join(f"`{FQCN}.{r}`" for r in roles),
            modules=", ".join(f"{FQCN}.{m}" for m in MODULES),
            filters=", ".join(f"{FQCN}.{f}" for f in filters),
        )
    )
    changelog = project / "CHANGELOG.md"
    if changelog.exists():
        shutil.copyfile(changelog, root / "CHANGELOG.md")
    return root


def bundled_cfg(project: Path) -> str:
    """The checkout's ansible.cfg for the wheel: the collection in place of the checkout's directories."""
    drop = (
        "roles_path",
        "library",
        "module_utils",
        "filter_plugins",
        "action_plugins",
        "strategy_plugins",
        "inventory",
    )
    out = []
    for line in (project / "ansible.cfg").read_text(encoding="utf-8").splitlines():
        key = line.split("=", 1)[0].strip()
        if key in drop:
            continue
        if key == "strategy":
            line = f"strategy = {FQCN}.pdinfra_linear"
        out.append(line)
        if line.strip() == "[defaults]":
            out.append("# pdinfra's wheel: its Ansible content is the collection pdinfra.pd beside this file")
            out.append("collections_path = collections:~/.ansible/collections:/usr/share/ansible/collections")
    return "\n".join(out) + "\n"


def bundled_collection() -> Path:
    """The collection inside the installed wheel (``pdinfra/_ansible/collections/ansible_collections/pdinfra/pd``)."""
    from pdinfra import paths

    return paths.BUNDLE / "collections" / "ansible_collections" / NAMESPACE / NAME


def collections_path() -> Path:
    """What ``ANSIBLE_COLLECTIONS_PATH`` needs for a plain ``ansible-playbook pdinfra.pd.site`` to find the wheel's
    collection (``pdinfra collection path`` prints it)."""
    from pdinfra import paths

    return paths.BUNDLE / "collections"


def bundle(project: Path, dest: Path) -> Path:
    """What the wheel carries as ``pdinfra/_ansible``: an ansible.cfg and the assembled collection."""
    assemble(project, dest / "collections")
    (dest / "ansible.cfg").write_text(bundled_cfg(project), encoding="utf-8")
    return dest


def is_checkout(project: Path) -> bool:
    return (project / "site.yml").is_file() and (project / "roles").is_dir()


def build(project: Path, out: Path, work: Path) -> Path:
    """The collection's tarball (``pdinfra-pd-<version>.tar.gz``) in ``out``, assembled under ``work`` from a checkout;
    installed from the wheel (no checkout), from the collection the wheel bundles."""
    if is_checkout(project):
        root = assemble(project, work)
    else:
        root = bundled_collection()
        if not (root / "galaxy.yml").is_file():
            raise RuntimeError(f"{project} is no checkout and this pdinfra bundles no collection ({root})")
    out.mkdir(parents=True, exist_ok=True)
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    cmd = [str(galaxy) if galaxy.exists() else "ansible-galaxy", "collection", "build", "--force", "--output-path"]
    res = subprocess.run([*cmd, str(out), str(root)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ansible-galaxy collection build failed: {res.stdout}{res.stderr}")
    return out / f"{NAMESPACE}-{NAME}-{__version__}.tar.gz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdinfra.collection", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the collection's tarball into OUT")
    b.add_argument("out", type=Path)
    b.add_argument("--project", type=Path, default=Path(__file__).resolve().parent.parent)
    a = sub.add_parser("assemble", help="write the collection's tree under DEST/ansible_collections")
    a.add_argument("dest", type=Path)
    a.add_argument("--project", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    if args.cmd == "assemble" and not is_checkout(args.project):
        why = "use build, which packs the collection this wheel bundles"
        parser.error(f"assemble needs a checkout (--project); {args.project} is none: {why}")
    if args.cmd == "assemble":
        print(assemble(args.project, args.dest))
        return 0
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pdinfra-collection-") as work:
        print(build(args.project, args.out, Path(work)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
