"""On the node: one host agent as a Ray actor.

The actor runs the same :class:`~trainport.host.agent.HostAgent` the local placement runs,
under a home of its own on the node's disk with the submitter's store configuration, keeps
the agent's events until the driver drains them, and answers stop, MPI launches and the
artifact hand-over beside the run.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trainport
from trainport.config import Settings
from trainport.host import jobtree, mpi
from trainport.host.agent import HostAgent, HostPlan
from trainport.host.command import runs_in_docker
from trainport.host.events import HostEnded, HostEvent, LogLines
from trainport.host.phases import Finished
from trainport.placement.ray.artifacts import send_artifacts
from trainport.placement.ray.checks import first_line
from trainport.placement.ray.relay import PeerRelay
from trainport.runners.netns import JobLoopback, netns_problem
from trainport.runners.overlay import NodeNetwork, Overlay, OverlayHost, node_network
from trainport.store.registry import open_store

__all__ = ["HostActor", "NodeInfo", "StoreProbe", "interface_of"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeInfo:
    """Where an actor landed, and what that node runs."""

    node_id: str
    address: str
    interface: str | None  # the network interface holding ``address``
    trainport_version: str
    python: str
    store_problem: str | None = None  # why this node cannot reach the job's store
    sandbox_problem: str | None = None  # why this node runs jobs unisolated, if it does
    network: NodeNetwork | None = None  # what it can make of a job network


@dataclass(frozen=True)
class StoreProbe:
    """What a node looks for to prove it reaches the store: the embedded store's probe
    file and its content, or an S3 bucket to ask about."""

    bucket: str | None
    path: str | None
    token: str | None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds IPv4 ``address`` on this machine, if any."""
    try:
        listed = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in listed.splitlines():
        fields = line.split()
        # "2: eth0    inet 10.1.2.3/24 brd ..."
        if len(fields) >= 4 and fields[2] == "inet" and fields[3].split("/")[0] == address:
            return fields[1]
    return None


