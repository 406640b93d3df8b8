"""Network-namespace hosts: each host of a job gets its own network stack on a bridge.

With ``trainport:network=namespaces`` (root only) every host ``algo-k`` runs inside a
network namespace whose ``eth0`` (a veth pair) sits on a per-job bridge, at
``10.<a>.<b>.(k+1)/24``. Traffic between hosts then crosses real interfaces, so each host's
bandwidth can be shaped with ``tc tbf`` (``trainport:host-bandwidth``, e.g. ``400mbit``,
applied in both directions of each host's link). The namespaces and the bridge are removed
when the job ends.

EnableNetworkIsolation: the hosts must still reach each other (distributed training) and
nothing else. On the bridge, an isolated job's bridge gets no address of the machine's
(neither IPv4 nor an IPv6 link-local one), so nothing on this machine is reachable from a
host, and no namespace has a route out. In loopback mode, :class:`JobLoopback` is one
namespace for all the job's hosts holding only ``lo``: each host keeps its own 127.a.b.k
address there, and that loopback is the job's alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
from dataclasses import dataclass

from trainport.errors import SandboxError, ValidationError

__all__ = [
    "HostNetwork",
    "JobLoopback",
    "NamespaceHost",
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


def netns_problem() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces for hosts need root"
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"'ip netns' does not work here: {exc}"
    return None


@dataclass(frozen=True)
class NamespaceHost:
    host: str
    namespace: str
    address: str


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


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


def keep_in_order(dev: str, cpu: int, *, netns: str | None = None) -> str | None:
    """Steer ``dev``'s received packets to CPU ``cpu`` (modulo the CPU count); why not, if
    it cannot."""
    # A veth delivers each packet to the backlog of the CPU that transmitted it, and a
    # shaped link transmits some packets from tbf's timer on another CPU, so one flow's
    # packets overtake each other (spurious fast retransmits, smaller windows: stalls in
    # collectives). Steering the device's receive work to one CPU (RPS) keeps every flow
    # in order, as a NIC's receive queue does. Kernels without RPS lack the file.
    mask = f"{1 << (cpu % (os.cpu_count() or 1)):x}"
    path = f"/sys/class/net/{dev}/queues/rx-0/rps_cpus"
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


def remove_left(job: str, supervisor_pid: int) -> list[str]:
    """Remove the namespaces and bridge that a dead supervisor of ``job`` made (it tears
    them down itself when it ends); the names removed."""
    if netns_problem():
        return []
    tag = network_tag(job, supervisor_pid)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [line.split()[0] for line in listed.splitlines() if line.startswith(f"tp-{tag}-")]
    for namespace in left:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    bridge = f"tpb{tag}"
    if subprocess.run(["ip", "link", "del", bridge], capture_output=True).returncode == 0:
        left.append(bridge)
    return left


class HostNetwork:
    """Bridge, namespaces and veth pairs for one job's hosts."""

    def __init__(
        self,
        job: str,
        hosts: tuple[str, ...],
        bandwidth: str | None = None,
        *,
        isolated: bool = False,
    ) -> None:
        problem = netns_problem()
        if problem:
            raise SandboxError(problem)
        tag = network_tag(job, os.getpid())
        self.bridge = f"tpb{tag}"
        digest = int(tag, 16)
        self.subnet = f"10.{100 + digest % 150}.{(digest >> 8) % 256}"
        self.hosts = {
            h: NamespaceHost(h, f"tp-{tag}-{k}", f"{self.subnet}.{k + 1}")
            for k, h in ((int(h.rsplit("-", 1)[1]), h) for h in hosts)
        }
        self.tag = tag
        self.bandwidth = bandwidth
        self.isolated = isolated

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
        _ip("link", "add", self.bridge, "type", "bridge")
        if self.isolated:
            # No address of the machine's on the bridge: a host could otherwise reach every
            # service that listens on all of the machine's addresses through it.
            _ip("link", "set", self.bridge, "addrgenmode", "none")
        else:
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        refused = None
        for nh in self.hosts.values():
            k = nh.namespace.rsplit("-", 1)[1]
            outside = f"tpv{self.tag}{k}"
            _ip("netns", "add", nh.namespace)
            _ip(
                "link",
                "add",
                outside,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                nh.namespace,
            )
            _ip("link", "set", outside, "master", self.bridge)
            if self.isolated:
                _ip("link", "set", outside, "addrgenmode", "none")
            _ip("link", "set", outside, "up")
            _ip("-n", nh.namespace, "addr", "add", f"{nh.address}/24", "dev", "eth0")
            _ip("-n", nh.namespace, "link", "set", "eth0", "up")
            _ip("-n", nh.namespace, "link", "set", "lo", "up")
            refused = set_congestion_control(nh.namespace) or refused
            for dev, inside in ((outside, None), ("eth0", nh.namespace)):
                if problem := keep_in_order(dev, int(k), netns=inside):  # best effort
                    log.debug("could not steer %s to one CPU: %s", dev, problem)
            if self.bandwidth:
                _tbf(outside, rate=self.bandwidth)  # traffic into the host
                _tbf("eth0", rate=self.bandwidth, netns=nh.namespace)  # traffic out of it
        if refused:
            # A namespace may only choose an algorithm on the root's allowed list.
            log.warning(
                "the hosts keep this machine's TCP congestion control, not %s (%s); to allow "
                'it: sysctl -w net.ipv4.tcp_allowed_congestion_control="$(sysctl -n '
                'net.ipv4.tcp_allowed_congestion_control) %s"',
                CONGESTION_CONTROL,
                refused,
                CONGESTION_CONTROL,
            )
        log.info("hosts on bridge %s (%s.0/24): %s", self.bridge, self.subnet, self.hosts)

    def teardown(self) -> None:
        for nh in self.hosts.values():
            subprocess.run(["ip", "netns", "del", nh.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def wrap(self, host: str, argv: tuple[str, ...]) -> tuple[str, ...]:
        """``argv`` run inside ``host``'s namespace."""
        return ("ip", "netns", "exec", self.hosts[host].namespace, *argv)


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
        except BaseException:
            self.teardown()
            raise
        log.info("network-isolated hosts in namespace %s (loopback only)", self.namespace)
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def teardown(self) -> None:
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
