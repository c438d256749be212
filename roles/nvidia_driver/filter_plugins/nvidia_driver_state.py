"""The nvidia_driver role's judgment of the driver a host already has (role-local filter ``nvidia_driver_state``).

Pure functions (no Ansible imports needed), unit-tested on recorded facts in tests/unit/test_nvidia_driver_state.py.

Inputs, each read the way the validator reads it:

* ``driver``: the ``nvidia_driver`` section of the pdinfra facts (``/proc/driver/nvidia/version``: loaded, version,
  flavour ``open`` for "NVIDIA UNIX Open Kernel Module", else ``proprietary``), the same fact ``driver.open_module``
  and ``driver.version`` judge;
* ``dpkg_lines``: ``dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'``: which NVIDIA driver
  packages the package manager knows;
* ``smi_lines``: ``nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader``: the user-space
  driver and persistence mode per GPU (empty when nvidia-smi is absent or fails);
* ``pin``: ``nvidia_driver_version``; ``modules``: the facts' ``modules`` section (nouveau loaded or not).

States:

* ``absent``: no NVIDIA module loaded: the role installs the pinned packages (then a reboot loads them);
* ``packaged``: the package manager holds a driver: the role manages it (pin, hold, upgrade to the pin);
* ``unpackaged_compliant``: the open module is loaded at the pin (and nvidia-smi, where present, says the same),
  and no driver package is installed: a driver installed outside packages (the .run installer, a vendor or cloud
  image). The role leaves it alone: no install, no apt pin or hold, no nouveau blacklist or initramfs, no
  persistence daemon change, no reboot;
* ``unpackaged_mismatch``: a driver installed outside packages that is not the pin (another version, the
  proprietary flavour, or user space and kernel module apart): installing packages over it would mix two installs,
  so the role stops and says what to do.
"""

from __future__ import annotations

import re

try:  # pragma: no cover - exercised only inside Ansible
    from ansible.errors import AnsibleFilterError as _FilterError
except ImportError:  # pragma: no cover - plain unit tests without Ansible
    _FilterError = ValueError

# Packages that put an NVIDIA kernel driver on a Debian/Ubuntu host (the CUDA repository's and Ubuntu's names for the
# 535-580 branches, roles/nvidia_driver/vars/*.yml, and their meta packages). A user-space-only package
# (libnvidia-compute-*, nvidia-utils-*) does not make the kernel module the package manager's.
DRIVER_PACKAGE_RE = re.compile(
    r"^(nvidia-open|nvidia-open-\d+|nvidia-driver-\d+(-server)?(-open)?|nvidia-dkms-\d+(-server)?(-open)?"
    r"|nvidia-kernel-open-dkms|nvidia-kernel-dkms|nvidia-kernel-source-\d+(-server)?(-open)?"
    r"|nvidia-headless(-no-dkms)?-\d+(-server)?(-open)?|linux-modules-nvidia-\d+(-server)?(-open)?-.+"
    r"|cuda-drivers(-\d+)?)$"
)
STATES = ("absent", "packaged", "unpackaged_compliant", "unpackaged_mismatch")


def nvidia_driver_packages(dpkg_lines: list) -> list[dict]:
    """Installed NVIDIA driver packages from ``dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'``
    (status ``ii``/``hi``: installed; ``rc`` and the like are not)."""
    out = []
    for line in dpkg_lines or []:
        fields = str(line).rstrip("\n").split("\t")
        if len(fields) < 3:
            continue
        status, name, version = fields[0].strip(), fields[1].strip().split(":", 1)[0], fields[2].strip()
        if len(status) >= 2 and status[1] == "i" and DRIVER_PACKAGE_RE.match(name):
            out.append({"name": name, "version": version})
    return out


def parse_smi(smi_lines: list) -> tuple[list[str], list[str]]:
    """Driver versions and persistence modes (``Enabled``/``Disabled``) per GPU from nvidia-smi's CSV."""
    versions, modes = [], []
    for line in smi_lines or []:
        parts = [p.strip() for p in str(line).split(",")]
        if len(parts) >= 2 and re.match(r"^\d+\.\d+", parts[0]):
            versions.append(parts[0])
            modes.append(parts[1])
    return versions, modes


