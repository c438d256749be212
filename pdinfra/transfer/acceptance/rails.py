"""Per-rail GPUDirect RDMA for the bandwidth acceptance (``pdinfra validate --acceptance-rdma``): which NIC each GPU
uses (the ucx role's affinity, else PCIe distance and NUMA node), perftest's ``ib_write_bw`` command lines with CUDA
buffers as azurehpc-health-checks runs them, running a server/client pair, and reading its report. Judged in
pdinfra.transfer.acceptance (``_rdma_checks``), which re-exports these names."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pdinfra.host import topology


class RailSettings(Protocol):
    """What the perftest commands read of an acceptance configuration (pdinfra.transfer.acceptance)."""

    rdma_bytes: int


# --------------------------------------------------------------------------------------------------
# perftest: the rails, the commands, the report
# --------------------------------------------------------------------------------------------------


@dataclass
class RailPlan:
    """One rail's ib_write_bw test: a NIC port with the GPU it serves."""

    rdma_dev: str
    port: int
    gpu: int
    netdev: str = ""
    link_layer: str = ""
    rate_gbits: float | None = None
    gid_index: int | None = None
    numa: int | None = None
    how: str = ""  # how the GPU was paired with the NIC
    dmabuf: bool = False  # --use_cuda_dmabuf (no nvidia_peermem: the open driver's dma-buf path)


def _rate_gbits(rate: str | None) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*Gb", rate or "")
    return float(m.group(1)) if m else None


def _declared_netdevs(facts: dict[str, Any]) -> set[str]:
    rdma = (facts.get("expect") or {}).get("rdma") or []
    return {str(r if isinstance(r, str) else r.get("netdev")) for r in rdma if r}


def _dev_netdevs(dev: dict[str, Any]) -> list[str]:
    names = list(dev.get("netdevs") or [])
    for p in dev.get("ports") or []:
        names += [g["ndev"] for g in p.get("gids") or [] if g.get("ndev") and g["ndev"] not in names]
    return names


def _gid_index(port: dict[str, Any], wanted: str | None) -> int | None:
    """The RoCE v2 IPv4 GID (the ucx role's UCX_IB_GID_INDEX where it names one); None on InfiniBand."""
    if (port.get("link_layer") or "").lower() != "ethernet":
        return None
    gids = port.get("gids") or []
    if wanted and wanted.isdigit() and any(g.get("index") == int(wanted) for g in gids):
        return int(wanted)
    for pick in (lambda g: g.get("type") == "RoCE v2" and g.get("ipv4"), lambda g: g.get("type") == "RoCE v2"):
        found = next((g for g in gids if pick(g)), None)
        if found is not None:
            return found.get("index")
    return None


def sysfs_pcie_path(bdf: str) -> list[str]:
    """The PCIe hierarchy of a device on this machine: its resolved sysfs path's PCI components (the host facts'
    ``pci_path``, which ``pcie.acs`` reads too); empty when sysfs does not place it."""
    from pdinfra.host.facts_base import Host, pci_path

    return pci_path(Host("/"), bdf) or []


