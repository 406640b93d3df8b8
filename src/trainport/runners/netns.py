"""A job's own network: each host a network namespace on a bridge of the job's.

As root (and not on the ray runner), every host ``algo-k`` of a job runs inside a network
namespace whose ``eth0`` (a veth pair) sits on the job's bridge ``tpb<tag>``, at
``10.<a>.<b>.(k+1)/24``. The hosts reach each other over the bridge and the outside through
NAT (the bridge holds the gateway ``.1``; forwarding on, a masquerade rule for the bridge);
nothing of the machine or of another job exists for them. trainport's rules live in one
nftables table, ``inet trainport``: its chains drop whatever arrives at the machine from
any trainport bridge (bar replies to connections the machine opened) and whatever one
bridge would forward to another, and the job's bridge is an element of its sets while it
runs. Each host's link may be shaped with ``tc tbf`` (``trainport:host-bandwidth``, e.g.
``400mbit``, both directions). Namespaces, bridge and set elements go when the job ends.

The decision is :func:`choose_network`, a pure function: the tag ``trainport:network``
(``loopback`` opts out, ``namespaces`` insists), the runner, EnableNetworkIsolation and what
the machine can make. Without root the hosts share the machine's network, each at its own
loopback address (see ``host_addresses`` in the supervisor).

EnableNetworkIsolation: the hosts must still reach each other (distributed training) and
nothing else. On the bridge, an isolated job's bridge gets no address of the machine's
(neither IPv4 nor an IPv6 link-local one) and no NAT, and no namespace has a route out. In
loopback mode, :class:`JobLoopback` is one namespace for all the job's hosts holding only
``lo``: each host keeps its own 127.a.b.k address there, and that loopback is the job's alone.

Setup is on every job's start path, so it is batched: one ``ip -batch`` for the machine's
side, one per namespace, one ``nft -f`` and one small shell per namespace for its sysctls,
the last three running at once.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import ipaddress
import logging
import os
import re
import shutil
import socket
import struct
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainport import tags
from trainport.errors import SandboxError, ValidationError

__all__ = [
    "HostNetwork",
    "JobLoopback",
    "NamespaceHost",
    "NetworkMode",
    "choose_network",
    "firewall_problem",
    "keep_in_order",
    "netns_problem",
    "network_tag",
    "parse_bandwidth",
    "remove_left",
    "set_congestion_control",
]

log = logging.getLogger(__name__)

_RATE = re.compile(r"^\d+(\.\d+)?(kbit|mbit|gbit)$")


def parse_bandwidth(value: str) -> str:
    """A tc rate such as ``100mbit``; a clear error for anything else."""
    rate = value.strip().lower()
    if not _RATE.match(rate):
        raise ValidationError(
            f"trainport:host-bandwidth={value!r}: write a rate such as 100mbit, 1gbit or 500kbit"
        )
    return rate


@tags.parser("trainport:host-bandwidth")
def _check_bandwidth_tag(value: str, others: Mapping[str, str]) -> None:
    parse_bandwidth(value)
    if others.get("trainport:network") != "namespaces":
        raise ValidationError(
            "Tags: trainport:host-bandwidth needs trainport:network=namespaces "
            "(loopback traffic cannot be shaped per host)"
        )


def netns_problem() -> str | None:
    """Why network namespaces for a job's hosts cannot be made here, or None. (Asked on
    every job's start: it starts no process.)"""
    if os.geteuid() != 0:
        return "network namespaces for hosts need root"
    if not shutil.which("ip"):
        return "'ip' (iproute2) is not installed"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    return None


def firewall_problem() -> str | None:
    """Why the rules that keep a job's bridge apart cannot be made here, or None."""
    return None if shutil.which("nft") else "nft (the Debian package nftables) is not installed"


class NetworkMode(enum.Enum):
    """How a job's hosts are networked on this machine."""

    BRIDGE = "bridge"  # each host a namespace on the job's own bridge (HostNetwork)
    LOOPBACK = "loopback"  # an isolated job: one namespace holding only lo (JobLoopback)
    MACHINE = "machine"  # the machine's network, each host at a loopback address of its own


