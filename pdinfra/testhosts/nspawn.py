"""Local "bare-metal" test hosts: Debian 12 booted with systemd as PID 1 under systemd-nspawn.

Each host gets an overlay root (a cached debootstrap base as the lower layer), its own network
namespace with a veth into the bridge ``pdbr0`` and an address from 198.18.0.0/15 (RFC 2544
benchmarking range), and is reached by Ansible over real SSH with a key generated here.
The hosts have no route to the internet: everything they need comes from the controller
(the wheelhouse), as on an air-gapped cluster.

Everything is created by ``create()`` and removed by ``destroy()``: no process, mount,
namespace, veth, bridge or cgroup is left behind.  Needs root, ``debootstrap`` and
``systemd-nspawn`` (package ``systemd-container``).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pdinfra import paths
from pdinfra.cluster.inventory import Inventory

SUITE = "bookworm"
MIRROR = os.environ.get("PDINFRA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a node needs before Ansible can manage it and vLLM's CPU build can run in it.
BASE_PACKAGES = (
    "systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,python3-packaging,libnuma1,openssh-server,"
    "iproute2,iputils-ping,sudo,procps,curl,ca-certificates,less,nftables,prometheus,"
    "prometheus-node-exporter,"
    # keepalived: the front door's virtual IP over both nodes as router hosts (pdinfra_router_vip, pd_router role)
    "keepalived,"
    # Mooncake's wheels (the KV reuse tier, pdinfra_kv_store) link libibverbs even without RDMA hardware.
    "libibverbs1,"
    # vLLM's CPU sampler compiles kernels with torch inductor at run time (logprobs): it needs a C++ compiler and
    # Python.h (pd_runtime_compiler_packages; the local nodes have no package mirror, so the image carries them).
    "g++,python3-dev"
)
BRIDGE = "pdbr0"
CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))

Progress = Callable[[str], None]


class TestHostError(RuntimeError):
    """A test host could not be created or destroyed."""


@dataclass(frozen=True)
class Link:
    """An extra network interface inside a test host (standing in for a rail NIC's netdev)."""

    name: str
    address: str = ""  # CIDR, optional
    mtu: int = 1500


@dataclass(frozen=True)
class TestHost:
    """One local node, as the inventory declares it."""

    name: str
    address: str  # CIDR, e.g. 198.18.0.11/24
    links: tuple[Link, ...] = ()

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def netns(self) -> str:
        return f"pdinfra-{self.name}"

    @property
    def veth_host(self) -> str:
        return f"pdv-{self.name}"[:15]

    @property
    def veth_peer(self) -> str:
        return f"pdp-{self.name}"[:15]

    @property
    def gateway(self) -> str:
        net = ipaddress.ip_interface(self.address).network
        return str(next(net.hosts()))

    @property
    def gateway_cidr(self) -> str:
        return f"{self.gateway}/{ipaddress.ip_interface(self.address).network.prefixlen}"

    def state_dir(self) -> Path:
        return paths.state_dir() / "testhosts" / self.name


def _run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, text=True, capture_output=True, **kw)


def _quiet(cmd: list[str]) -> None:
    subprocess.run(cmd, check=False, capture_output=True)


def _say(progress: Progress | None, msg: str) -> None:
    if progress:
        progress(msg)


def require_tools() -> None:
    """Fail with a plain message when the host tools are missing."""
    if os.geteuid() != 0:
        raise TestHostError("local test hosts need root (systemd-nspawn, network namespaces, mounts)")
    missing = [t for t in ("debootstrap", "systemd-nspawn", "ip", "zstd", "ssh", "ssh-keygen") if not shutil.which(t)]
    if missing:
        raise TestHostError(
            f"missing tools: {', '.join(missing)} "
            "(apt-get install debootstrap systemd-container iproute2 zstd openssh-client)"
        )


# ----------------------------------------------------------------------------- base root filesystem
def _base_key() -> str:
    return hashlib.sha256(f"{SUITE}|{MIRROR}|{BASE_PACKAGES}|v2".encode()).hexdigest()[:12]


def base_tarball() -> Path:
    return paths.cache_dir() / f"rootfs-{SUITE}-{_base_key()}.tar.zst"