def plan_rails(
    facts: dict[str, Any], pcie_path: Callable[[str], list[str]] | None = None
) -> tuple[list[RailPlan], str]:
    """Each rail NIC (the declared rails, else every RDMA device with an ACTIVE port) with its GPU; the reason when
    there is none. The GPU: the one whose ``/etc/pdinfra/ucx-gpu<N>.env`` names the NIC (the ucx role's PCIe
    affinity), else the closest by PCIe path and NUMA node, GPUs spread evenly over equally close NICs."""
    devices = [d for d in (facts.get("rdma") or {}).get("devices") or [] if d.get("name")]
    if not devices:
        return [], "no RDMA device (/sys/class/infiniband is empty)"
    gpus = list((facts.get("gpus") or {}).get("devices") or [])
    if not gpus:
        return [], "no GPU: GPUDirect RDMA needs one"
    declared = _declared_netdevs(facts)
    if declared:
        devices = [d for d in devices if declared & set(_dev_netdevs(d))]
        if not devices:
            return [], f"no RDMA device carries the declared rails ({', '.join(sorted(declared))})"
    ports: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for d in devices:
        active = [p for p in d.get("ports") or [] if p.get("state") == "ACTIVE"]
        if active:
            ports.append((d, active[0]))
    if not ports:
        return [], "no RDMA port is ACTIVE"
    env_files = (facts.get("ucx") or {}).get("env_files") or {}
    by_env: dict[str, tuple[int, str | None, str]] = {}
    for name, env in sorted(env_files.items()):
        gpu_index = topology.gpu_of_env_name(name)
        nets = [x for x in (env.get("UCX_NET_DEVICES") or "").split(",") if ":" in x]
        if gpu_index is not None and nets:
            by_env.setdefault(nets[0].partition(":")[0], (gpu_index, env.get("UCX_IB_GID_INDEX"), name))
    modules = (facts.get("modules") or {}).get("loaded") or {}
    peermem = bool(modules.get("nvidia_peermem") or modules.get("nv_peer_mem"))
    gnuma = {int(g.get("index", 0)): ((g.get("pcie") or {}).get("sysfs") or {}).get("numa_node") for g in gpus}
    order = sorted(gpus, key=lambda g: int(g.get("index", 0)))

    def score(g: dict[str, Any], port: tuple[dict[str, Any], dict[str, Any]]) -> tuple[int, str]:
        d = port[0]
        gpath = pcie_path(g["bus_id"]) if pcie_path and g.get("bus_id") else []
        npath = pcie_path(d["pci"]) if pcie_path and d.get("pci") else []
        return topology.distance(gpath, npath, gnuma[int(g.get("index", 0))], d.get("numa_node"))

    gpu_nic = {
        int(g.get("index", 0)): (port[0]["name"], label)
        for g, (port, _, label) in zip(order, topology.assign(order, ports, score), strict=True)
    }
    rails: list[RailPlan] = []
    for d, p in ports:
        name = d["name"]
        if name in by_env:
            gpu, gid_wanted, how = by_env[name][0], by_env[name][1], by_env[name][2]
        else:
            mine = [(g, lab) for g, (n, lab) in sorted(gpu_nic.items()) if n == name]
            if mine:
                gpu, how = mine[0][0], f"closest GPU ({mine[0][1]})"
            else:  # more NICs than GPUs: the closest GPU serves this one too
                gpu = min(gnuma, key=lambda i: (topology.distance([], [], gnuma[i], d.get("numa_node"))[0], i))
                how = f"closest GPU ({topology.distance([], [], gnuma[gpu], d.get('numa_node'))[1]}, shared)"
            gid_wanted = None
        dev_cuda = next((g.get("cuda") or {} for g in gpus if int(g.get("index", 0)) == gpu), {})
        rails.append(
            RailPlan(
                rdma_dev=name,
                port=int(p.get("port") or 1),
                gpu=gpu,
                netdev=(_dev_netdevs(d) or [""])[0],
                link_layer=str(p.get("link_layer") or ""),
                rate_gbits=_rate_gbits(p.get("rate")),
                gid_index=_gid_index(p, gid_wanted),
                numa=d.get("numa_node"),
                how=how,
                dmabuf=not peermem and bool(dev_cuda.get("dma_buf_supported")),
            )
        )
    return rails, ""


def ib_write_bw_argv(
    rail: RailPlan, tcp_port: int, cfg: RailSettings, server: str | None = None, numactl: bool = False
) -> list[str]:
    """azurehpc-health-checks' check_ib_bw_gdr command (customTests/azure_ib_write_bw_gdr.nhc) for one rail: 8 MiB
    RDMA writes between CUDA buffers on the rail's GPU, ``--report_gbits``; ``server`` makes it the client."""
    argv = ["ib_write_bw", "-d", rail.rdma_dev, "-i", str(rail.port), f"--use_cuda={rail.gpu}"]
    if rail.dmabuf:
        argv.append("--use_cuda_dmabuf")  # after --use_cuda: perftest refuses the other order
    if rail.gid_index is not None:
        argv += ["-x", str(rail.gid_index)]
    argv += ["-s", str(cfg.rdma_bytes), "-F", "--report_gbits", "--perform_warm_up", "-p", str(tcp_port)]
    if server:
        argv.append(server)
    if numactl and rail.numa is not None and rail.numa >= 0:
        argv = ["numactl", f"--cpunodebind={rail.numa}", f"--membind={rail.numa}", *argv]
    return argv


CUDA_ORDER = "CUDA_DEVICE_ORDER=PCI_BUS_ID"  # --use_cuda=<i> is then NVML's (the facts') GPU i