def choose_network(
    *,
    runner: str,
    tag: str | None,
    isolated: bool,
    netns: str | None,
    firewall: str | None,
    docker: bool,
) -> tuple[NetworkMode, str | None]:
    """The network a job's hosts get, and why it is not a bridge of their own (None when
    it is, or when that needs no saying). ``tag`` is ``trainport:network``; ``netns`` and
    ``firewall`` are :func:`netns_problem` and :func:`firewall_problem`; ``docker``: the
    job's image runs in docker, which cannot join a namespace of trainport's."""
    if runner == "ray":
        return NetworkMode.MACHINE, None  # each host has a node and a network of its own
    if tag == "namespaces":
        return NetworkMode.BRIDGE, None
    why = (
        netns
        or ("the job asked for it (trainport:network=loopback)" if tag == "loopback" else None)
        or ("docker cannot join a network namespace of trainport's" if docker else None)
        or firewall
    )
    if why is None:
        return NetworkMode.BRIDGE, None
    if isolated and netns is None:
        # An isolated job's hosts still get a network that holds only them.
        return NetworkMode.LOOPBACK, why
    return NetworkMode.MACHINE, why


@dataclass(frozen=True)
class NamespaceHost:
    host: str
    namespace: str
    address: str

    @property
    def k(self) -> int:
        """The host's number: k of algo-k."""
        return int(self.host.rsplit("-", 1)[1])


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def start_fed(argv: list[str], lines: list[str] | tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """``argv`` started with ``lines`` on its standard input (a few KiB at most: it is
    written whole before anything is read back)."""
    popen = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if popen.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write("".join(f"{line}\n" for line in lines))
            popen.stdin.close()
    return popen


def finish(popen: subprocess.Popen[str]) -> tuple[int, str]:
    """Wait for a started process: (exit code, its standard error)."""
    # No timeout: one makes the wait poll in sleeps, milliseconds on each call, and these
    # commands only talk to the kernel.
    err = popen.stderr.read() if popen.stderr is not None else ""
    if popen.stderr is not None:
        popen.stderr.close()
    return popen.wait(), err.strip()


def batch(argv: list[str], lines: list[str]) -> None:
    """``lines`` run by one ``ip -batch``/``nft -f`` process (``argv``); an error naming
    the command that failed if one did."""
    code, err = finish(start_fed(argv, lines))
    if code != 0:
        raise SandboxError(f"{' '.join(argv)} failed: {err}")


def _run_in(netns: str | None, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run inside ``netns`` (the root namespace if None)."""
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _tbf(dev: str, *, rate: str, netns: str | None = None) -> None:
    # The bucket must hold at least one timer tick's worth of bytes at this rate or tbf
    # cannot reach the rate; 256 KiB covers several Gbit/s.
    argv = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate]
    argv += ["burst", "256kb", "latency", "50ms"]
    done = _run_in(netns, argv)
    if done.returncode != 0:
        raise SandboxError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def _rps_mask(cpu: int) -> str:
    return f"{1 << (cpu % (os.cpu_count() or 1)):x}"


def keep_in_order(dev: str, cpu: int, *, netns: str | None = None) -> str | None:
    """Steer ``dev``'s received packets to CPU ``cpu`` (modulo the CPU count); why not, if
    it cannot."""
    # A veth delivers each packet to the backlog of the CPU that transmitted it, and a
    # shaped link transmits some packets from tbf's timer on another CPU, so one flow's
    # packets overtake each other (spurious fast retransmits, smaller windows: stalls in
    # collectives). Steering the device's receive work to one CPU (RPS) keeps every flow
    # in order, as a NIC's receive queue does. Kernels without RPS lack the file.
    mask = _rps_mask(cpu)
    path = f"/sys/class/net/{dev}/queues/rx-0/rps_cpus"
    if netns is None:
        try:
            Path(path).write_text(mask)
        except OSError as exc:
            return str(exc)
        return None
    done = _run_in(netns, ["sh", "-c", f"echo {mask} > {path}"])
    return None if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"


# Linux's own default. Some machines (this project's VMs among them) default to bbr, under
# which gloo's per-peer connections, idle between buckets, stalled for 30-170 ms several
# times per step on shaped links (docs/benchmarks.md); emulated hosts should behave like
# ordinary cluster hosts.
CONGESTION_CONTROL = "cubic"


def set_congestion_control(netns: str, algorithm: str = CONGESTION_CONTROL) -> str | None:
    """Make ``algorithm`` TCP's default in ``netns``; why not, if it cannot."""
    key = "net.ipv4.tcp_congestion_control"
    done = _run_in(netns, ["sysctl", "-qw", f"{key}={algorithm}"])
    return None if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"


def network_tag(job: str, supervisor_pid: int) -> str:
    """What names a job's namespaces and bridge: the supervisor's pid too, since a job name
    may come back (a rerun) while the last teardown finishes."""
    return hashlib.sha256(f"{job}:{supervisor_pid}".encode()).hexdigest()[:6]


# trainport's one nftables table. Each running job's bridge is an element of ``own``
# (traffic between its own hosts: br_netfilter, where loaded, shows bridged packets to the
# forward chain as going from the bridge to itself) and, unless the job is isolated, of
# ``routed`` (forwarded out to the machine's other interfaces and masqueraded). The sets'
# names carry the rules' version: change the rules, bump it (keeping the chains' names),
# and the first job after an upgrade writes the new rules over the old.
TABLE = "inet trainport"
_OWN, _ROUTED, NODES_SET = "own_v2", "routed_v2", "nodes_v2"
# Where clouds hand out the machine's own credentials (the instance metadata service, the
# container credentials endpoint): a job gets its role's credentials from trainport, never
# the machine's.
_CREDENTIAL_SERVICES = "{ 169.254.169.254, 169.254.170.2 }"
RULES = (
    f"add table {TABLE}",
    f"add set {TABLE} {_ROUTED} {{ type ifname; }}",
    f"add set {TABLE} {_OWN} {{ type ifname . ifname; }}",
    # The addresses of a Ray cluster's nodes (see runners.overlay): Ray's own services
    # listen there, and a job that reached them could run code on every node.
    f"add set {TABLE} {NODES_SET} {{ type ipv4_addr; }}",
    f"add chain {TABLE} input {{ type filter hook input priority filter; policy accept; }}",
    f"add chain {TABLE} forward {{ type filter hook forward priority filter; policy accept; }}",
    f"add chain {TABLE} postrouting "
    "{ type nat hook postrouting priority srcnat; policy accept; }",
    # Written whole, in one transaction with the job's elements: no moment without the
    # rules for the jobs already running.
    f"flush chain {TABLE} input",
    f"flush chain {TABLE} forward",
    f"flush chain {TABLE} postrouting",
    # Nothing of the machine answers a job (its gateway address neither, where whatever
    # listens on 0.0.0.0 would), bar replies to connections the machine opened.
    f'add rule {TABLE} input iifname "tpb*" ct state established,related accept',
    f'add rule {TABLE} input iifname "tpb*" drop',
    f"add rule {TABLE} forward iifname . oifname @{_OWN} accept",
    f'add rule {TABLE} forward iifname "tpb*" oifname "tpb*" drop',
    # A port the machine forwards elsewhere (DNAT) is one of the machine's services too.
    f'add rule {TABLE} forward iifname "tpb*" ct status dnat drop',
    f'add rule {TABLE} forward iifname "tpb*" ip daddr @{NODES_SET} drop',
    f'add rule {TABLE} forward iifname "tpb*" ip daddr {_CREDENTIAL_SERVICES} drop',
    f"add rule {TABLE} forward iifname @{_ROUTED} accept",
    f'add rule {TABLE} forward oifname "tpb*" ct state established,related accept',
    f'add rule {TABLE} forward iifname "tpb*" drop',
    f'add rule {TABLE} forward oifname "tpb*" drop',
    f'add rule {TABLE} postrouting iifname @{_ROUTED} oifname != "tpb*" masquerade',
)


def _elements(bridge: str) -> tuple[str, str]:
    return (
        f'element {TABLE} {_OWN} {{ "{bridge}" . "{bridge}" }}',
        f'element {TABLE} {_ROUTED} {{ "{bridge}" }}',
    )


def bridge_elements(bridge: str, routed: bool) -> list[str]:
    own, out = _elements(bridge)
    return [f"add {own}", *([f"add {out}"] if routed else [])]


def remove_network(tag: str, namespaces: list[str], links: tuple[str, ...] = ()) -> None:
    """Remove a job's namespaces, bridge (and ``links``) and set elements; what is already
    gone is skipped."""
    lines = [f"netns del {ns}" for ns in namespaces] + [f"link del tpb{tag}"]
    lines += [f"link del {link}" for link in links]
    ip = start_fed(["ip", "-force", "-batch", "-"], lines)
    nft = None
    if shutil.which("nft"):
        # Adding an element that is there does nothing, so add-then-delete removes it
        # whether or not it was there, in one transaction.
        elements = _elements(f"tpb{tag}")
        script = [f"add {e}" for e in elements] + [f"delete {e}" for e in elements]
        nft = start_fed(["nft", "-f", "-"], script)
    _, err = finish(ip)
    if err:
        log.debug("removing the network of %s: %s", tag, err)
    if nft is not None and (done := finish(nft))[0] != 0:  # no table: nothing to remove
        log.debug("removing the firewall elements of %s: %s", tag, done[1])


def remove_left(job: str, supervisor_pid: int) -> list[str]:
    """Remove the namespaces, bridge and firewall elements that a dead supervisor of
    ``job`` made (it removes them itself when it ends); the names removed."""
    if os.geteuid() != 0:
        return []
    tag = network_tag(job, supervisor_pid)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in listed.splitlines() if line.startswith(f"tp-{tag}-")]
    bridge = f"tpb{tag}"
    had_bridge = Path("/sys/class/net", bridge).exists()
    if left or had_bridge:
        remove_network(tag, left)
    return [*left, *([bridge] if had_bridge else [])]


def routed_prefixes() -> list[ipaddress.IPv4Network]:
    """The IPv4 prefixes the machine has a route for, its default route aside."""
    try:
        rows = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return []
    found = []
    for row in rows:
        fields = row.split()
        if len(fields) < 8:
            continue
        # Addresses as the kernel holds them (network order), printed as native integers.
        dest, mask = (socket.inet_ntoa(struct.pack("=I", int(f, 16))) for f in fields[1:8:6])
        if mask != "0.0.0.0":
            found.append(ipaddress.IPv4Network(f"{dest}/{mask}", strict=False))
    return found


def free_subnet(digest: int, taken: list[ipaddress.IPv4Network] | None = None) -> str:
    """A 10.a.b.0/24 for a job's hosts that no route of the machine's overlaps (another
    job's bridge, a network the machine is on), chosen from ``digest``; ``taken``: the
    prefixes to avoid instead of this machine's routes (another machine's)."""
    if taken is None:
        taken = routed_prefixes()
    tries = [f"10.{100 + (digest + i) % 150}.{((digest >> 8) + i) % 256}" for i in range(64)]
    for prefix in tries:
        if not any(ipaddress.IPv4Network(f"{prefix}.0/24").overlaps(t) for t in taken):
            return prefix
    return tries[0]  # 64 taken in a row: not met in practice


def resolver_problem(resolv_conf: Path = Path("/etc/resolv.conf")) -> str | None:
    """Why a job's hosts cannot use this machine's DNS resolver, if they cannot."""
    try:
        text = resolv_conf.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        words = line.split()
        if len(words) < 2 or words[0] != "nameserver":
            continue
        try:
            loopback = ipaddress.ip_address(words[1].split("%")[0]).is_loopback
        except ValueError:
            continue
        if loopback:
            return (
                f"{resolv_conf} names the resolver {words[1]}, a loopback address of this "
                "machine's that a job's hosts cannot reach, so names outside the job do not "
                "resolve in it; name a resolver on the network there (systemd-resolved keeps "
                "its upstream servers in /run/systemd/resolve/resolv.conf)"
            )
    return None


def inside_settings(cpu: int | None) -> str:
    """A shell script that makes a namespace's own settings, printing the path of each
    it could not make. Unprivileged ports from 0: the job runs as an unprivileged user and
    binds low ports as it could on SageMaker. For a host on a bridge (its CPU given), TCP
    congestion control (see CONGESTION_CONTROL) and RPS on its eth0 (see keep_in_order)."""
    settings = {"/proc/sys/net/ipv4/ip_unprivileged_port_start": "0"}
    if cpu is not None:
        settings["/proc/sys/net/ipv4/tcp_congestion_control"] = CONGESTION_CONTROL
        settings["/sys/class/net/eth0/queues/rx-0/rps_cpus"] = _rps_mask(cpu)
    writes = "".join(f"w {path} {value}; " for path, value in settings.items())
    return 'w() { { echo "$2" > "$1"; } 2> /dev/null || echo "$1" >&2; }; ' + writes


class HostNetwork:
    """Bridge, namespaces, veth pairs and firewall elements for one job's hosts."""

    def __init__(
        self,
        job: str,
        hosts: tuple[str, ...],
        bandwidth: str | None = None,
        *,
        isolated: bool = False,
    ) -> None:
        if os.geteuid() != 0:
            raise SandboxError("network namespaces for hosts need root")
        tag = network_tag(job, os.getpid())
        self.bridge = f"tpb{tag}"
        self.subnet = free_subnet(int(tag, 16))
        self.hosts = {
            h: NamespaceHost(h, f"tp-{tag}-{k}", f"{self.subnet}.{k + 1}")
            for k, h in ((int(h.rsplit("-", 1)[1]), h) for h in hosts)
        }
        self.tag = tag
        self.bandwidth = bandwidth
        self.isolated = isolated
        self._made = False
        self._running: list[subprocess.Popen[str]] = []  # started by setup, not yet waited for

    def __enter__(self) -> HostNetwork:
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _setup(self) -> None:
        routed = not self.isolated
        firewall = firewall_problem()
        if routed and firewall:
            raise SandboxError(f"a job's hosts reach the outside through NAT, but {firewall}")
        self._made = True
        # The job's elements first, meanwhile: the rules match interfaces by name.
        mine = bridge_elements(self.bridge, routed)
        nft = self._start(["nft", "-f", "-"], mine) if firewall is None else None
        gateway = f"{self.subnet}.1"
        # No IPv6 address of the machine's on the bridge or its ports, and for an isolated
        # job no IPv4 one either: a host could reach the machine through it.
        machine = [
            f"link add {self.bridge} type bridge",
            f"link set {self.bridge} addrgenmode none",
        ]
        if routed:
            machine.append(f"addr add {gateway}/24 dev {self.bridge}")
        machine.append(f"link set {self.bridge} up")
        for nh in self.hosts.values():
            outside = self._outside(nh)
            machine += [
                f"netns add {nh.namespace}",
                f"link add {outside} type veth peer name eth0 netns {nh.namespace}",
                f"link set {outside} addrgenmode none master {self.bridge} up",
            ]
        batch(["ip", "-batch", "-"], machine)
        inside = []
        for nh in self.hosts.values():
            lines = ["link set lo up", f"addr add {nh.address}/24 dev eth0", "link set eth0 up"]
            if routed:
                lines.append(f"route add default via {gateway}")
            inside.append(self._start(["ip", "-n", nh.namespace, "-batch", "-"], lines))
        settings = [
            self._start(["ip", "netns", "exec", nh.namespace, "sh", "-c", inside_settings(nh.k)])
            for nh in self.hosts.values()
        ]
        if routed:
            forward_ipv4()
        for nh in self.hosts.values():
            if problem := keep_in_order(self._outside(nh), nh.k):  # best effort
                log.debug("could not steer %s to one CPU: %s", self._outside(nh), problem)
        failed = [err for code, err in map(finish, inside) if code != 0]
        if failed:
            raise SandboxError(f"ip -n NAMESPACE -batch failed: {'; '.join(failed)}")
        refused = {path for popen in settings for path in finish(popen)[1].split()}
        if nft is not None and finish(nft)[0] != 0:
            # No table yet, or one of other rules: all of it, in one transaction.
            batch(["nft", "-f", "-"], [*RULES, *mine])
        if self.bandwidth:
            for nh in self.hosts.values():
                _tbf(self._outside(nh), rate=self.bandwidth)  # traffic into the host
                _tbf("eth0", rate=self.bandwidth, netns=nh.namespace)  # traffic out of it
        self._say(refused)
        log.info(
            "hosts on bridge %s (%s.0/24, %s): %s",
            self.bridge,
            self.subnet,
            "isolated" if self.isolated else f"NAT via {gateway}",
            self.hosts,
        )

    def _start(self, argv: list[str], lines: list[str] | None = None) -> subprocess.Popen[str]:
        popen = start_fed(argv, lines or [])
        self._running.append(popen)
        return popen

    def _outside(self, nh: NamespaceHost) -> str:
        return f"tpv{self.tag}{nh.k}"

    def _say(self, refused: set[str]) -> None:
        if any(p.endswith("tcp_congestion_control") for p in refused):
            # A namespace may only choose an algorithm on the root's allowed list.
            log.warning(
                "the hosts keep this machine's TCP congestion control, not %s; to allow "
                'it: sysctl -w net.ipv4.tcp_allowed_congestion_control="$(sysctl -n '
                'net.ipv4.tcp_allowed_congestion_control) %s"',
                CONGESTION_CONTROL,
                CONGESTION_CONTROL,
            )
        if any(p.endswith("ip_unprivileged_port_start") for p in refused):
            log.info("the hosts' ports below 1024 stay privileged (this kernel cannot say)")
        if any(p.endswith("rps_cpus") for p in refused):
            log.debug("could not steer the hosts' eth0 to one CPU each")
        if not self.isolated and (problem := resolver_problem()):
            log.warning("DNS in the job's hosts: %s", problem)

    def teardown(self) -> None:
        if not self._made:
            return
        self._made = False
        for popen in self._running:  # a setup that failed halfway: nothing runs after this
            if popen.poll() is None:
                finish(popen)
        self._running.clear()
        remove_network(self.tag, [nh.namespace for nh in self.hosts.values()])

    def wrap(self, host: str, argv: tuple[str, ...]) -> tuple[str, ...]:
        """``argv`` run inside ``host``'s namespace."""
        return ("ip", "netns", "exec", self.hosts[host].namespace, *argv)


def forward_ipv4() -> None:
    """Turn on IPv4 forwarding, which NAT for the hosts needs (left on: other jobs, or
    the machine's own containers, may need it too)."""
    path = Path("/proc/sys/net/ipv4/ip_forward")
    try:
        if path.read_text().strip() != "1":
            path.write_text("1\n")
            log.info("turned on IPv4 forwarding (net.ipv4.ip_forward=1) for the jobs' NAT")
    except OSError as exc:
        raise SandboxError(f"cannot turn on IPv4 forwarding for the hosts' NAT: {exc}") from exc


class JobLoopback:
    """One network namespace for all of a network-isolated job's hosts, holding only its
    own loopback: every 127.a.b.k address of the job's hosts is local there, so the hosts
    reach each other and nothing else (not even the machine's own 127.0.0.1)."""

    def __init__(self, job: str) -> None:
        problem = netns_problem()
        if problem:
            raise SandboxError(problem)
        self.namespace = f"tp-{network_tag(job, os.getpid())}-lo"

    def __enter__(self) -> JobLoopback:
        try:
            _ip("netns", "add", self.namespace)
            _ip("-n", self.namespace, "link", "set", "lo", "up")
            settings = ["ip", "netns", "exec", self.namespace, "sh", "-c", inside_settings(None)]
            if refused := finish(start_fed(settings))[1]:  # best effort
                log.info("the hosts' ports below 1024 stay privileged: %s", refused)
        except BaseException:
            self.teardown()
            raise
        log.info("network-isolated hosts in namespace %s (loopback only)", self.namespace)
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def teardown(self) -> None:
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