def ensure_base(progress: Progress | None = None) -> Path:
    """Return the unpacked base root (lower layer), building and caching it when needed."""
    base_dir = paths.state_dir() / "testhosts" / f"base-{_base_key()}"
    if (base_dir / "etc" / "os-release").exists():
        return base_dir
    tarball = base_tarball()
    if not tarball.exists():
        build = paths.cache_dir() / f"rootfs-build-{_base_key()}"
        shutil.rmtree(build, ignore_errors=True)
        _say(progress, f"debootstrap {SUITE} (minbase + {BASE_PACKAGES.count(',') + 1} packages), about a minute")
        cmd = ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, str(build), MIRROR]
        res = subprocess.run(cmd, text=True, capture_output=True)
        if res.returncode != 0:
            raise TestHostError(f"debootstrap failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        _prepare_base(build)
        _say(progress, f"caching the base as {tarball}")
        tmp = tarball.with_suffix(".tmp")
        _run(
            [
                "tar",
                "--numeric-owner",
                "--xattrs",
                "--acls",
                "-I",
                "zstd -3 -T0",
                "-C",
                str(build),
                "-cf",
                str(tmp),
                ".",
            ]
        )
        tmp.rename(tarball)
        shutil.rmtree(build, ignore_errors=True)
    _say(progress, "unpacking the cached base root filesystem")
    tmp_dir = base_dir.with_name(base_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    _run(["tar", "--numeric-owner", "--xattrs", "--acls", "-I", "zstd", "-C", str(tmp_dir), "-xf", str(tarball)])
    tmp_dir.rename(base_dir)
    return base_dir


def _prepare_base(root: Path) -> None:
    """Make a freshly bootstrapped tree boot cleanly under nspawn and be reachable by SSH."""
    (root / "etc/machine-id").write_text("")
    dbus_id = root / "var/lib/dbus/machine-id"
    with contextlib.suppress(FileNotFoundError):
        dbus_id.unlink()
    dbus_id.parent.mkdir(parents=True, exist_ok=True)
    dbus_id.symlink_to("/etc/machine-id")
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # Host keys are made per host at create time; sshd must not start without them.
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/pdinfra.conf").write_text(
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    )
    # No console getty inside a headless node; keeps boot quiet and fast.
    for unit in ("getty@tty1.service", "console-getty.service"):
        _quiet(["systemctl", f"--root={root}", "mask", unit])
    _quiet(["systemctl", f"--root={root}", "enable", "ssh.service"])
    # Prometheus and the node exporter start only once the pd_monitoring role has configured them (by default they
    # would listen on every address); the exporter's apt/smartmon helper timers are not wanted in a test node.
    _quiet(["systemctl", f"--root={root}", "disable", "prometheus.service", "prometheus-node-exporter.service"])
    _quiet(["systemctl", f"--root={root}", "disable", "keepalived.service"])  # the pd_router role enables it
    for unit in (
        "prometheus-node-exporter-apt.timer",
        "prometheus-node-exporter-smartmon.timer",
        "prometheus-node-exporter-nvme.timer",
        "prometheus-node-exporter-ipmitool-sensor.timer",
        "prometheus-node-exporter-mellanox-hca-temp.timer",
    ):
        _quiet(["systemctl", f"--root={root}", "mask", unit])
    apt_conf = root / "etc/apt/apt.conf.d/99pdinfra"
    apt_conf.write_text('Acquire::Retries "0";\nAPT::Install-Recommends "false";\n')
    _quiet(["chroot", str(root), "apt-get", "clean"])


# ----------------------------------------------------------------------------- SSH key of the controller
def ssh_key() -> Path:
    key = paths.state_dir() / "testhosts" / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pdinfra-testhosts", "-f", str(key)])
    return key


def api_key_file() -> Path:
    """The local cluster's API key (inventory/local reads it through pdinfra_api_key_file): random, root-only."""
    key = paths.state_dir() / "testhosts" / "api.key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
    return key


# ----------------------------------------------------------------------------- network
def _link_exists(name: str, netns: str | None = None) -> bool:
    cmd = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", name]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def _setup_bridge(host: TestHost) -> None:
    if not _link_exists(BRIDGE):
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    addrs = _run(["ip", "-j", "addr", "show", "dev", BRIDGE]).stdout
    if host.gateway not in addrs:
        _run(["ip", "addr", "add", host.gateway_cidr, "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])


def _setup_netns(host: TestHost) -> None:
    if not Path(f"/run/netns/{host.netns}").exists():
        _run(["ip", "netns", "add", host.netns])
    if not _link_exists(host.veth_host):
        _run(["ip", "link", "add", host.veth_host, "type", "veth", "peer", "name", host.veth_peer])
        _run(["ip", "link", "set", host.veth_peer, "netns", host.netns])
        _run(["ip", "-n", host.netns, "link", "set", host.veth_peer, "name", "eth0"])
    _run(["ip", "link", "set", host.veth_host, "master", BRIDGE])
    _run(["ip", "link", "set", host.veth_host, "up"])
    _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
    _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
    if host.ip not in _run(["ip", "-n", host.netns, "-j", "addr", "show", "dev", "eth0"]).stdout:
        _run(["ip", "-n", host.netns, "addr", "add", host.address, "dev", "eth0"])
    _quiet(["ip", "-n", host.netns, "route", "replace", "default", "via", host.gateway])
    for link in host.links:
        # A veth pair with both ends inside the node (no dummy module on every kernel); the peer only
        # gives the link a carrier. Deleting the namespace removes both.
        peer = f"{link.name}p"[:15]
        if not _link_exists(link.name, host.netns):
            _run(["ip", "-n", host.netns, "link", "add", link.name, "type", "veth", "peer", "name", peer])
        for dev in (peer, link.name):
            _run(["ip", "-n", host.netns, "link", "set", dev, "mtu", str(link.mtu), "up"])
        shown = _run(["ip", "-n", host.netns, "-j", "addr", "show", "dev", link.name]).stdout
        if link.address and link.address.split("/")[0] not in shown:
            _run(["ip", "-n", host.netns, "addr", "add", link.address, "dev", link.name])


def _teardown_netns(host: TestHost) -> None:
    if _link_exists(host.veth_host):
        _quiet(["ip", "link", "del", host.veth_host])
    deadline = time.monotonic() + 10
    while _link_exists(host.veth_host) and time.monotonic() < deadline:
        time.sleep(0.1)
    if Path(f"/run/netns/{host.netns}").exists():
        _quiet(["ip", "netns", "del", host.netns])


def _teardown_bridge_if_unused() -> None:
    if not _link_exists(BRIDGE):
        return
    ports = _run(["ip", "-j", "link", "show", "master", BRIDGE], check=False).stdout.strip()
    if ports in ("", "[]", "[ ]"):
        _quiet(["ip", "link", "del", BRIDGE])


# ----------------------------------------------------------------------------- root filesystem per host
def _is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as fh:
        return any(line.split()[1] == target for line in fh)


def _mount_root(host: TestHost, base: Path) -> Path:
    sd = host.state_dir()
    upper, work, merged = sd / "upper", sd / "work", sd / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    if not _is_mounted(merged):
        opts = f"lowerdir={base},upperdir={upper},workdir={work}"
        _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)])
    return merged


