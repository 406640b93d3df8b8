"""A job's own network across the nodes of a Ray cluster.

On a cluster a job's hosts sit on different nodes, and hosts of different jobs share nodes.
Each host gets what a host gets on one machine (see :mod:`trainport.runners.netns`): a
network namespace on its node whose ``eth0`` is a port of a bridge of the host's own, NAT
out through the node unless the job is network-isolated. On each node a VXLAN device (the
job run's own VNI, UDP port :data:`OVERLAY_PORT` between nodes) is a port of that bridge
too, and together the job's bridges make one layer-2 network: algo-k is ``10.a.b.(k+1)``
for all of the job's hosts, whatever node each is on, and port 7777 is theirs. A host's
default gateway is its own node's bridge, at ``10.a.b.(128+k)``, so each host leaves
through its own node.

What keeps jobs apart is the node's ``inet trainport`` table, as on one machine: bridges
do not forward to each other and nothing of the node answers a bridge. On a cluster "the
machine" is every node: the cluster's node addresses are an nftables set that a job's
traffic may not reach (Ray's head and raylets listen there, and whoever reaches them can
run code on every node). The VXLAN traffic itself is the nodes' own, sent and received by
their kernels.

The decision is :func:`plan_overlay`, a pure function of what each node reported
(:class:`NodeNetwork`); :class:`OverlayHost` makes one host's side on its node.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from trainport.runners import netns
from trainport.runners.api import pid_alive

__all__ = [
    "OVERLAY_PORT",
    "NodeNetwork",
    "Overlay",
    "OverlayHost",
    "node_network",
    "plan_overlay",
    "remove_left_overlays",
]

log = logging.getLogger(__name__)

# VXLAN's registered port. Nodes must let UDP to it through from each other.
OVERLAY_PORT = 4789
# Outer IPv4, UDP and VXLAN headers and the inner Ethernet header.
_VXLAN_OVERHEAD = 50
# Hosts are .2 to .127 of the job's /24, their nodes' gateways .129 to .254.
MAX_HOSTS = 126
_NAMESPACE_PREFIX = "tpo-"


@dataclass(frozen=True)
class NodeNetwork:
    """What a node says of its network, for the job's choice."""

    address: str  # the node's address, where the other nodes send its VXLAN traffic
    mtu: int  # the MTU of the interface holding ``address``
    routes: tuple[str, ...]  # the IPv4 prefixes the node has routes for
    problem: str | None  # why the node cannot give a host a network of its own


@dataclass(frozen=True)
class Overlay:
    """A job's network across nodes: the same for every host of the job."""

    subnet: str  # "10.a.b"
    vni: int
    nodes: dict[str, str]  # host -> its node's address
    mtu: int
    isolated: bool
    cluster: tuple[str, ...]  # every node address of the cluster, which jobs never reach

    def address(self, host: str) -> str:
        return f"{self.subnet}.{_k(host) + 1}"

    def gateway(self, host: str) -> str:
        """The address of ``host``'s own node on the job's network."""
        return f"{self.subnet}.{128 + _k(host)}"

    def addresses(self) -> dict[str, str]:
        return {h: self.address(h) for h in self.nodes}


def _k(host: str) -> int:
    return int(host.rsplit("-", 1)[1])


def plan_overlay(
    run: str, nodes: dict[str, NodeNetwork], *, isolated: bool, cluster: tuple[str, ...]
) -> Overlay | str:
    """The overlay for one run of a job whose hosts landed on ``nodes`` (host -> what its
    node said), or why there can be none. ``run`` names this run (a retry is another):
    the VNI and the subnet come from it."""
    problems = {h: n for h, n in nodes.items() if n.problem}
    if problems:
        return "; ".join(
            f"host {h}'s node {n.address} cannot give it a network of its own ({n.problem})"
            for h, n in sorted(problems.items())
        )
    if len(nodes) > MAX_HOSTS:
        return f"a job network holds at most {MAX_HOSTS} hosts, and the job has {len(nodes)}"
    digest = int.from_bytes(hashlib.sha256(run.encode()).digest()[:8], "big")
    taken = [ipaddress.IPv4Network(r, strict=False) for n in nodes.values() for r in n.routes]
    return Overlay(
        subnet=netns.free_subnet(digest, taken),
        vni=1 + digest % ((1 << 24) - 1),
        nodes={h: n.address for h, n in nodes.items()},
        mtu=min(n.mtu for n in nodes.values()) - _VXLAN_OVERHEAD,
        isolated=isolated,
        # The firewall's set holds IPv4 addresses (job networks are IPv4 only: a job has no
        # IPv6 route to reach a node by).
        cluster=tuple(a for a in cluster if _is_ipv4(a)),
    )


def _is_ipv4(address: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(address), ipaddress.IPv4Address)
    except ValueError:
        return False


def node_network(address: str) -> NodeNetwork:
    """What this node says of its network (see :class:`NodeNetwork`)."""
    mtu, interface = _underlay(address)
    problem = netns.netns_problem() or netns.firewall_problem()
    if problem is None and interface is None:
        problem = f"no interface of this node holds its address {address}"
    if problem is None and not shutil.which("bridge"):
        problem = "'bridge' (iproute2) is not installed"
    if problem is None:
        problem = _vxlan_problem(address)
    routes = tuple(str(p) for p in netns.routed_prefixes())
    return NodeNetwork(address, mtu, routes, problem)