class HostActor:
    """One host agent on its node. Run as a threaded Ray actor: ``run`` trains while
    ``drain``, ``terminate`` and ``send_artifacts`` answer beside it."""

    def __init__(self, settings: Settings) -> None:
        import ray

        self._node_id = ray.get_runtime_context().get_node_id()
        self._address = ray.util.get_node_ip_address()
        # The node's own disk: a home per node, so nodes sharing a filesystem (or this
        # machine, in the tests) never share a host's tree.
        home = Path(tempfile.gettempdir()) / "trainport-ray" / self._node_id[:16]
        local_store = settings.store_kind == "local"
        self._settings = dataclasses.replace(
            settings,
            home=home,
            store_dir=settings.store_root if local_store else None,
            server_keys=(),
            server_extra_keys=(),
        )
        self._events: collections.deque[HostEvent] = collections.deque()
        self._news = threading.Condition()
        self._agent: HostAgent | None = None
        self._stopped_with: float | None = None  # a stop that came before the agent
        # MPI: this host's launch board, made by whichever comes first, its own run or
        # the leader's relayed launch, and the daemon launch it is running, if any.
        self._board: mpi.LaunchBoard | None = None
        self._board_lock = threading.Lock()
        self._launch: mpi.LaunchRequest | None = None

    def node(self, probe: StoreProbe | None = None, spec: Any = None) -> NodeInfo:
        """Where this actor landed and what its node can do; with the job's ``spec``, also
        what the node can make of the job's network."""
        network = None
        if spec is not None:
            network = node_network(self._address)
            if network.problem is None and runs_in_docker(spec):
                why = "docker, which runs the job's image here, joins no namespace of trainport's"
                network = dataclasses.replace(network, problem=why)
        return NodeInfo(
            self._node_id,
            self._address,
            interface_of(self._address),
            trainport.__version__,
            sys.version.split()[0],
            self._store_problem(probe) if probe is not None else None,
            _sandbox_problem(),
            network,
        )

    def _store_problem(self, probe: StoreProbe) -> str | None:
        if probe.path is not None:
            try:
                seen = Path(probe.path).read_text()
            except OSError as exc:
                return f"cannot read {probe.path} ({exc.strerror or exc})"
            return None if seen == probe.token else f"{probe.path} holds another store's probe"
        try:
            open_store(self._settings).exists(probe.bucket or "", ".trainport-reach")
        except Exception as exc:  # the endpoint's own error, said as it is
            return f"{type(exc).__name__}: {first_line(exc)}"
        return None

    def _report(self, event: HostEvent) -> None:
        with self._news:
            self._events.append(event)
            self._news.notify_all()

    def run(
        self,
        plan: HostPlan,
        peers: dict[str, Any] | None = None,
        overlay: Overlay | None = None,
    ) -> None:
        """Run the host to its end; its events, HostEnded last, wait for :meth:`drain`.

        ``peers`` are the other hosts' actors, for an MPI job: algo-1's mpirun reaches
        their daemons through them. ``overlay``: the job's network, of which this node
        makes the host's part (None: the host has the node's network)."""
        from trainport.runners.registry import select_runner

        board = None
        if peers is not None:
            relay = PeerRelay(plan.hosts, peers) if plan.host == plan.hosts[0] else None
            board = self._mpi_board(plan.hosts, relay)
        plan = dataclasses.replace(
            plan, job_dir=self._settings.jobs_dir / plan.spec.name, mpi_board=board
        )
        model_uri = None
        network: OverlayHost | JobLoopback | None = None
        try:
            if overlay is not None:
                network = OverlayHost(overlay, plan.host)
                network.__enter__()
                plan = dataclasses.replace(plan, netns=network.namespace)
            elif plan.spec.network_isolation and netns_problem() is None:
                # One host (the supervisor refuses more): its own loopback and nothing else.
                network = JobLoopback(f"{plan.spec.name}-{plan.host}")
                network.__enter__()
                plan = dataclasses.replace(
                    plan,
                    netns=network.namespace,
                    network_interface="lo",
                    addresses={plan.host: "127.0.0.1"},  # the node's address is not there
                )
            if plan.job_dir.exists():  # a rerun of the same job name on this node
                jobtree.remove_tree(plan.job_dir)  # never through a link the last run left
            agent = HostAgent(
                plan,
                store=open_store(self._settings),
                runner=select_runner("auto"),
                settings=self._settings,
                report=self._report,
            )
            self._agent = agent
            if self._stopped_with is not None:
                agent.terminate(self._stopped_with)
            finished = agent.run()
            model_uri = agent.model_uri
        except BaseException as exc:  # never leave the job without an outcome
            log.exception("host agent %s failed", plan.host)
            finished = Finished(None, f"InternalError: host agent failed: {exc}")
        finally:
            if network is not None:
                network.teardown()
        self._report(HostEnded(plan.host, finished, model_uri))

    def _mpi_board(
        self, hosts: tuple[str, ...], relay: mpi.LaunchRelay | None = None
    ) -> mpi.LaunchBoard:
        with self._board_lock:
            if self._board is None:
                self._board = mpi.LaunchBoard(hosts, relay)
            return self._board

    def launch(self, hosts: tuple[str, ...], host: str, command: str) -> int:
        """Run the MPI daemon algo-1's mpirun asked for on this host (this host's agent
        runs it as its training command); its exit code once it ends."""
        request = mpi.LaunchRequest(host, command)
        if not self._mpi_board(hosts).deliver(request):
            return 1
        self._launch = request
        return request.wait()

    def cancel_launch(self) -> None:
        """mpirun's launch agent went away: end this host's daemon."""
        if self._launch is not None:
            self._launch.cancelled.set()

    def close_launches(self, hosts: tuple[str, ...]) -> None:
        """algo-1's mpirun has ended: a host still waiting for its daemon gives up."""
        self._mpi_board(hosts).close()

    def drain(self, wait: float) -> list[HostEvent]:
        """The events since the last drain (waiting up to ``wait`` s for one), with runs of
        one log's lines joined into one event."""
        with self._news:
            if not self._events:
                self._news.wait(wait)
            taken = list(self._events)
            self._events.clear()
        joined: list[HostEvent] = []
        for event in taken:
            last = joined[-1] if joined else None
            if (
                isinstance(event, LogLines)
                and isinstance(last, LogLines)
                and last.host == event.host
            ):
                joined[-1] = LogLines(event.host, last.lines + event.lines)
            else:
                joined.append(event)
        return joined

    def terminate(self, grace: float) -> None:
        self._stopped_with = grace
        if self._agent is not None:
            self._agent.terminate(grace)

    def send_artifacts(self, bucket: str, key: str) -> None:
        """Pack the host's model and output data folders and put them in the store at
        ``bucket/key``, for the supervisor's merged upload (see :mod:`.artifacts`)."""
        layout = self._agent.plan.layout if self._agent is not None else None
        send_artifacts(layout, self._settings, bucket, key)

    def clean(self) -> None:
        """Remove the host's tree from the node (its log and artifacts have been sent)."""
        if self._agent is not None:
            jobtree.remove_tree(self._agent.plan.job_dir)


def _sandbox_problem() -> str | None:
    from trainport.runners.sandbox import sandbox_problem

    return sandbox_problem()
