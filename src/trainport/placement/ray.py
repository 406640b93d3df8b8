"""Hosts on a Ray cluster: each host agent a Ray actor on a node of its own.

The supervisor (a Ray driver, connected to the cluster ``RAY_ADDRESS`` names) reserves one
bundle per host in a placement group with the STRICT_SPREAD strategy, so no two hosts share
a node, as no two SageMaker instances share a machine. It then starts one
:class:`HostActor` in each bundle and asks each what its node is and can make. Where every
node can, the job's hosts get a network of their own across their nodes
(:mod:`trainport.runners.overlay`): ``algo-k`` is the host's address there in every host's
``/etc/hosts``, so torchrun's ``--master_addr algo-1`` and a BYO job's own sockets reach
across nodes while other jobs on the same nodes, and the nodes themselves, stay out of
reach. Otherwise ``algo-k`` maps to the address of the node holding bundle k-1.

On its node an actor runs the same :class:`~trainport.host.agent.HostAgent` the local
placement runs, under a home of its own (the node's disk, never the submitter's job folder)
with the submitter's store configuration; its training process is contained as ``auto``
would contain it on that node (the sandbox where the node can make one). The agent's events
wait in the actor until the driver drains them with a long-polling call; the driver writes
each host's log lines into the job's folder on its own machine and hands the events on.

Failures come from Ray's own detection: a node whose raylet dies takes its actor with it,
and the pending drain call raises :class:`ray.exceptions.ActorDiedError` once Ray has
marked the node dead; the host then ends with a reason naming the host and the node.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import queue
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trainport
from trainport.config import Settings
from trainport.errors import ValidationError
from trainport.host import jobtree, mpi
from trainport.host.agent import HostAgent, HostPlan
from trainport.host.command import runs_in_docker
from trainport.host.events import HostEnded, HostEvent, LogLines, StatusChanged, append_log_lines
from trainport.host.layout import HostLayout
from trainport.host.tarball import extract_within
from trainport.jobs.status import Finished, Phase, Progress
from trainport.placement import capacity
from trainport.placement.api import HostGroup, PlacementError, take_events
from trainport.runners.netns import JobLoopback, netns_problem
from trainport.runners.overlay import NodeNetwork, Overlay, OverlayHost, node_network, plan_overlay
from trainport.store.api import S3Uri
from trainport.store.registry import open_store

__all__ = [
    "HostActor",
    "NodeInfo",
    "RayHosts",
    "check_cluster",
    "check_ray_job",
    "version_problem",
]

log = logging.getLogger(__name__)

# How long one drain call waits on its node for news before answering empty.
_DRAIN_WAIT = 0.5
# The submitter's environment that travels to the nodes: what configures the store.
_STORE_ENV_PREFIXES = ("AWS_",)


def check_ray_job(spec: Any) -> None:
    """Refuse, at submission, what the ray runner cannot run yet (a clear error, not a
    job that fails later on a node)."""
    if spec.tags.get("trainport:network") == "namespaces":
        raise ValidationError(
            "Tags: trainport:network=namespaces emulates hosts on this machine; on the ray "
            "runner each host already has its own node and network"
        )
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ValidationError(
            f"the ray runner needs Ray in this environment ({exc}); pip install 'ray[default]'"
        ) from exc


def check_cluster(spec: Any, settings: Settings) -> None:
    """Refuse, at submission, a job that no cluster of this one's shape could ever hold (a
    host bigger than every node): waiting for capacity would wait forever. Connects this
    process to the cluster (as a driver) if it is not yet; a cluster that cannot be reached
    is said as such."""
    import ray

    shapes = host_shapes(spec, spec.hosts, settings)
    if not ray.is_initialized():
        try:
            if settings.ray_address is None:
                # ray.init's default: a cluster running on this machine, else a new one of
                # its own that the supervisor starts; only the first has a shape to check.
                connect(settings, address="auto")
            else:
                connect(settings)
        except ConnectionError as exc:
            if settings.ray_address is None:
                return
            raise _unreachable(settings, exc) from exc
        except Exception as exc:  # a bad address, say
            raise _unreachable(settings, exc) from exc
    problem = capacity.never_fits(shapes, live_nodes())
    if problem:
        raise ValidationError(f"ResourceConfig: {problem}")


def _unreachable(settings: Settings, exc: Exception) -> ValidationError:
    return ValidationError(
        f"the ray runner cannot reach the Ray cluster at RAY_ADDRESS={settings.ray_address}: "
        f"{_first_line(exc)}. Set RAY_ADDRESS to the head's address (host:6379), or start "
        "the cluster (ray start --head)"
    )


def connect(settings: Settings, address: str | None = None) -> None:
    """This process as a driver of the cluster ``RAY_ADDRESS`` names (ray.init's rules)."""
    import ray

    address = address or settings.ray_address
    if address:
        _probe_gcs(address)
    # A ray:// head starts a server process of its own for each client, and that start can
    # fail on a loaded head and work a moment later: a few tries before the job fails.
    tries = _CLIENT_TRIES if address and address.startswith("ray://") else 1
    for attempt in range(1, tries + 1):
        try:
            ray.init(
                address=address,
                logging_level=logging.WARNING,
                log_to_driver=False,
                namespace="trainport",
            )
            return
        except ConnectionAbortedError as exc:
            if attempt == tries:
                raise
            log.warning(
                "Ray client server at %s refused connection %d of %d, trying again: %s",
                address, attempt, tries, " ".join(str(exc).split())[-300:],
            )  # fmt: skip
            time.sleep(2.0 * attempt)


_CLIENT_TRIES = 3


def _probe_gcs(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a head that does not answer: ray.init waits minutes for one."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", or a ray:// client address: Ray's own rules apply
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"nothing answers at {address} ({exc.strerror or exc}): no Ray head runs there"
        ) from exc


def live_nodes() -> list[dict[str, float]]:
    """The total resources of each live node of the connected cluster."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def host_shapes(
    spec: Any, hosts: tuple[str, ...], settings: Settings
) -> list[tuple[str, str, capacity.HostShape]]:
    """(host, instance type, what it takes) for every host of ``spec``."""
    overrides = capacity.parse_instance_types(settings.ray_instance_types or "{}")
    return [
        (h, t, capacity.shape_of(t, overrides))
        for h, t in ((h, spec.group_of(h).instance_type) for h in hosts)
    ]


# -- on the node ------------------------------------------------------------------------


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
            return f"{type(exc).__name__}: {_first_line(exc)}"
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
            relay = _PeerRelay(plan.hosts, peers) if plan.host == plan.hosts[0] else None
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
        """Pack the host's model and output data folders into one tar (``model/``,
        ``output/``) and put it in the store at ``bucket/key``, for the supervisor's merged
        upload. Through the store, which every node reaches (checked before the job
        started), not Ray's object store: a model of gigabytes goes from node to store in
        one stream. Links the job made are not followed."""
        agent = self._agent
        packed = self._settings.home / "packed" / f"{uuid.uuid4().hex}.tar"
        packed.parent.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(packed, mode="w") as tar:
                if agent is not None:
                    layout = agent.plan.layout
                    folders = (("model", layout.model_dir), ("output", layout.output_data_dir))
                    for name, folder in folders:
                        # Reached without links; tarfile keeps links inside as links.
                        with jobtree.open_folder(folder) as top:
                            if top is None:
                                continue
                            for entry in sorted(os.listdir(top)):
                                tar.add(top / entry, arcname=f"{name}/{entry}")
            open_store(self._settings).upload(packed, bucket, key)
        finally:
            packed.unlink(missing_ok=True)

    def clean(self) -> None:
        """Remove the host's tree from the node (its log and artifacts have been sent)."""
        if self._agent is not None:
            jobtree.remove_tree(self._agent.plan.job_dir)


