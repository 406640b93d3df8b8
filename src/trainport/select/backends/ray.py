"""The Ray backend: one actor per (partition, replica), models hopping through the object store.

Each actor is pinned to a node with a hard node-affinity strategy, loads its partition
once in its constructor and keeps it. A unit is an actor call with two returns: the new
hop state stays in Ray's object store (the driver only holds its reference and passes it
to whichever actor trains the model next), the small metrics record comes back to the
driver. The driver blocks in :func:`ray.wait` on those records; a dead actor surfaces as
:class:`ray.exceptions.RayActorError` on its record and becomes a :class:`WorkerLost`.

If Ray is not initialized yet, :meth:`RayBackend.start` connects to ``address`` (or starts
a local cluster) and shuts it down again in :meth:`RayBackend.close`.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainport.errors import JobError
from trainport.select.backends.api import (
    Backend,
    Event,
    UnitDone,
    UnitTask,
    WorkerLost,
    WorkerStats,
)
from trainport.select.backends.worker import load, peak_rss, run_unit
from trainport.select.partition import DataFile
from trainport.select.scheduler import Placement, Unit
from trainport.select.trainer import Trainer

__all__ = ["RayBackend"]

log = logging.getLogger(__name__)


class _PartitionActor:
    """Holds one partition for the whole workload and trains units on it."""

    def __init__(self, trainer: Trainer, files: Sequence[DataFile], stats: WorkerStats) -> None:
        self._trainer = trainer
        self._cache = tempfile.TemporaryDirectory(prefix="trainport-select-")
        self._stats = stats
        self._data = load(trainer, files, stats, Path(self._cache.name))

    def ready(self) -> WorkerStats:
        return self._stats

    def train(self, task: UnitTask, state: bytes) -> tuple[bytes, tuple[Any, ...]]:
        done = run_unit(self._trainer, self._data, replace(task, state=state))
        self._stats.peak_rss = peak_rss()
        return done.state, (done.metrics, done.state_bytes, done.started, done.ended, self._stats)


class RayBackend(Backend):
    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        init_options: dict[str, Any] | None = None,
    ) -> None:
        self._address = address
        self._cpus = cpus_per_worker
        self._init_options = dict(init_options or {})
        self._owns_ray = False
        self._actors: dict[int, Any] = {}
        self._nodes: dict[int, str] = {}
        self._stats: dict[int, WorkerStats] = {}
        # metrics ref -> (worker, unit, state ref)
        self._pending: dict[Any, tuple[int, Unit, Any]] = {}
        self._trainer: Trainer | None = None
        self._partitions: list[list[DataFile]] = []
        self._placement: Placement | None = None

    def start(
        self, trainer: Trainer, partitions: Sequence[Sequence[DataFile]], placement: Placement
    ) -> None:
        if not ray.is_initialized():
            ray.init(address=self._address, **self._init_options)
            self._owns_ray = True
        self._trainer = trainer
        self._partitions = [list(p) for p in partitions]
        self._placement = placement
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
        if not nodes:
            raise JobError("ray backend: the cluster has no live node")
        for w in range(placement.workers):
            # Spread partitions over nodes; a worker stays on its node for the workload.
            self._nodes[w] = nodes[w % len(nodes)]
            self._spawn(w, WorkerStats(w, placement.partition_of(w)))
        ready = ray.get([self._actors[w].ready.remote() for w in range(placement.workers)])
        for w, stats in enumerate(ready):
            self._stats[w] = stats
        log.info("ray backend: %d actors ready on %d node(s)", placement.workers, len(nodes))

    def _spawn(self, worker: int, stats: WorkerStats) -> None:
        assert self._placement is not None  # set by start(), not user input
        actor_cls = ray.remote(max_restarts=0, max_task_retries=0)(_PartitionActor)
        self._actors[worker] = actor_cls.options(
            num_cpus=self._cpus,
            name=None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self._nodes[worker], soft=False),
        ).remote(self._trainer, self._partitions[self._placement.partition_of(worker)], stats)

    def restart(self, worker: int) -> None:
        old = self._actors.get(worker)
        if old is not None:
            ray.kill(old, no_restart=True)
        self._spawn(worker, self._stats[worker])
        self._stats[worker] = ray.get(self._actors[worker].ready.remote())
        log.info("ray backend: worker %d restarted and reloaded its partition", worker)

    def put_state(self, state: bytes) -> Any:
        return ray.put(state)

    def get_state(self, handle: Any) -> bytes:
        return bytes(ray.get(handle))

    def submit(self, task: UnitTask) -> None:
        actor = self._actors[task.unit.worker]
        # The state reference is a top-level argument, so Ray hands the actor the bytes
        # straight from the object store; the driver never touches them.
        state_ref, meta_ref = actor.train.options(num_returns=2).remote(
            replace(task, state=None), task.state
        )
        self._pending[meta_ref] = (task.unit.worker, task.unit, state_ref)

    def wait(self) -> list[Event]:
        if not self._pending:
            return []
        refs = list(self._pending)
        ready, _ = ray.wait(refs, num_returns=1)
        # Whatever else is already finished comes along, without blocking again.
        more, _ = (
            ray.wait([r for r in refs if r not in ready], num_returns=len(refs) - 1, timeout=0)
            if len(refs) > 1
            else ([], [])
        )
        events: list[Event] = []
        for ref in [*ready, *more]:
            worker, unit, state_ref = self._pending.pop(ref)
            try:
                metrics, size, started, ended, stats = ray.get(ref)
            except RayActorError as exc:
                events.append(WorkerLost(worker, unit, f"actor died: {type(exc).__name__}"))
                continue
            except RayTaskError as exc:
                raise JobError(f"training unit {unit} failed on worker {worker}: {exc}") from exc
            self._stats[worker] = stats
            events.append(UnitDone(unit, state_ref, metrics, size, started, ended))
        return events

    def stats(self) -> list[WorkerStats]:
        return [self._stats[w] for w in sorted(self._stats)]

    def actors(self) -> dict[int, Any]:
        return dict(self._actors)

    def close(self) -> None:
        for actor in self._actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead; nothing to release
                log.debug("ray backend: actor already gone", exc_info=True)
        self._actors.clear()
        self._pending.clear()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False
