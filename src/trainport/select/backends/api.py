"""The contract between the MOP driver and an execution backend.

The driver decides (see :mod:`trainport.select.scheduler`); a backend only does: it
starts one worker per (partition, replica), each loading its partition once, runs the
units it is given, and reports :class:`UnitDone` or :class:`WorkerLost` events from
:meth:`Backend.wait`, which blocks until at least one event is there (no polling).

Hop state travels as a *handle*: ``bytes`` for backends that ship state through the
driver, an object-store reference for Ray. :meth:`Backend.put_state` and
:meth:`Backend.get_state` convert at the edges.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainport.select.partition import DataFile
from trainport.select.scheduler import Placement, Unit
from trainport.select.space import Config
from trainport.select.trainer import Trainer, UnitMetrics

__all__ = ["Backend", "Event", "UnitDone", "UnitTask", "WorkerLost", "WorkerStats"]

StateHandle = Any


@dataclass(frozen=True)
class UnitTask:
    unit: Unit
    epoch: int  # the model's logical epoch (1-based)
    config: Config
    state: StateHandle


@dataclass(frozen=True)
class UnitDone:
    unit: Unit
    state: StateHandle
    metrics: UnitMetrics
    state_bytes: int
    started: float  # wall-clock seconds (time.time) on the worker
    ended: float


@dataclass(frozen=True)
class WorkerLost:
    worker: int
    unit: Unit | None  # the unit it was running, if any
    reason: str


Event = UnitDone | WorkerLost


@dataclass
class WorkerStats:
    """What a worker reports about itself; updated with every finished unit."""

    worker: int
    partition: int
    data_bytes: int = 0  # memory held by the loaded partition
    bytes_read: int = 0  # bytes of data files read, over all loads
    loads: int = 0  # times the partition was loaded (restarts reload)
    peak_rss: int = 0  # peak resident memory of the worker process, bytes


class Backend(ABC):
    """Runs units on workers that each hold one partition."""

    name: str = "backend"

    @abstractmethod
    def start(
        self, trainer: Trainer, partitions: Sequence[Sequence[DataFile]], placement: Placement
    ) -> None:
        """Start ``placement.workers`` workers; worker ``w`` loads ``partitions[w % p]``."""

    @abstractmethod
    def submit(self, task: UnitTask) -> None:
        """Run ``task.unit`` on ``task.unit.worker``, which must be idle."""

    @abstractmethod
    def wait(self) -> list[Event]:
        """Block until at least one submitted unit finished or a worker was lost."""

    @abstractmethod
    def restart(self, worker: int) -> None:
        """Replace a lost worker with a fresh one that reloads its partition."""

    def put_state(self, state: bytes) -> StateHandle:
        return state

    def get_state(self, handle: StateHandle) -> bytes:
        return bytes(handle)

    @abstractmethod
    def stats(self) -> list[WorkerStats]: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
