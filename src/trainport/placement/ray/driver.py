"""On the submitting side: a job's hosts placed on a Ray cluster and followed there.

:class:`RayHosts` is the :class:`~trainport.placement.api.HostGroup` of the ray runner: a
driver thread reserves the nodes, starts a :class:`~.actor.HostActor` on each, gives the
hosts a network, and drains their events into the supervisor's queue.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import trainport
from trainport.config import Settings
from trainport.host.agent import HostPlan
from trainport.host.events import HostEnded, HostEvent, LogLines, StatusChanged, append_log_lines
from trainport.host.launch_kind import mpi_launch_settings
from trainport.host.layout import HostLayout
from trainport.host.phases import Finished, Phase, Progress
from trainport.placement import capacity
from trainport.placement.api import HostGroup, PlacementError, take_events
from trainport.placement.ray.actor import HostActor, NodeInfo, StoreProbe
from trainport.placement.ray.artifacts import fetch_artifacts
from trainport.placement.ray.checks import (
    connect,
    first_line,
    host_shapes,
    isolation_problem,
    live_nodes,
    version_problem,
)
from trainport.runners.overlay import Overlay, plan_overlay
from trainport.store.api import S3Uri

__all__ = ["RayHosts"]

log = logging.getLogger(__name__)

# How long one drain call waits on its node for news before answering empty.
_DRAIN_WAIT = 0.5
# The submitter's environment that travels to the nodes: what configures the store.
_STORE_ENV_PREFIXES = ("AWS_",)


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
        layout = HostLayout(self._job_dir / "hosts" / host)
        layout.model_dir.mkdir(parents=True, exist_ok=True)
        layout.output_data_dir.mkdir(parents=True, exist_ok=True)
        actor = self._actors.get(host)
        if actor is None or self._plans[host].upload_artifacts:
            return
        fetch_artifacts(actor, self._plans[host].spec, host, layout, self._settings)

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
                    f"it ({self._bundle_node(k=self.hosts.index(host))}): {first_line(exc)}. "
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
        is_mpi = mpi_launch_settings(self._plans[self.hosts[0]].spec) is not None
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
                            f"{first_line(exc)}",
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