def nvidia_driver_state(driver: dict, dpkg_lines: list, smi_lines: list, pin: str, modules: dict | None = None) -> dict:
    """Judge the installed driver against the pin; see the module docstring for the states."""
    if not isinstance(driver, dict):
        raise _FilterError(f"nvidia_driver_state: the facts' nvidia_driver section must be a mapping, not {driver!r}")
    pin = str(pin)
    loaded = bool(driver.get("loaded"))
    version = str(driver.get("version") or "") if loaded else ""
    flavour = driver.get("flavour") if loaded else None
    packages = nvidia_driver_packages(dpkg_lines)
    userspace, modes = parse_smi(smi_lines)
    modules = modules or {}
    nouveau = bool((modules.get("loaded") or {}).get("nouveau")) if modules.get("available") else False
    persistence = "unknown" if not modes else ("on" if all(m == "Enabled" for m in modes) else "off")
    off = [str(i) for i, m in enumerate(modes) if m != "Enabled"]
    out = {
        "loaded": loaded, "version": version, "flavour": flavour, "pin": pin, "packages": packages,
        "userspace": sorted(set(userspace)), "persistence": persistence, "nouveau": nouveau,
        "reboot_needed": nouveau or not loaded or version != pin or flavour != "open",
    }  # fmt: skip
    where = f"module {version or 'not loaded'}" + (f" ({flavour})" if flavour else "")
    if packages:
        names = ", ".join(f"{p['name']} {p['version']}" for p in packages)
        return out | {
            "state": "packaged",
            "manage": True,
            "message": f"driver from packages ({names}); {where}, pinned {pin}: the role manages it",
        }
    if not loaded:
        return out | {
            "state": "absent",
            "manage": True,
            "message": f"no NVIDIA module loaded and no driver package: the role installs {pin}",
        }
    problems = []
    if flavour != "open":
        problems.append(f"the {flavour or 'unknown'} kernel module is loaded, not the open one")
    if version != pin:
        problems.append(f"it is {version or 'of unknown version'}, the pin is {pin}")
    skew = sorted({v for v in userspace if v != version})
    if skew:
        problems.append(
            f"nvidia-smi reports {', '.join(skew)} but the module is {version} (user space and kernel "
            "module apart: a half-finished upgrade)"
        )
    if nouveau:
        problems.append("nouveau is loaded too")
    if problems:
        if problems == ["nouveau is loaded too"]:
            return out | {
                "state": "unpackaged_mismatch",
                "manage": False,
                "message": f"a driver installed outside packages ({where}) is at the pin, but nouveau is "
                "loaded too: blacklist nouveau (`blacklist nouveau` in /etc/modprobe.d, then "
                "update-initramfs -u) and reboot; the role does not manage a driver it did not "
                "install.",
            }
        remedy = []
        if flavour == "open" and version != pin and not skew:
            branch = version.split(".", 1)[0]
            remedy.append(
                f"keep it: set nvidia_driver_version={version} (and nvidia_driver_branch={branch}; "
                "`pdinfra inventory init` writes both from the facts)"
            )
        remedy.append(
            "or remove it with the tool that installed it (`nvidia-uninstall` for the .run installer) and "
            f"re-run this role to install {pin} from packages"
        )
        if skew:
            remedy.insert(0, "finish the upgrade that left them apart (reboot into the new module)")
        return out | {
            "state": "unpackaged_mismatch",
            "manage": False,
            "message": f"a driver installed outside packages ({where}; no driver package in dpkg) does not "
            f"match: {'; '.join(problems)}. The role does not install packages over a driver it "
            f"did not install. {'; '.join(remedy)}.",
        }
    smi = f"nvidia-smi {userspace[0]}" if userspace else "nvidia-smi not available: user space not compared"
    if persistence == "on":
        pers = "persistence mode on"
    elif persistence == "off":
        pers = (
            f"persistence mode OFF on GPU {','.join(off)}: not changed here (the driver is not the package "
            "manager's, nor its nvidia-persistenced unit): run nvidia-persistenced --persistence-mode as its "
            "installer provides, or `nvidia-smi -pm 1`"
        )
    else:
        pers = "persistence mode unknown (nvidia-smi not available)"
    return out | {
        "state": "unpackaged_compliant",
        "manage": False,
        "reboot_needed": False,
        "message": f"open driver {version} installed outside packages (no driver package in dpkg), loaded "
        f"at the pin ({smi}; {pers}): left alone: nothing installed, pinned, held, blacklisted, "
        "restarted or rebooted",
    }


class FilterModule:
    def filters(self):
        return {"nvidia_driver_state": nvidia_driver_state}