class _PeerRelay:
    """algo-1's MPI launches, carried to the other hosts' actors (see
    :meth:`HostActor.launch`); a cancelled launch ends the daemon on its node."""

    def __init__(self, hosts: tuple[str, ...], peers: dict[str, Any]) -> None:
        self._hosts = hosts
        self._peers = peers

    def launch(self, request: mpi.LaunchRequest) -> None:
        threading.Thread(
            target=self._follow, args=(request,), name=f"mpi-relay-{request.host}", daemon=True
        ).start()

    def _follow(self, request: mpi.LaunchRequest) -> None:
        import ray

        peer = self._peers[request.host]
        done = peer.launch.remote(self._hosts, request.host, request.command)
        cancelled = False
        while True:
            ready, _ = ray.wait([done], timeout=0.5)
            if ready:
                try:
                    code = ray.get(done)
                except Exception as exc:  # its node died: mpirun sees the daemon fail
                    log.warning("mpi: the daemon on %s was lost: %s", request.host, exc)
                    code = 1
                request.finish(code)
                return
            if request.cancelled.is_set() and not cancelled:
                peer.cancel_launch.remote()
                cancelled = True

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close_launches.remote(self._hosts)


# -- on the submitting side -------------------------------------------------------------


def version_problem(mine: str, nodes: dict[str, NodeInfo]) -> str | None:
    """What is wrong with the trainport versions the hosts' nodes run, if anything: a
    host's agent must speak the same events and plans as this supervisor."""
    other = {h: n for h, n in nodes.items() if n.trainport_version != mine}
    if not other:
        return None
    said = "; ".join(
        f"host {h} on node {n.address} (id {n.node_id[:12]}) has trainport {n.trainport_version}"
        for h, n in sorted(other.items())
    )
    return f"{said}; this supervisor runs trainport {mine}: install {mine} on every node"


