"""Where pdinfra keeps its caches and state on the controller, and where its Ansible content is.

Two ways to run: from a checkout (``site.yml``, ``playbooks/``, ``roles/`` beside the package: ``./pd up``,
``ansible-playbook site.yml``), or installed from the wheel, whose package data holds the Ansible collection
``pdinfra.pd`` and an ``ansible.cfg`` that finds it (``pdinfra/_ansible``, built by :mod:`pdinfra.collection`).
:data:`REPO` is the directory Ansible runs from in either case.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLE = PACKAGE / "_ansible"  # the wheel's: ansible.cfg and collections/ansible_collections/pdinfra/pd
COLLECTION = "pdinfra.pd"


def _checkout() -> Path | None:
    root = PACKAGE.parent
    return root if (root / "site.yml").is_file() and (root / "roles").is_dir() else None


CHECKOUT = _checkout()
REPO = CHECKOUT or BUNDLE


def roles_dir() -> Path:
    """The roles: the checkout's, or the installed collection's."""
    if CHECKOUT:
        return CHECKOUT / "roles"
    return BUNDLE / "collections" / "ansible_collections" / COLLECTION.replace(".", "/") / "roles"


def playbook(name: str | Path) -> str:
    """A playbook as ansible-playbook takes it: an absolute path stays; ``site.yml`` or ``playbooks/host.yml`` is the
    checkout's file, or the collection's playbook (``pdinfra.pd.site``) when there is no checkout."""
    path = Path(name)
    if path.is_absolute():
        return str(path)
    if CHECKOUT:
        return str(CHECKOUT / path)
    return f"{COLLECTION}.{path.stem}"


def plugin(name: str) -> str:
    """A module or action plugin as Ansible names it here: ``pdinfra_cluster`` in a checkout, its FQCN installed."""
    return name if CHECKOUT else f"{COLLECTION}.{name}"


def out_dir() -> Path:
    """Where runs leave their logs: the checkout's out/, else out/ in the working directory."""
    return (CHECKOUT or Path.cwd()) / "out"


def cache_dir() -> Path:
    """Downloads and builds that can be reused between runs (wheelhouse, base root filesystem)."""
    d = Path(os.environ.get("PDINFRA_CACHE_DIR", Path.home() / ".cache" / "pdinfra"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def state_dir() -> Path:
    """Live state of the local test hosts (overlay roots, pid files, SSH key)."""
    d = Path(os.environ.get("PDINFRA_STATE_DIR", "/var/lib/pdinfra"))
    d.mkdir(parents=True, exist_ok=True)
    return d
