"""The controller's wheelhouse: every wheel a node needs, downloaded once and pushed.

GPU clusters are often air-gapped, and the local test hosts have no route out at all, so nodes
install with ``pip install --no-index --find-links``. Wheels are chosen for the *node's* Python
and glibc (read from the node's facts), not the controller's, with pip's ``--platform``
options, so a Python 3.12 controller can prepare a wheelhouse for Python 3.11 nodes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from pdinfra import paths
from pdinfra.cluster import connectors

MARKER = ".pdinfra-complete"
ROLE_DEFAULTS = paths.roles_dir() / "pd_runtime" / "defaults" / "main.yml"


class WheelhouseError(RuntimeError):
    pass


def role_packages(profile: str, connector: str) -> list[str]:
    """What the pd_runtime role installs with its defaults (its ``__pd_runtime_install``): the profile's serving
    packages, the tools, Mooncake's wheel, and LMCache with that connector. An inventory that overrides those role
    variables gets another wheelhouse at deploy time; this list is for preparing the default one ahead."""
    import yaml

    d = yaml.safe_load(ROLE_DEFAULTS.read_text())
    return [
        *d["pd_runtime_packages"][profile],
        *d["pd_runtime_tool_packages"],
        *d["pd_runtime_kv_store_packages"][profile],
        *(p for var in connectors.get(connector).packages for p in d[var]),
    ]


def platform_tags(glibc: str, arch: str) -> list[str]:
    """manylinux tags a node with this glibc accepts, newest first (PEP 600)."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    if major != 2:
        raise WheelhouseError(f"unexpected glibc version {glibc!r}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)]
    tags += [f"manylinux2014_{arch}", f"linux_{arch}"]
    return tags


def _key(packages: list[str], python_version: str, glibc: str, arch: str, extra: list[str]) -> str:
    blob = "|".join([*sorted(packages), python_version, glibc, arch, *extra, "v1"])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build(
    packages: list[str],
    python_version: str,
    glibc: str,
    arch: str = "x86_64",
    extra_index_urls: list[str] | None = None,
    cache: Path | None = None,
) -> tuple[Path, bool]:
    """Return (tarball, built now) for these packages and this node platform (cached)."""
    extra = list(extra_index_urls or [])
    env_extra = os.environ.get("PDINFRA_WHEELHOUSE_EXTRA_INDEX_URL")
    if env_extra:
        extra.append(env_extra)
    base = cache or paths.cache_dir()
    key = _key(packages, python_version, glibc, arch, extra)
    tarball = base / f"wheelhouse-{key}.tar"
    if tarball.exists():
        return tarball, False
    short = "".join(python_version.split(".")[:2])
    wh = base / f"wheelhouse-{key}"
    shutil.rmtree(wh, ignore_errors=True)
    wh.mkdir(parents=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
        "--only-binary=:all:", "--python-version", ".".join(python_version.split(".")[:2]),
        "--implementation", "cp", "--abi", f"cp{short}", "--abi", "abi3", "--abi", "none",
        "-d", str(wh),
    ]  # fmt: skip
    for tag in platform_tags(glibc, arch) + ["any"]:
        cmd += ["--platform", tag]
    for url in extra:
        cmd += ["--extra-index-url", url]
    cmd += packages
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        errors = "\n".join(line for line in res.stderr.splitlines() if not line.startswith("WARNING: Location"))
        raise WheelhouseError(
            f"pip download for Python {python_version} / glibc {glibc} failed:\n{errors[-3000:]}\n"
            "torch's CPU build comes from PyTorch's CPU wheel index on most machines: set "
            "PDINFRA_WHEELHOUSE_EXTRA_INDEX_URL (e.g. the /whl/cpu index) and re-run."
        )
    (wh / MARKER).write_text(" ".join(packages) + "\n")
    tmp = tarball.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tf:
        for whl in sorted(p for p in wh.iterdir() if p.name != MARKER):
            tf.add(whl, arcname=whl.name)
        tf.add(wh / MARKER, arcname=MARKER)  # last: its presence on a node means "fully unpacked"
    tmp.rename(tarball)
    shutil.rmtree(wh, ignore_errors=True)
    return tarball, True


def pdinfra_source(cache: Path | None = None) -> Path:
    """A tarball of the pdinfra package's source, named by its content (pushed to nodes): the checkout's or the
    installed package's, without the wheel's Ansible content (``_ansible``: the controller's)."""
    top = paths.PACKAGE.parent
    files = sorted(
        p
        for p in paths.PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc" and paths.BUNDLE not in p.parents
    )
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(top)).encode() + b"\0" + f.read_bytes())
    sid = h.hexdigest()[:12]
    out = (cache or paths.cache_dir()) / f"pdinfra-src-{sid}.tar"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tf:
            for f in files:
                info = tf.gettarinfo(str(f), arcname=str(f.relative_to(top)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
                with open(f, "rb") as fh:
                    tf.addfile(info, fh)
        tmp.rename(out)
    return out


def digest(tarball: Path) -> str:
    """Short content id of a wheelhouse or source tarball (the last part of its name: ``...-<id>.tar``)."""
    return tarball.stem.rsplit("-", 1)[1]