def _personalise(host: TestHost, root: Path, pubkey: str) -> None:
    (root / "etc/hostname").write_text(host.name + "\n")
    hosts = "127.0.0.1 localhost\n::1 localhost\n"
    (root / "etc/hosts").write_text(hosts + f"{host.ip} {host.name}\n")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    os.chmod(ssh_dir / "authorized_keys", 0o600)
    if not list((root / "etc/ssh").glob("ssh_host_*_key")):
        _run(["ssh-keygen", "-A", "-f", str(root)])
    pin_host_keys(host, root)


def known_hosts() -> Path:
    """The known_hosts of the local test hosts: pdinfra makes their host keys, so it pins them here (the local
    inventory, ssh_command and ssh_config verify against it; nothing else is trusted on first contact)."""
    return paths.state_dir() / "testhosts" / "ssh" / "known_hosts"


def pin_host_keys(host: TestHost, root: Path) -> None:
    """Replace ``host``'s lines in :func:`known_hosts` with the public host keys in its root filesystem."""
    kh = known_hosts()
    kh.parent.mkdir(parents=True, exist_ok=True)
    keep = [ln for ln in (kh.read_text().splitlines() if kh.exists() else []) if ln.split(" ", 1)[0] != host.ip]
    for pub in sorted((root / "etc/ssh").glob("ssh_host_*_key.pub")):
        kind, key = pub.read_text().split()[:2]
        keep.append(f"{host.ip} {kind} {key}")
    kh.write_text("\n".join(keep) + "\n")
    kh.chmod(0o644)


# ----------------------------------------------------------------------------- boot and stop
def _pidfile(host: TestHost) -> Path:
    return host.state_dir() / "nspawn.pid"


def running_pid(host: TestHost) -> int | None:
    try:
        pid = int(_pidfile(host).read_text())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return None
    return pid if b"systemd-nspawn" in cmdline else None


def _cgroup_dirs(host: TestHost) -> list[Path]:
    return [r / f"pdinfra-{host.name}" for r in CGROUP_ROOTS if r.is_dir()]


def _enter_cgroups(dirs: list[Path]) -> Callable[[], None]:
    def enter() -> None:
        os.setsid()
        for d in dirs:
            with contextlib.suppress(OSError):
                (d / "cgroup.procs").write_text(str(os.getpid()))

    return enter


