"""GPU <-> NIC PCIe affinity helpers for the ``ucx`` role.

Pure functions (no Ansible imports needed) so they can be unit-tested directly; Ansible
loads them as role-local filters through :class:`FilterModule`.

Data model (from inventory or from :func:`ucx_parse_topology` on sysfs output)::

    gpus: [{index: 0, pci: "0000:18:00.0", numa_node: 0,
            pcie_switch: "sw0",                       # optional, inventory-friendly
            pcie_path: ["pci0000:15", "0000:15:01.0", ...]}]   # optional, from sysfs
    nics: [{rdma_dev: "mlx5_0", netdev: "ens1np0", pci: "0000:1a:00.0", numa_node: 0,
            pcie_switch: "sw0", pcie_path: [...], port: 1}]

Distance classes follow ``nvidia-smi topo -m`` naming, closest first:
``PXB`` (same PCIe switch / root port), ``PHB`` (same host bridge), ``NODE`` (same NUMA
node), ``SYS`` (crosses the inter-socket link).
"""

from __future__ import annotations

import ipaddress
import re

from pdinfra.host import topology

try:  # pragma: no cover - exercised only inside Ansible
    from ansible.errors import AnsibleFilterError as _FilterError
except ImportError:  # pragma: no cover - plain unit tests without Ansible
    _FilterError = ValueError

_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _error(msg: str) -> Exception:
    return _FilterError(msg)


def ucx_pcie_path(sysfs_path: str) -> list[str]:
    """A resolved sysfs device path's PCIe hierarchy (pdinfra.host.topology.pcie_path)."""
    return topology.pcie_path(sysfs_path)


def ucx_pcie_distance(gpu: dict, nic: dict) -> tuple[int, str]:
    """``(score, label)`` of a GPU and a NIC, lower is closer (pdinfra.host.topology.distance)."""
    return topology.distance(
        gpu.get("pcie_path") or [],
        nic.get("pcie_path") or [],
        gpu.get("numa_node"),
        nic.get("numa_node"),
        gpu.get("pcie_switch"),
        nic.get("pcie_switch"),
    )


def _check_devices(gpus, nics) -> None:
    if not isinstance(gpus, list) or not isinstance(nics, list):
        raise _error("ucx_gpu_nic_map expects two lists (gpus, nics)")
    seen = set()
    for gpu in gpus:
        if not isinstance(gpu, dict) or "index" not in gpu:
            raise _error(f"ucx_gpus: every GPU needs an 'index' key, got {gpu!r}")
        if int(gpu["index"]) in seen:
            raise _error(f"ucx_gpus: duplicate GPU index {gpu['index']}")
        seen.add(int(gpu["index"]))
    names = set()
    for nic in nics:
        if not isinstance(nic, dict) or not nic.get("rdma_dev"):
            raise _error(f"ucx_nics: every NIC needs an 'rdma_dev' key, got {nic!r}")
        if nic["rdma_dev"] in names:
            raise _error(f"ucx_nics: duplicate rdma_dev {nic['rdma_dev']}")
        names.add(nic["rdma_dev"])


def ucx_gpu_nic_map(gpus: list, nics: list, default_port: int = 1) -> list[dict]:
    """Map each GPU to its closest NIC, spreading GPUs evenly over equally close NICs.

    Greedy in GPU index order: candidates are ranked by (distance, GPUs already assigned
    to the NIC, NIC list order). Returns one dict per GPU, sorted by GPU index; without
    NICs every entry has ``nic: None``.
    """
    _check_devices(gpus, nics)
    if not nics:
        return [
            {
                "gpu": int(g["index"]),
                "gpu_pci": g.get("pci", ""),
                "nic": None,
                "netdev": "",
                "port": int(default_port),
                "distance": "",
                "score": None,
            }
            for g in sorted(gpus, key=lambda g: int(g["index"]))
        ]
    ordered = sorted(gpus, key=lambda g: int(g["index"]))
    picked = topology.assign(ordered, nics, ucx_pcie_distance)
    return [
        {
            "gpu": int(gpu["index"]),
            "gpu_pci": gpu.get("pci", ""),
            "nic": nic["rdma_dev"],
            "netdev": nic.get("netdev", ""),
            "port": int(nic.get("port", default_port)),
            "distance": label,
            "score": score,
        }
        for gpu, (nic, score, label) in zip(ordered, picked, strict=True)
    ]