def _underlay(address: str) -> tuple[int, str | None]:
    """The MTU and name of the interface holding ``address`` (1500, None if none does)."""
    try:
        listed = subprocess.run(
            ["ip", "-o", "addr", "show", "to", address], capture_output=True, text=True
        ).stdout
        name = listed.split()[1] if listed.split() else None
        if name is None:
            return 1500, None
        shown = subprocess.run(
            ["ip", "-o", "link", "show", "dev", name], capture_output=True, text=True
        ).stdout.split()
        return int(shown[shown.index("mtu") + 1]), name
    except (OSError, ValueError, IndexError):
        return 1500, None


def _vxlan_problem(address: str) -> str | None:
    """Why this kernel cannot make a VXLAN device, if it cannot (tried on a device that
    is removed at once)."""
    name = f"tpx{os.getpid() % 1000000}"
    argv = ["ip", "link", "add", name, "type", "vxlan", "id", "1", "local", address]
    done = subprocess.run([*argv, "dstport", "0"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"this kernel makes no VXLAN device: {done.stderr.strip()}"
    subprocess.run(["ip", "link", "del", name], capture_output=True)
    return None


class OverlayHost:
    """One host's side of a job's overlay, on its node: namespace, bridge, veth pair, VXLAN
    device, firewall elements."""

    def __init__(self, overlay: Overlay, host: str) -> None:
        self.overlay = overlay
        self.host = host
        pid = os.getpid()
        tag = netns.network_tag(f"{overlay.vni}:{host}", pid)
        self.tag = tag
        # The pid in the name: a namespace whose maker died is known as left over.
        self.namespace = f"{_NAMESPACE_PREFIX}{pid}-{tag}"
        self.bridge = f"tpb{tag}"
        self._veth = f"tpv{tag}"
        self._vxlan = f"tpx{tag}"
        self._made = False

    @property
    def address(self) -> str:
        return self.overlay.address(self.host)

    def __enter__(self) -> OverlayHost:
        remove_left_overlays()
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _setup(self) -> None:
        o = self.overlay
        routed = not o.isolated
        self._made = True
        mine = netns.bridge_elements(self.bridge, routed)
        if o.cluster:
            mine.append(f"add element {netns.TABLE} {netns.NODES_SET} {{ {', '.join(o.cluster)} }}")
        nft = netns.start_fed(["nft", "-f", "-"], mine)
        gateway = o.gateway(self.host)
        node = [
            f"link add {self.bridge} type bridge",
            f"link set {self.bridge} addrgenmode none mtu {o.mtu}",
            *([f"addr add {gateway}/24 dev {self.bridge}"] if routed else []),
            f"link set {self.bridge} up",
            f"netns add {self.namespace}",
            f"link add {self._veth} type veth peer name eth0 netns {self.namespace}",
            f"link set {self._veth} mtu {o.mtu} addrgenmode none master {self.bridge} up",
            f"link add {self._vxlan} type vxlan id {o.vni} local {o.nodes[self.host]} "
            f"dstport {OVERLAY_PORT}",
            f"link set {self._vxlan} mtu {o.mtu} addrgenmode none master {self.bridge} up",
        ]
        netns.batch(["ip", "-batch", "-"], node)
        # Broadcasts (ARP) go to every other node of the job; the device learns where each
        # host's MAC is from what arrives, and sends unicast there alone.
        peers = sorted({a for h, a in o.nodes.items() if h != self.host})
        if peers:
            fdb = [f"fdb append 00:00:00:00:00:00 dev {self._vxlan} dst {a}" for a in peers]
            netns.batch(["bridge", "-batch", "-"], fdb)
        inside = ["link set lo up", f"link set eth0 mtu {o.mtu}"]
        inside += [f"addr add {self.address}/24 dev eth0", "link set eth0 up"]
        if routed:
            inside.append(f"route add default via {gateway}")
        netns.batch(["ip", "-n", self.namespace, "-batch", "-"], inside)
        settings = ["ip", "netns", "exec", self.namespace, "sh", "-c"]
        refused = netns.finish(netns.start_fed([*settings, netns.inside_settings(_k(self.host))]))
        if routed:
            netns.forward_ipv4()
        if netns.finish(nft)[0] != 0:
            # No table yet, or one of older rules: all of it, in one transaction.
            netns.batch(["nft", "-f", "-"], [*netns.RULES, *mine])
        if refused[1]:
            log.debug("settings not made in %s: %s", self.namespace, refused[1])
        log.info(
            "host %s at %s on job network %s.0/24 (VNI %d, %s), bridge %s",
            self.host,
            self.address,
            o.subnet,
            o.vni,
            "isolated" if o.isolated else f"NAT via {gateway}",
            self.bridge,
        )

    def teardown(self) -> None:
        if not self._made:
            return
        self._made = False
        netns.remove_network(self.tag, [self.namespace], (self._vxlan,))


def remove_left_overlays() -> list[str]:
    """Remove the overlay namespaces (and this node's bridge and VXLAN device of each) whose
    maker died without removing them (a Ray worker killed with its job's driver); the
    namespaces removed."""
    if os.geteuid() != 0:
        return []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    removed = []
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(_NAMESPACE_PREFIX):
            continue
        pid, _, tag = name[len(_NAMESPACE_PREFIX) :].partition("-")
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        netns.remove_network(tag, [name], (f"tpx{tag}",))
        removed.append(name)
    if removed:
        log.info("removed job networks left by ended workers: %s", removed)
    return removed
