"""The NVIDIA data-center driver releases pdinfra knows, per branch: what check-config compares
``nvidia_driver_version`` with. A version on its branch but not listed is not refused (a release newer than this list
is normal) but is marked unverified in check-config's output, never silently accepted; a version off its branch is a
problem (pdinfra.cluster.resolve_roles). Sources: NVIDIA's data-center driver release notes and the CUDA apt
repository's ``nvidia-open`` / ``nvidia-driver-<branch>-open`` packages, and the recorded hosts under
tests/fixtures/hosts (550.54.15, 580.159.04). Add a release here when you pin one.
"""

from __future__ import annotations

LISTED_ON = "2026-12-07"
KNOWN: dict[str, tuple[str, ...]] = {
    "535": ("535.54.03", "535.86.10", "535.104.05", "535.104.12", "535.129.03", "535.154.05", "535.161.07",
            "535.161.08", "535.183.01", "535.183.06", "535.216.01", "535.230.02", "535.247.01"),
    "550": ("550.54.14", "550.54.15", "550.90.07", "550.90.12", "550.127.05", "550.127.08", "550.144.03",
            "550.163.01"),
    "570": ("570.86.15", "570.124.06", "570.133.20", "570.148.08", "570.158.01", "570.172.08"),
    "580": ("580.65.06", "580.82.07", "580.95.05", "580.105.08", "580.159.04"),
}  # fmt: skip


def unlisted(version: str | None) -> str | None:
    """Why ``version`` is not verified (not a release pdinfra lists for its branch), or None when it is listed."""
    if not version:
        return None
    branch = version.split(".", 1)[0]
    known = KNOWN.get(branch)
    if known is None:
        return f"driver {version}: branch {branch} is not one pdinfra knows ({', '.join(KNOWN)})"
    if version in known:
        return None
    return (
        f"driver {version}: not among the {branch} releases pdinfra lists (pdinfra.cluster.drivers, as of "
        f"{LISTED_ON}; newest {known[-1]}): unverified; check that your repository has it "
        f"(apt-cache madison nvidia-driver-{branch}-open) before the converge"
    )