def ucx_net_devices(nics: list, default_port: int = 1) -> str:
    """``[{rdma_dev: mlx5_0}, ...]`` -> ``"mlx5_0:1,mlx5_1:1"`` (UCX_NET_DEVICES syntax)."""
    return ",".join(f"{n['rdma_dev']}:{int(n.get('port', default_port))}" for n in nics)


def ucx_parse_topology(lines: list, rdma_devs: list | None = None) -> dict:
    """Parse the role's sysfs probe output into ``{"gpus": [...], "nics": [...]}``.

    Probe lines are tab separated::

        gpu <TAB> 0000:18:00.0 <TAB> <numa_node> <TAB> <resolved sysfs path>
        nic <TAB> mlx5_0 <TAB> 0000:1a:00.0 <TAB> <numa_node> <TAB> <path> <TAB> <netdev>

    GPUs are indexed in PCI bus order (the order ``nvidia-smi`` and
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` use). ``rdma_devs`` restricts and orders the NICs.
    """
    gpus, nics = [], []
    for raw in lines or []:
        fields = str(raw).rstrip("\n").split("\t")
        if fields[0] == "gpu" and len(fields) >= 4:
            gpus.append(
                {"pci": fields[1].lower(), "numa_node": _int_or_none(fields[2]), "pcie_path": ucx_pcie_path(fields[3])}
            )
        elif fields[0] == "nic" and len(fields) >= 5:
            nics.append(
                {
                    "rdma_dev": fields[1],
                    "pci": fields[2].lower(),
                    "numa_node": _int_or_none(fields[3]),
                    "pcie_path": ucx_pcie_path(fields[4]),
                    "netdev": fields[5] if len(fields) > 5 else "",
                    "port": 1,
                }
            )
    gpus.sort(key=lambda g: g["pci"])
    for idx, gpu in enumerate(gpus):
        gpu["index"] = idx
    if rdma_devs:
        by_name = {n["rdma_dev"]: n for n in nics}
        nics = [by_name[name] for name in rdma_devs if name in by_name]
    else:
        nics.sort(key=lambda n: n["rdma_dev"])
    return {"gpus": gpus, "nics": nics}


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def ucx_env_lines(env: dict) -> str:
    """Render a mapping as systemd ``EnvironmentFile=`` lines, sorted by key.

    Values containing whitespace are double-quoted; newlines and double quotes are
    rejected because systemd would mis-parse them.
    """
    lines = []
    for key in sorted(env):
        value = env[key]
        if value is None or value == "":
            continue
        if not _ENV_KEY_RE.match(str(key)):
            raise _error(f"invalid environment variable name {key!r}")
        value = str(value)
        if "\n" in value or '"' in value:
            raise _error(f"environment value for {key} contains a newline or double quote")
        if any(c.isspace() for c in value):
            value = f'"{value}"'
        lines.append(f"{key}={value}")
    return "\n".join(lines) + ("\n" if lines else "")


def ucx_ipv4_gid(cidr) -> str:
    """The RoCE v2 GID sysfs shows for a rail's IPv4 address (IPv4-mapped IPv6, sysfs spelling), as the rdma_roce role
    reads it: ``198.18.1.11/24`` -> ``0000:0000:0000:0000:0000:ffff:c612:010b``."""
    packed = ipaddress.IPv4Interface(str(cidr)).ip.packed
    return ":".join(["0000"] * 5 + ["ffff", packed[:2].hex(), packed[2:].hex()])


def ucx_found_gids(results: list) -> dict:
    """``{rdma_dev: index}`` from the GID probe's loop results (each ``item.rdma_dev`` and ``stdout``): rails whose
    probe printed no index (``missing``, ``none``, skipped) are left out, so the template writes no GID for them."""
    out = {}
    for res in results or []:
        index = str(res.get("stdout", "")).strip()
        if index.isdigit():
            out[str(res["item"]["rdma_dev"])] = int(index)
    return out


class FilterModule:
    """Ansible entry point."""

    def filters(self):
        return {
            "ucx_pcie_path": ucx_pcie_path,
            "ucx_pcie_distance": ucx_pcie_distance,
            "ucx_gpu_nic_map": ucx_gpu_nic_map,
            "ucx_net_devices": ucx_net_devices,
            "ucx_parse_topology": ucx_parse_topology,
            "ucx_env_lines": ucx_env_lines,
            "ucx_ipv4_gid": ucx_ipv4_gid,
            "ucx_found_gids": ucx_found_gids,
        }
