"""The embedded default backend: one worker process per (partition, replica) on this machine.

Workers are started with the ``spawn`` method so that no torch thread pool is inherited
through ``fork``. The driver blocks in :func:`multiprocessing.connection.wait` on the
workers' pipes and process sentinels together, so a finished unit and a dead worker wake
it the same way, and nothing polls.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from trainport.errors import JobError
from trainport.select.backends.api import (
    Backend,
    Event,
    UnitDone,
    UnitTask,
    WorkerLost,
    WorkerStats,
)
from trainport.select.backends.worker import serve
from trainport.select.partition import DataFile
from trainport.select.scheduler import Placement, Unit
from trainport.select.trainer import Trainer

__all__ = ["LocalBackend"]

log = logging.getLogger(__name__)


def _main(
    conn: Connection, trainer: Trainer, files: Sequence[DataFile], stats: WorkerStats
) -> None:
    serve(conn, trainer, files, stats)


class _Worker:
    def __init__(self, process: Any, conn: Connection, stats: WorkerStats) -> None:
        self.process = process
        self.conn = conn
        self.stats = stats
        self.running: Unit | None = None


class LocalBackend(Backend):
    name = "local"

    def __init__(self, start_timeout: float = 300.0) -> None:
        self._ctx = mp.get_context("spawn")
        self._workers: dict[int, _Worker] = {}
        self._trainer: Trainer | None = None
        self._partitions: list[list[DataFile]] = []
        self._placement: Placement | None = None
        self._start_timeout = start_timeout
        # Lost workers keep their history so stats cover restarts (bytes read twice, etc.).
        self._history: dict[int, WorkerStats] = {}

    # -- lifecycle ----------------------------------------------------------------------
    def start(
        self, trainer: Trainer, partitions: Sequence[Sequence[DataFile]], placement: Placement
    ) -> None:
        self._trainer = trainer
        self._partitions = [list(p) for p in partitions]
        self._placement = placement
        for w in range(placement.workers):
            self._spawn(w, WorkerStats(w, placement.partition_of(w)))
        for w in range(placement.workers):
            self._await_ready(w)
        log.info("local backend: %d workers ready", placement.workers)

    def _spawn(self, worker: int, stats: WorkerStats) -> None:
        assert self._placement is not None  # set by start(), not user input
        parent, child = self._ctx.Pipe()
        files = self._partitions[self._placement.partition_of(worker)]
        process = self._ctx.Process(
            target=_main,
            args=(child, self._trainer, files, stats),
            name=f"trainport-select-worker-{worker}",
            daemon=True,
        )
        process.start()
        child.close()
        self._workers[worker] = _Worker(process, parent, stats)

    def _await_ready(self, worker: int) -> None:
        w = self._workers[worker]
        ready = wait([w.conn, w.process.sentinel], timeout=self._start_timeout)
        if w.conn not in ready or not w.conn.poll():
            raise JobError(
                f"select worker {worker} did not load partition "
                f"{w.stats.partition} (exit code {w.process.exitcode}); see its log above"
            )
        try:
            kind, stats = w.conn.recv()
        except EOFError:
            kind, stats = "exit", None
        if kind != "ready":
            raise JobError(f"select worker {worker} sent {kind!r} before it was ready")
        w.stats = stats

    def restart(self, worker: int) -> None:
        old = self._workers.get(worker)
        history = old.stats if old else WorkerStats(worker, worker)
        if old is not None:
            old.process.join(timeout=5)
            old.conn.close()
        self._spawn(worker, history)
        self._await_ready(worker)
        log.info("local backend: worker %d restarted and reloaded its partition", worker)

    def close(self) -> None:
        for w in self._workers.values():
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(None)
        for w in self._workers.values():
            w.process.join(timeout=10)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()
        self._workers.clear()

    # -- units --------------------------------------------------------------------------
    def submit(self, task: UnitTask) -> None:
        w = self._workers[task.unit.worker]
        if w.running is not None:
            raise JobError(f"worker {task.unit.worker} is busy with {w.running}")
        w.running = task.unit
        # A worker that died between units is reported by wait() through its sentinel.
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(("unit", task))

    def wait(self) -> list[Event]:
        busy = {k: w for k, w in self._workers.items() if w.running is not None}
        if not busy:
            return []
        handles: dict[Any, int] = {}
        for k, w in busy.items():
            handles[w.conn] = k
            handles[w.process.sentinel] = k
        ready = wait(list(handles))
        events: list[Event] = []
        seen: set[int] = set()
        for handle in ready:
            k = handles[handle]
            if k in seen:
                continue
            seen.add(k)
            w = busy[k]
            message = self._receive(w)
            if message is None:
                events.append(WorkerLost(k, w.running, f"exit code {w.process.exitcode}"))
                w.running = None
                continue
            if message[0] == "error":
                raise JobError(f"training unit {message[1]} failed on worker {k}: {message[2]}")
            _, done, stats = message
            assert isinstance(done, UnitDone)  # protocol invariant of our own worker
            w.stats = stats
            w.running = None
            events.append(done)
        return events

    @staticmethod
    def _receive(w: _Worker) -> tuple[Any, ...] | None:
        try:
            if w.conn.poll():
                return tuple(w.conn.recv())
        except (EOFError, OSError):
            pass
        # Sentinel fired with nothing to read: the process is gone.
        w.process.join(timeout=5)
        return None

    def stats(self) -> list[WorkerStats]:
        return [self._workers[k].stats for k in sorted(self._workers)]

    def pids(self) -> dict[int, int]:
        return {k: int(w.process.pid) for k, w in self._workers.items()}