def _cgroup_env() -> dict[str, str]:
    """How the nodes' systemd sees cgroups. Where the controller has a cgroup2 hierarchy beside the v1 ones (hybrid:
    /sys/fs/cgroup/unified), nspawn gives the node the same, and the node's systemd learns from cgroup2 when a unit's
    last process is gone. On pure v1 it cannot in a container: every stop of a unit whose main process leaves a child
    (vLLM's resource tracker) waited TimeoutStopSec after the final SIGKILL and ended "failed (timeout)"."""
    return {} if _fs_type(CGROUP_ROOTS[0]) == "cgroup2" else {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "0"}


def _fs_type(path: Path) -> str:
    """The file system type mounted at ``path`` (/proc/self/mountinfo), or "" when nothing is mounted there."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == str(path):
            return right.split()[0]
    return ""


def _boot(host: TestHost, root: Path) -> int:
    sd = host.state_dir()
    dirs = _cgroup_dirs(host)
    for d in dirs:
        d.mkdir(exist_ok=True)
    cmd = [
        "systemd-nspawn", "-D", str(root), "-M", host.name, "--boot", "--register=no", "--keep-unit",
        # read-only: the node's console goes to console.log. Not "passive": that pty is connected nowhere, and
        # once its buffer is full the node's systemd blocks for ever writing a status line to it (seen after a
        # few dozen failed starts: PID 1 hung, no restarts, no zombies reaped, daemon-reload failing).
        "--console=read-only", "--resolv-conf=off", "--timezone=off", "--link-journal=no",
        f"--network-namespace-path=/run/netns/{host.netns}",
        # nftables in the node's own network namespace (the pd_firewall role); nspawn grants CAP_NET_ADMIN only
        # with --private-network, not with a namespace path.
        "--capability=CAP_NET_ADMIN",
    ]  # fmt: skip
    log = open(sd / "console.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_enter_cgroups(dirs),
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **_cgroup_env()},
    )
    log.close()
    _pidfile(host).write_text(str(proc.pid))
    return proc.pid


def _wait_ssh(host: TestHost, key: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if running_pid(host) is None:
            tail = (host.state_dir() / "console.log").read_text(errors="replace")[-3000:]
            raise TestHostError(f"{host.name}: systemd-nspawn exited during boot:\n{tail}")
        try:
            with socket.create_connection((host.ip, 22), timeout=1):
                pass
        except OSError as exc:
            last = str(exc)
            time.sleep(0.3)
            continue
        res = subprocess.run(ssh_command(host, key) + ["true"], capture_output=True, text=True, timeout=20)
        if res.returncode == 0:
            return
        last = res.stderr.strip()
        time.sleep(0.5)
    raise TestHostError(f"{host.name}: SSH on {host.ip}:22 not answering after {timeout:.0f} s ({last})")


def ssh_config(hosts: list[TestHost], key: Path) -> Path:
    """An ssh_config(5) naming each test host (``Host node1`` -> its address) with the options of ssh_command, for
    tools that take one: testinfra's SSH backend (``--hosts=ssh://node1 --ssh-config=...``) keeps one multiplexed
    connection per host, where ``--force-ansible`` starts an Ansible process for every command."""
    conf = key.parent / "config"
    blocks = [
        f"Host {h.name}\n  HostName {h.ip}\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
        f"  BatchMode yes\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {known_hosts()}\n  LogLevel ERROR\n"
        "  ConnectTimeout 5\n"
        for h in hosts
    ]
    conf.write_text("# Written by pdinfra (testhosts.ssh_config) for the local test hosts.\n" + "".join(blocks))
    conf.chmod(0o600)
    return conf


def ssh_command(host: TestHost, key: Path) -> list[str]:
    return [
        "ssh",
        "-i",
        str(key),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts()}",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=5",
        f"root@{host.ip}",
    ]


def _stop(host: TestHost, timeout: float = 45.0) -> None:
    pid = running_pid(host)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # nspawn forwards it as a clean halt
        deadline = time.monotonic() + timeout
        while running_pid(host) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        if running_pid(host) is not None:
            os.killpg(pid, signal.SIGKILL)
            time.sleep(0.5)
    # Anything left in the host's cgroups, at any depth (nothing after a clean halt; the whole node after nspawn
    # itself was killed: the node's systemd and services are not in nspawn's process group).
    kill_all(host)
    for d in _cgroup_dirs(host):
        _rmdir_cgroup(d)
    with contextlib.suppress(FileNotFoundError):
        _pidfile(host).unlink()


def _pids_in(d: Path) -> set[int]:
    pids: set[int] = set()
    for procs in d.rglob("cgroup.procs") if d.is_dir() else ():
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in procs.read_text().split())
    return pids


def pids(host: TestHost) -> set[int]:
    """Every process in the host's cgroups (the node's systemd and all it runs)."""
    return set().union(*(_pids_in(d) for d in _cgroup_dirs(host)))


def kill_all(host: TestHost, timeout: float = 10.0) -> int:
    """SIGKILL every process in the host's cgroups, the whole subtree, until none is left (or ``timeout``): what a
    power loss does to the node's processes. Returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = pids(host)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= left
        time.sleep(0.1)
    return len(killed)