def rail_commands(rail: RailPlan, i: int, cfg: RailSettings, numactl: bool = False) -> tuple[list[str], list[str]]:
    """(server argv, client argv) of rail ``i``: both here (loopback through the NIC), or the server on the peer
    over SSH (the same NIC name and GPU index there: hosts of one build) and the client here."""
    tcp = cfg.rdma_tcp_port + i
    if cfg.peer:
        remote = ib_write_bw_argv(rail, tcp, cfg)
        server = ["ssh", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", cfg.peer,
                  "env", CUDA_ORDER, "timeout", str(int(cfg.rdma_timeout_s)), *remote]  # fmt: skip
        return server, ib_write_bw_argv(rail, tcp, cfg, cfg.peer.rsplit("@", 1)[-1], numactl)
    return ib_write_bw_argv(rail, tcp, cfg, None, numactl), ib_write_bw_argv(rail, tcp, cfg, "127.0.0.1", numactl)


def shown(argv: list[str]) -> str:
    """A command as a person would type it (with the device-order variable of the local side)."""
    text = shlex.join(argv)
    return text if argv[:1] == ["ssh"] else f"{CUDA_ORDER} {text}"


_ROW = re.compile(r"\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*")


def parse_ib_write_bw(text: str) -> dict[str, Any] | None:
    """The result of an ``ib_write_bw`` run (its client's or server's output): the last row of the table under
    ``#bytes #iterations BW peak[..] BW average[..] MsgRate[Mpps]``, with the average in Gb/s. perftest prints Gb/s
    with --report_gbits (125000000 bytes per Gb/s), else MiB/s ("MB/sec" before 2024; both are 0x100000 bytes)."""
    unit = None
    last = None
    info: dict[str, Any] = {}
    for line in text.splitlines():
        m = re.search(r"BW average\[([^\]]+)\]", line)
        if m:
            unit = m.group(1)
            continue
        for key, pat in (
            ("device", r"Device\s*:\s*(\S+)"),
            ("link_type", r"Link type\s*:\s*(\S+)"),
            ("mtu", r"Mtu\s*:\s*(\d+)"),
            ("gid_index", r"GID index\s*:\s*(\d+)"),
        ):
            mm = re.search(pat, line)
            if mm and key not in info:
                info[key] = int(mm.group(1)) if key in ("mtu", "gid_index") else mm.group(1)
        if unit:
            r = _ROW.fullmatch(line)
            if r:
                last = r
    if unit is None or last is None:
        return None
    avg = float(last.group(4))
    gbits = avg if unit.startswith("Gb") else avg * 0x100000 * 8 / 1e9
    return {
        "bytes": int(last.group(1)),
        "iterations": int(last.group(2)),
        "bw_peak": float(last.group(3)),
        "bw_average": avg,
        "unit": unit,
        "gbits": round(gbits, 2),
        "msg_rate_mpps": float(last.group(5)),
        "cuda": "cuMemAlloc" in text or "CUDA" in text,
        **info,
    }


def run_ib_pair(server: list[str], client: list[str], timeout_s: float) -> dict[str, Any]:
    """Start the server, then the client (retried while the server is not listening yet); both outputs and codes."""
    import os

    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    srv = subprocess.Popen(server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out: dict[str, Any] = {"client_rc": None, "client": "", "server_rc": None, "server": ""}
    try:
        for attempt in range(4):
            time.sleep(2.0 if attempt == 0 else 3.0)
            try:
                res = subprocess.run(client, capture_output=True, text=True, timeout=timeout_s, env=env)
            except subprocess.TimeoutExpired as exc:
                out["client"] = f"{exc.stdout or ''}{exc.stderr or ''}\n(client timed out after {timeout_s:.0f} s)"
                break
            out["client_rc"], out["client"] = res.returncode, res.stdout + res.stderr
            if res.returncode == 0 or "Couldn't connect" not in out["client"] or srv.poll() is not None:
                break
        srv_out, _ = srv.communicate(timeout=30)
        out["server"], out["server_rc"] = srv_out, srv.returncode
    except subprocess.TimeoutExpired:
        srv.kill()
        srv_out, _ = srv.communicate()
        out["server"], out["server_rc"] = (srv_out or "") + "\n(server killed: no exit 30 s after the client)", None
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait(5)
    return out


def perftest_status(which: Callable[[str], str | None], probe: Callable[[list[str]], str]) -> tuple[bool, str, bool]:
    """(ib_write_bw present, its path or why not, built with CUDA: --use_cuda in its --help)."""
    path = which("ib_write_bw")
    if not path:
        return False, "perftest not installed (no ib_write_bw on PATH)", False
    text = probe([path, "--help"])
    return True, path, "use_cuda" in text


def rail_probe(argv: list[str]) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return res.stdout + res.stderr
