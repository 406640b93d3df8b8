"""A real multi-node Ray cluster on this machine: each node in a network namespace of its own.

Every node gets a namespace with an ``eth0`` (one end of a veth pair whose other end sits
on a bridge) at ``10.<s>.<t>.(k+2)``; the bridge holds ``.1``, so this machine's root
namespace (where the tests and the job supervisors run) reaches every node, and the nodes
reach each other, over real interfaces. A driver in the root namespace (the tests, a job's
supervisor) connects with ``RAY_ADDRESS=<head>:6379``: Ray finds the nodes' raylets among
this machine's processes and attaches the driver to the head, which it reaches over the
bridge.

:meth:`NamespaceCluster.close` stops every Ray process and removes the namespaces and the
bridge, whatever state the start left them in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NamespaceCluster", "RayNode"]

GCS_PORT = 6379
MEMORY = 16 << 30
OBJECT_STORE = 256 << 20


@dataclass
class RayNode:
    name: str  # the namespace
    address: str
    temp_dir: Path
    process: subprocess.Popen[bytes] | None = None
    raylet_pids: list[int] = field(default_factory=list)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


class NamespaceCluster:
    """``nodes`` Ray nodes (the first is the head), each in its own network namespace."""

    def __init__(self, work: Path, nodes: int = 2, cpus: int = 2, tag: str | None = None) -> None:
        self.tag = tag or f"{os.getpid() % 100000:05d}"
        self.bridge = f"trb{self.tag}"
        self.subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        self.work = work
        self.cpus = cpus
        self.nodes: list[RayNode] = [self._node(k) for k in range(nodes)]
        self._bridge_made = False
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            # Every node runs this interpreter: its workers import this trainport.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def _node(self, k: int) -> RayNode:
        return RayNode(f"trn{self.tag}-{k}", f"{self.subnet}.{k + 2}", self.work / f"n{k}")

    @property
    def head(self) -> RayNode:
        return self.nodes[0]

    @property
    def address(self) -> str:
        """What RAY_ADDRESS names: the head's GCS."""
        return f"{self.head.address}:{GCS_PORT}"

    def head_logs(self, pattern: str, lines: int = 40) -> str:
        """The last ``lines`` of each of the head's Ray logs ``pattern`` matches (for a test's
        failure message: what Ray said on its side)."""
        said = []
        for path in sorted((self.head.temp_dir / "session_latest" / "logs").glob(pattern)):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            said.append(f"== {path.name}\n" + "\n".join(tail))
        return "\n".join(said) or f"(no head log matches {pattern})"

    # -- the network ----------------------------------------------------------------------

    def _make_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            self._plug(node)

    def _plug(self, node: RayNode) -> None:
        outside = f"trv{self.tag}{node.name.rsplit('-', 1)[1]}"
        _ip("netns", "add", node.name)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", node.name)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", node.name, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _ip("-n", node.name, "link", "set", "eth0", "up")
        _ip("-n", node.name, "link", "set", "lo", "up")

    # -- Ray --------------------------------------------------------------------------------

    def _ray_start(
        self,
        node: RayNode,
        head: bool,
        hide: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        node.temp_dir.mkdir(parents=True, exist_ok=True)
        ray = str(Path(sys.executable).parent / "ray")
        argv = [ray, "start", "--block", f"--node-ip-address={node.address}"]
        argv += [f"--num-cpus={self.cpus}", "--num-gpus=0", "--disable-usage-stats"]
        argv += [f"--temp-dir={node.temp_dir}"]
        # Declared, not measured: every node holds an ml.m5.large host (8 GiB) whatever this
        # machine's memory, and the object stores stay small (the nodes share one /dev/shm).
        argv += [f"--memory={MEMORY}", f"--object-store-memory={OBJECT_STORE}"]
        if head:
            argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.head.address}:{GCS_PORT}"]
        log = open(self.work / f"{node.name}.log", "ab")  # noqa: SIM115 - kept by the process
        if hide is not None:
            # A node that does not mount what this machine has at ``hide`` (a store on a
            # filesystem only the submitter has): an empty tmpfs over it, in a mount
            # namespace of the node's own.
            script = f'mount -t tmpfs tmpfs "{hide}" && exec "$@"'
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                    "sh", *argv]  # fmt: skip
        node.process = subprocess.Popen(
            # nsenter, not "ip netns exec": that one also mounts a sysfs of the namespace
            # over /sys, hiding the cgroup tree a node's container engine needs.
            ["nsenter", f"--net=/run/netns/{node.name}", *argv],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def start(self, timeout: float = 90) -> NamespaceCluster:
        try:
            self.work.mkdir(parents=True, exist_ok=True)
            self._make_network()
            self._ray_start(self.head, head=True)
            self._wait_port(self.head.address, GCS_PORT, timeout)
            for node in self.nodes[1:]:
                self._ray_start(node, head=False)
            self.wait_nodes(len(self.nodes), timeout)
        except BaseException:
            self.close()
            raise
        return self

    def add_node(
        self, timeout: float = 90, hide: Path | None = None, env: dict[str, str] | None = None
    ) -> RayNode:
        """One more node; ``hide`` a folder it does not mount, ``env`` more of its
        environment (its workers inherit it)."""
        node = self._node(len(self.nodes))
        self.nodes.append(node)
        self._plug(node)
        self._ray_start(node, head=False, hide=hide, env=env)
        self.wait_nodes(self.running(), timeout)
        return node

    def running(self) -> int:
        return sum(1 for n in self.nodes if n.process is not None)

    def remove_node(self, node: RayNode, timeout: float = 60) -> None:
        """Stop ``node`` (its raylet leaves the cluster) and wait until Ray counts it gone."""
        self._stop(node)
        deadline = time.monotonic() + timeout
        while self.alive_nodes() > self.running():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Ray still counts node {node.name} alive after {timeout} s")
            time.sleep(0.5)

    def _wait_port(self, host: str, port: int, timeout: float) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex((host, port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"Ray's GCS on {host}:{port} did not open in {timeout} s")

    def alive_nodes(self) -> int:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
                "print(sum(1 for n in ray.nodes() if n['Alive']))",
                self.address,
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        try:
            return int(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def wait_nodes(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_nodes() >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not reach {count} live nodes in {timeout} s")

    def raylet_pid(self, node: RayNode) -> int:
        """The pid of ``node``'s raylet (found by its session folder under the node's temp dir)."""
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                cmdline
                and cmdline[0].endswith(b"/raylet")
                and any(str(node.temp_dir).encode() in arg for arg in cmdline)
            ):
                return int(pid)
        raise RuntimeError(f"no raylet found for node {node.name}")

    def close(self) -> None:
        for node in reversed(self.nodes):
            self._stop(node)
        for node in self.nodes:
            subprocess.run(["ip", "netns", "del", node.name], capture_output=True)
        if self._bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def _stop(self, node: RayNode) -> None:
        if node.process is None:
            return
        # Every process of a node runs in its namespace: end them all by that, which also
        # catches workers that left the session of `ray start`.
        listed = subprocess.run(
            ["ip", "netns", "pids", node.name], capture_output=True, text=True
        ).stdout.split()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in [int(p) for p in listed]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if sig == signal.SIGTERM:
                time.sleep(1.0)
            listed = subprocess.run(
                ["ip", "netns", "pids", node.name], capture_output=True, text=True
            ).stdout.split()
        try:
            node.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            node.process.kill()
        node.process = None