def power_off(host: TestHost, after_link: Callable[[], None] | None = None) -> None:
    """Like a power loss: the node's link goes first (nothing more leaves it: no FIN, no VRRP goodbye), then every
    process in it is killed and what is left is cleaned up as after a halt. ``after_link`` runs between the two
    (a test starts its clock there). `create` boots it again."""
    _run(["ip", "link", "set", host.veth_host, "down"])
    if after_link is not None:
        after_link()
    pid = running_pid(host)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    kill_all(host)
    _stop(host, timeout=5)


def _rmdir_cgroup(d: Path) -> None:
    if not d.exists():
        return
    for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    deadline = time.monotonic() + 5
    while d.exists() and time.monotonic() < deadline:
        try:
            d.rmdir()
        except OSError:
            time.sleep(0.1)


# ----------------------------------------------------------------------------- public API
def create(hosts: list[TestHost], progress: Progress | None = None) -> None:
    """Create (or resume) every host; idempotent."""
    require_tools()
    base = ensure_base(progress)
    key = ssh_key()
    api_key_file()
    pubkey = key.with_suffix(".pub").read_text()
    for host in hosts:
        _setup_bridge(host)
        _setup_netns(host)
        root = _mount_root(host, base)
        _personalise(host, root, pubkey)
        if running_pid(host) is None:
            _say(progress, f"booting {host.name} ({host.ip}) with systemd as PID 1")
            _boot(host, root)
    for host in hosts:
        _wait_ssh(host, key)
        _say(progress, f"{host.name} answers on ssh://root@{host.ip}")
    ssh_config(hosts, key)  # for testinfra's SSH backend (tests/conformance, docs/testing.md)


def destroy(hosts: list[TestHost], progress: Progress | None = None, keep_disk: bool = False) -> None:
    """Stop every host and remove its mounts, namespace, veth, cgroups (and disk unless keep_disk)."""
    for host in hosts:
        _say(progress, f"stopping {host.name}")
        _stop(host)
        merged = host.state_dir() / "merged"
        if _is_mounted(merged):
            res = subprocess.run(["umount", str(merged)], capture_output=True, text=True)
            if res.returncode != 0:
                subprocess.run(["umount", "-l", str(merged)], capture_output=True)
        _teardown_netns(host)
        if not keep_disk:
            shutil.rmtree(host.state_dir(), ignore_errors=True)
    _teardown_bridge_if_unused()


def leftovers(hosts: list[TestHost]) -> list[str]:
    """What create() made that is still there (empty after destroy())."""
    found: list[str] = []
    for host in hosts:
        if running_pid(host) is not None:
            found.append(f"process: systemd-nspawn of {host.name}")
        if _is_mounted(host.state_dir() / "merged"):
            found.append(f"mount: {host.state_dir() / 'merged'}")
        if Path(f"/run/netns/{host.netns}").exists():
            found.append(f"netns: {host.netns}")
        if _link_exists(host.veth_host):
            found.append(f"veth: {host.veth_host}")
        found += [f"cgroup: {d}" for d in _cgroup_dirs(host) if d.exists()]
    if _link_exists(BRIDGE):
        found.append(f"bridge: {BRIDGE}")
    return found


def from_inventory(inv: Inventory) -> list[TestHost]:
    """The test hosts an inventory declares (hosts with ``pdinfra_testhost: true``)."""
    hosts = []
    for name, hv in sorted(inv.hostvars.items()):
        if not hv.get("pdinfra_testhost"):
            continue
        addr = hv.get("pdinfra_address")
        if not addr or "/" not in str(addr):
            raise TestHostError(f"{inv.source}: host {name}: pdinfra_address must be an address with prefix length")
        links = tuple(
            Link(str(lk["name"]), str(lk.get("address", "")), int(lk.get("mtu", 1500)))
            for lk in hv.get("pdinfra_testhost_links", []) or []
        )
        hosts.append(TestHost(name=name, address=str(addr), links=links))
    return hosts
