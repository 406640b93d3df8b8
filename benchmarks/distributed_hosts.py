"""Hosts for the data-parallel benchmarks: loopback, or network namespaces shaped by tc.

Not a figure itself; ``distributed_comm.py`` and ``distributed_e2e.py`` import it.

With ``rate_mbit`` set (root only), every rank runs in its own network namespace with one
interface (``eth0``, 10.77.0.k/24) on a veth pair whose other end sits on a bridge in the
root namespace. A token bucket (``tc qdisc ... tbf``; netem is not available on these
kernels) caps both directions of each host's link: the namespace end shapes what the host
sends, the bridge end what it receives, so each host behaves like a full-duplex NIC of that
rate. Two settings make the namespaces behave like hosts on a real network:

- TCP uses ``congestion_control`` (default ``cubic``, Linux's own default). This VM's
  kernel defaults to ``bbr``, under which gloo's per-peer connections, idle between
  buckets, stalled for 30-170 ms two or three times per step at N = 4 (docs/benchmarks.md).
- Each veth end steers its received packets to one CPU (RPS), so a flow stays in order as
  it would through a NIC's receive queue (see ``_create``).

Namespaces and the bridge are removed on exit, on error and on SIGTERM/SIGINT, and any
left over from an earlier crashed run are removed before starting.

Ranks are started as torchrun would start them (its variables, via
``trainport.distributed.torchrun_env``), each writing one JSON report that
:func:`run_ranks` returns.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from trainport.distributed import torchrun_env, torchrun_topology
from trainport.runners.netns import keep_in_order, set_congestion_control

logger = logging.getLogger("distributed_hosts")

REPO = Path(__file__).resolve().parents[1]
# Interface and namespace names start with this; set TRAINPORT_NETNS_PREFIX (at most 6
# characters) to keep two benchmark runs on one machine from removing each other's hosts as
# leftovers.
PREFIX = os.environ.get("TRAINPORT_NETNS_PREFIX", "tpdp")[:6]
SUBNET = "10.77.0"
BRIDGE = f"{PREFIX}-br"


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True)


_ALLOWED = "net.ipv4.tcp_allowed_congestion_control"


def _sysctl(key: str, value: str | None = None) -> str:
    """Read ``key`` in the root namespace, or set it to ``value``."""
    path = Path("/proc/sys") / key.replace(".", "/")
    if value is not None:
        path.write_text(value)
    return path.read_text().strip()


def _namespace(k: int) -> str:
    return f"{PREFIX}-h{k}"


def _tbf(rate_mbit: int) -> list[str]:
    # The bucket must hold at least one GSO super-packet (64 KiB) and about 2 ms of traffic;
    # a smaller one would cap the rate below the nominal one, a larger one let bursts through.
    burst = max(64 * 1024, rate_mbit * 1_000_000 // 8 // 500)
    return ["tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"]


def _root_links() -> list[str]:
    listing = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = (line.split(":")[1].strip().split("@")[0] for line in listing.splitlines())
    return [name for name in names if name.startswith(f"{PREFIX}-")]


def remove_leftovers() -> None:
    # Delete the root ends first: a namespace's interfaces vanish asynchronously after
    # `ip netns del`, and a veth name still in use would fail the next run's `ip link add`.
    for name in _root_links():
        _ip("link", "del", name, check=False)
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-h"):
            _ip("netns", "del", name, check=False)
    deadline = time.monotonic() + 10
    while _root_links() and time.monotonic() < deadline:
        time.sleep(0.1)


class Hosts:
    """``count`` hosts: all on 127.0.0.1 (``rate_mbit=None``) or one namespace each."""

    def __init__(
        self, count: int, rate_mbit: int | None, congestion_control: str = "cubic"
    ) -> None:
        self.count = count
        self.rate_mbit = rate_mbit
        self.congestion_control = congestion_control
        self._previous: dict[int, Any] = {}
        self._allowed: str | None = None  # the root's allowed list, to restore on close

    @property
    def label(self) -> str:
        return "loopback" if self.rate_mbit is None else f"{self.rate_mbit} Mbit/s"

    def address(self, k: int) -> str:
        return "127.0.0.1" if self.rate_mbit is None else f"{SUBNET}.{k + 1}"

    def interface(self) -> str:
        return "lo" if self.rate_mbit is None else "eth0"

    def wrap(self, k: int, argv: list[str]) -> list[str]:
        if self.rate_mbit is None:
            return argv
        return ["ip", "netns", "exec", _namespace(k), *argv]

    def __enter__(self) -> Hosts:
        if self.rate_mbit is None:
            return self
        if os.geteuid() != 0:
            raise SystemExit("shaped hosts need root (ip netns, tc); use --networks loopback")
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        remove_leftovers()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        rate = self.rate_mbit
        assert rate is not None
        self._allow(self.congestion_control)
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("link", "set", BRIDGE, "up")
        for k in range(self.count):
            ns, outer, inner = _namespace(k), f"{PREFIX}-v{k}", f"{PREFIX}-p{k}"
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", BRIDGE)
            _ip("link", "set", outer, "up")
            inside = ["ip", "netns", "exec", ns]
            subprocess.run([*inside, "ip", "link", "set", inner, "name", "eth0"], check=True)
            subprocess.run(
                [*inside, "ip", "addr", "add", f"{self.address(k)}/24", "dev", "eth0"],
                check=True,
            )
            subprocess.run([*inside, "ip", "link", "set", "eth0", "up"], check=True)
            subprocess.run([*inside, "ip", "link", "set", "lo", "up"], check=True)
            # Gloo keeps one TCP connection per peer and uses some only once per bucket;
            # Linux would restart slow start on each after every idle gap, which taxes
            # all-to-all patterns far more than a ring. Cluster hosts commonly turn it off.
            subprocess.run(
                [*inside, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0"], check=True
            )
            # The same two settings as trainport's own namespace hosts, but required here.
            problems = [
                set_congestion_control(ns, self.congestion_control),
                keep_in_order("eth0", k, netns=ns),
                keep_in_order(outer, k),
            ]
            if any(problems):
                raise SystemExit(f"cannot set up host {k}: {[p for p in problems if p]}")
            tc = ["tc", "qdisc", "add", "dev"]
            subprocess.run([*inside, *tc, "eth0", "root", *_tbf(rate)], check=True)
            subprocess.run([*tc, outer, "root", *_tbf(rate)], check=True)
        logger.info(
            "%d namespace hosts on %s, %d Mbit/s each way, TCP %s",
            self.count,
            BRIDGE,
            rate,
            self.congestion_control,
        )

    def _allow(self, algorithm: str) -> None:
        # A namespace may only default to an algorithm on the root namespace's allowed list.
        allowed = _sysctl(_ALLOWED)
        if algorithm not in allowed.split():
            self._allowed = allowed
            _sysctl(_ALLOWED, f"{allowed} {algorithm}")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.close()
        raise SystemExit(128 + signum)

    def close(self) -> None:
        if self.rate_mbit is None:
            return
        remove_leftovers()
        if self._allowed is not None:
            _sysctl(_ALLOWED, self._allowed)
            self._allowed = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_launches = 0


def run_ranks(
    hosts: Hosts,
    world: int,
    script: Path,
    args: dict[str, Any],
    out: Path,
    timeout: float,
) -> list[dict[str, Any]]:
    """Start ranks 0..world-1 on hosts 0..world-1, each running
    ``script --worker OUT ARGS_JSON``, and return their reports."""
    global _launches
    out.mkdir(parents=True, exist_ok=True)
    # Namespaced rank 0 listens on its own address (a fresh port per launch sidesteps
    # TIME_WAIT); loopback needs a port that is free right now.
    _launches += 1
    port = free_port() if hosts.rate_mbit is None else 29400 + _launches
    procs = []
    for k in range(world):
        topology = torchrun_topology(1, world, 0, k, hosts.address(0), port)
        env = dict(os.environ)
        env.update(torchrun_env(topology))
        env["OMP_NUM_THREADS"] = "1"
        env["GLOO_SOCKET_IFNAME"] = hosts.interface()
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
        argv = [sys.executable, str(script), "--worker", str(out), json.dumps(args)]
        log = (out / f"rank{k}.log").open("wb")
        procs.append((subprocess.Popen(hosts.wrap(k, argv), env=env, stderr=log), log))
    deadline = time.monotonic() + timeout
    failed = []
    for k, (proc, _log) in enumerate(procs):
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            failed.append(f"rank {k}: exit {code}")
    for proc, log in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    if failed:
        tail = (out / "rank0.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{hosts.label}, {world} ranks: {failed}\n{tail}")
    return [json.loads((out / f"rank{k}.json").read_text()) for k in range(world)]


def interface_bytes(interface: str) -> tuple[int, int]:
    """(sent, received) bytes on ``interface`` as the kernel counts them, headers included."""
    stats = Path("/sys/class/net") / interface / "statistics"
    return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())


def written_bytes() -> int:
    """Bytes this process passed to write()/writev() (gloo's socket sends among them)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0