def isolation_problem(nodes: dict[str, NodeInfo], required: bool) -> str | None:
    """Why the job may not run on these nodes when it must run contained, if it may not:
    a node that cannot make a sandbox would run its host under the process runner."""
    if not required:
        return None
    bare = {h: n for h, n in nodes.items() if n.sandbox_problem}
    if not bare:
        return None
    said = "; ".join(
        f"host {h} on node {n.address} (id {n.node_id[:12]}) cannot make a sandbox "
        f"({n.sandbox_problem})"
        for h, n in sorted(bare.items())
    )
    return (
        f"{said}; this job must run isolated (TRAINPORT_REQUIRE_ISOLATION, set by a server "
        "that refuses the process runner): make the sandbox work on that node (root, or "
        "bubblewrap) or, for trusted code only, allow unisolated jobs with "
        "TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER=1"
    )


class RayHosts(HostGroup):
    """A job's hosts as actors on distinct nodes of a Ray cluster."""

    def __init__(self, plans: list[HostPlan], *, settings: Settings, job_dir: Path) -> None:
        self.hosts = tuple(p.host for p in plans)
        self._plans = {p.host: p for p in plans}
        self._settings = settings
        self._job_dir = job_dir
        self._queue: queue.SimpleQueue[HostEvent] = queue.SimpleQueue()
        self._actors: dict[str, Any] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._group: Any = None
        self._ended: set[str] = set()
        self._stop_grace: float | None = None
        self._probe_file: Path | None = None
        self._lock = threading.Lock()
        self._driver: threading.Thread | None = None
        # Names this run of the job's hosts (a retry is another): its network's VNI.
        self._run = uuid.uuid4().hex

    # -- the contract -----------------------------------------------------------------------

    def start(self) -> None:
        import ray

        if not ray.is_initialized():
            connect(self._settings)
        (self._job_dir / "logs").mkdir(parents=True, exist_ok=True)
        self._driver = threading.Thread(target=self._drive, name="ray-hosts", daemon=True)
        self._driver.start()

    def events(self, timeout: float) -> list[HostEvent]:
        return take_events(self._queue, timeout)

    def terminate(self, host: str, grace: float) -> None:
        with self._lock:
            if self._stop_grace is None:
                self._stop_grace = grace
            actor = self._actors.get(host)
        if actor is not None and host not in self._ended:
            actor.terminate.remote(grace)

    def artifact_folders(self) -> list[tuple[str, Path, Path]]:
        # Fetched from each node as its host ended (see _fetch_artifacts).
        folders = []
        for host in self.hosts:
            layout = HostLayout(self._job_dir / "hosts" / host)
            folders.append((host, layout.model_dir, layout.output_data_dir))
        return folders

    def _fetch_artifacts(self, host: str) -> None:
        """Bring an ended host's model and output folders to this machine, for the merged
        upload (a host that uploads its own, the only one, needs none of this)."""
        import ray

        layout = HostLayout(self._job_dir / "hosts" / host)
        layout.model_dir.mkdir(parents=True, exist_ok=True)
        layout.output_data_dir.mkdir(parents=True, exist_ok=True)
        actor = self._actors.get(host)
        if actor is None or self._plans[host].upload_artifacts:
            return
        spec = self._plans[host].spec
        out = S3Uri.parse(spec.output_path)
        # Beside the job's archives, and gone once read.
        parts = (out.key.strip("/"), spec.name, "output", ".hosts", f"{host}.tar")
        key = "/".join(p for p in parts if p)
        packed = self._job_dir / "hosts" / host / "packed.tar"
        store = open_store(self._settings)
        try:
            ray.get(actor.send_artifacts.remote(out.bucket, key), timeout=3600)
            store.download(out.bucket, key, packed)
        except Exception as exc:  # a dead node: its host's files are lost with it
            log.warning("host %s: its artifacts could not be fetched: %s", host, exc)
            return
        finally:
            with contextlib.suppress(Exception):
                store.delete(out.bucket, key)
        try:
            _unpack(packed, layout)
        finally:
            packed.unlink(missing_ok=True)

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._driver is not None:
            self._driver.join()
        cleaning = [a.clean.remote() for a in self._actors.values()]
        try:
            ray.wait(cleaning, num_returns=len(cleaning), timeout=30)
        except Exception:  # a dead node has nothing left to clean
            log.debug("cleaning the nodes failed", exc_info=True)
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone with its node
                log.debug("actor already gone", exc_info=True)
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception:
                log.debug("placement group already gone", exc_info=True)
        ray.shutdown()

    # -- the driver thread --------------------------------------------------------------------

    def _drive(self) -> None:
        try:
            placed = self._place()
        except Exception as exc:
            log.error("the job's hosts could not be placed on the Ray cluster: %s", exc)
            reason = str(exc) if isinstance(exc, PlacementError) else f"{type(exc).__name__}: {exc}"
            for host in self.hosts:
                self._end(host, Finished(None, f"ClientError: {reason}"))
            return
        if not placed:  # stopped while it waited for the cluster
            for host in self.hosts:
                self._end(host, Finished(None, None))
            return
        self._pump()

    def _place(self) -> bool:
        """Reserve the nodes and start every host there; False if a stop came first."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        spec = self._plans[self.hosts[0]].spec
        shapes = host_shapes(spec, self.hosts, self._settings)
        problem = capacity.never_fits(shapes, live_nodes())
        if problem:
            raise PlacementError(problem)
        bundles = [shape.bundle() for _, _, shape in shapes]
        self._group = placement_group(bundles, strategy="STRICT_SPREAD", name="")
        said = None
        started = time.monotonic()
        while not self._group.wait(1):
            if self._stop_grace is not None:
                return False
            if time.monotonic() - started > 2:
                # Pending, as SageMaker says of a job waiting for capacity, with what is
                # missing; said again whenever that changes (a node joins).
                message = capacity.waiting_message(shapes, live_nodes())
                if message != said:
                    change = Phase("Pending", message) if said is None else Progress(message)
                    self._put(StatusChanged(self.hosts[0], change))
                    said = message
        if said is not None:
            starting = Phase("Starting", "Preparing the instances for training")
            self._put(StatusChanged(self.hosts[0], starting))
        probe = self._store_probe()
        env = {k: v for k, v in os.environ.items() if k.startswith(_STORE_ENV_PREFIXES)}
        actor_class = ray.remote(max_restarts=0, max_task_retries=0)(HostActor)
        for k, host in enumerate(self.hosts):
            shape = shapes[k][2]
            options: dict[str, Any] = {
                # The agent holds its bundle's GPUs: Ray sets CUDA_VISIBLE_DEVICES for it,
                # and the agent gives the training process that share.
                "num_cpus": min(1.0, shape.cpus),
                "num_gpus": shape.gpus,
                # run, drain, an MPI daemon's launch, and stop/pack/clean beside them
                "max_concurrency": 8,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=k
                ),
            }
            if env:
                options["runtime_env"] = {"env_vars": env}
            self._actors[host] = actor_class.options(**options).remote(self._settings)
        for host, actor in self._actors.items():
            try:
                self._nodes[host] = ray.get(actor.node.remote(probe, spec), timeout=300)
            except Exception as exc:
                raise PlacementError(
                    f"host {host}: its agent could not start on the node the cluster gave "
                    f"it ({self._bundle_node(k=self.hosts.index(host))}): {_first_line(exc)}. "
                    f"Every node needs trainport {trainport.__version__} installed for the "
                    "Python that runs Ray"
                ) from exc
        self._check_versions()
        problem = isolation_problem(self._nodes, self._settings.require_isolation)
        if problem:
            raise PlacementError(problem)
        self._check_store(probe)
        overlay, shared = self._network(spec)
        if overlay is not None:
            addresses = overlay.addresses()
        else:
            addresses = {h: n.address for h, n in self._nodes.items()}
        log.info("hosts placed on Ray nodes: %s", {h: n.address for h, n in self._nodes.items()})
        for host, node in self._nodes.items():
            said = f"[trainport] host {host} runs on Ray node {node.address} (id {node.node_id})"
            if overlay is not None:
                said += f", at {overlay.address(host)} on the job's own network"
            if node.sandbox_problem:
                # "auto" on that node: the job still runs, as it would here, and says so.
                said += (
                    ", with NO isolation (the process runner): the node cannot make a "
                    f"sandbox ({node.sandbox_problem})"
                )
            lines = [(time.time(), said)]
            if shared and len(self.hosts) > 1:
                lines.append((time.time(), f"[trainport] {shared}"))
            self._put(LogLines(host, tuple(lines)))
        is_mpi = mpi.mpi_settings(self._plans[self.hosts[0]].spec) is not None
        for host, actor in self._actors.items():
            node = self._nodes[host]
            plan = dataclasses.replace(
                self._plans[host],
                addresses=addresses,
                network_interface="eth0" if overlay else node.interface or "eth0",
                netns=None,  # the node names the host's namespace (see HostActor.run)
                mpi_board=None,  # each node makes its own (see HostActor.run)
            )
            peers = {h: a for h, a in self._actors.items() if h != host} if is_mpi else None
            actor.run.remote(plan, peers, overlay)
        with self._lock:
            grace = self._stop_grace
        if grace is not None:  # a stop that came while the actors were being made
            for actor in self._actors.values():
                actor.terminate.remote(grace)
        return True

    def _network(self, spec: Any) -> tuple[Overlay | None, str | None]:
        """The job's own network across its nodes, or None and why the hosts share their
        nodes' networks; a PlacementError for an isolated job that cannot be isolated."""
        import ray

        why: str | None
        if spec.tags.get("trainport:network") == "loopback":
            why = "the job asked for it (trainport:network=loopback)"
        else:
            nodes = {h: n.network for h, n in self._nodes.items() if n.network is not None}
            cluster = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
            # Whatever node an actor found itself on counts too (a node Ray lists late).
            cluster |= {n.address for n in self._nodes.values()}
            planned = plan_overlay(
                self._run, nodes, isolated=spec.network_isolation, cluster=tuple(sorted(cluster))
            )
            if isinstance(planned, Overlay):
                return planned, None
            why = planned
        if spec.network_isolation and len(self.hosts) > 1:
            raise PlacementError(
                "EnableNetworkIsolation with several hosts needs a network of the job's own "
                f"on every node, so that the hosts reach each other and nothing else: {why}"
            )
        shared = f"the hosts share their nodes' networks: {why}"
        log.warning("job %s: %s", spec.name, shared)
        return None, shared

    def _store_probe(self) -> StoreProbe:
        """Something of the store every node must find: for the embedded store a file the
        supervisor writes into it now, for an S3 endpoint the job's output bucket."""
        spec = next(iter(self._plans.values())).spec
        if self._settings.store_kind != "local":
            return StoreProbe(S3Uri.parse(spec.output_path).bucket, None, None)
        token = uuid.uuid4().hex
        path = self._settings.store_root / ".trainport-reach" / f"{spec.name}-{token}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token)
        self._probe_file = path
        return StoreProbe(None, str(path), token)

    def _check_store(self, probe: StoreProbe) -> None:
        if self._probe_file is not None:
            self._probe_file.unlink(missing_ok=True)
        blind = {h: n for h, n in self._nodes.items() if n.store_problem}
        if not blind:
            return
        said = "; ".join(
            f"host {h} on node {n.address} (id {n.node_id[:12]}): {n.store_problem}"
            for h, n in sorted(blind.items())
        )
        if probe.path is not None:
            raise PlacementError(
                f"the embedded store ({self._settings.store_root}) is not visible on every "
                f"node: {said}. Put TRAINPORT_HOME (or its store folder) on a filesystem every "
                "node mounts at the same path, or use an S3-compatible store "
                "(AWS_ENDPOINT_URL_S3) that every node reaches"
            )
        raise PlacementError(
            f"the S3 store is not reachable from every node: {said}. Give every node a route "
            "to the endpoint (its AWS_* settings travel from here)"
        )

    def _check_versions(self) -> None:
        problem = version_problem(trainport.__version__, self._nodes)
        if problem:
            raise PlacementError(problem)

    def _bundle_node(self, k: int) -> str:
        """The node holding bundle ``k``, as "address (id)", for an error message."""
        import ray
        from ray.util.placement_group import placement_group_table

        try:
            node_id = placement_group_table(self._group)["bundles_to_node_id"][k]
            address = next(
                (n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "?"
            )
            return f"node {address}, id {node_id[:12]}"
        except Exception:
            return "node unknown"

    def _pump(self) -> None:
        """Drain every host's events until each has ended."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError

        def ask(host: str) -> Any:
            return self._actors[host].drain.remote(_DRAIN_WAIT)

        pending = {ask(h): h for h in self.hosts}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                host = pending.pop(ref)
                try:
                    events = ray.get(ref)
                except ActorUnavailableError:
                    # Not (yet) known dead: ask again; Ray's failure detection decides.
                    time.sleep(0.5)
                    pending[ask(host)] = host
                    continue
                except (ActorDiedError, ray.exceptions.RayActorError) as exc:
                    node = self._nodes[host]
                    self._end(
                        host,
                        Finished(
                            None,
                            f"InternalServerError: Ray node {node.address} (id "
                            f"{node.node_id[:12]}) running this host died or was lost: "
                            f"{_first_line(exc)}",
                        ),
                    )
                    continue
                for event in events:
                    if isinstance(event, HostEnded):
                        self._fetch_artifacts(host)
                    self._put(event)
                if not any(isinstance(e, HostEnded) for e in events):
                    pending[ask(host)] = host

    def _end(self, host: str, finished: Finished) -> None:
        self._put(HostEnded(host, finished))

    def _put(self, event: HostEvent) -> None:
        if isinstance(event, LogLines):
            # The job's log lives on the submitting side, as it does for local hosts.
            try:
                append_log_lines(self._job_dir / "logs" / f"{event.host}.log", event.lines)
            except OSError as exc:
                log.warning("host %s: log lines not written: %s", event.host, exc)
        if isinstance(event, HostEnded):
            with self._lock:
                self._ended.add(event.host)
        self._queue.put(event)


def _unpack(packed: Path, layout: HostLayout) -> None:
    """A host's packed folders into its tree on this machine; members confined to it."""
    with tarfile.open(packed, mode="r") as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            target = {"model": layout.model_dir, "output": layout.output_data_dir}.get(top)
            if target is None or not rest:
                continue
            member.name = rest
            extract_within(tar, [member], target)


def _sandbox_problem() -> str | None:
    from trainport.runners.sandbox import sandbox_problem

    return sandbox_problem()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
