"""The Spark backend: long-running workers inside one barrier stage, as Cerebro runs MOP.

A dummy RDD with one partition per worker is run as a *barrier* stage, so Spark launches
all worker tasks at once (or not at all). Each task connects back to a listener on the
driver, authenticates with a per-run key, loads its data partition and then serves units
with the same protocol as the local backend's processes (:mod:`.worker`). The driver blocks
in :func:`multiprocessing.connection.wait` on the task connections.

Spark runs a barrier stage only as a whole: when one task dies, Spark aborts the others.
So :meth:`SparkBackend.restart` launches the whole stage again (every worker reloads its
partition) and reports the units that were running elsewhere as lost; the driver re-runs
them from the models' last states, as with any lost unit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait
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

__all__ = ["SparkBackend"]

log = logging.getLogger(__name__)


def _task(
    address: tuple[str, int],
    authkey: bytes,
    trainer: Trainer,
    partitions: list[list[DataFile]],
    placement: Placement,
    history: dict[int, WorkerStats],
) -> Callable[[Iterator[Any]], Iterator[int]]:
    """The function every barrier task runs; it becomes one MOP worker."""

    def run(_rows: Iterator[Any]) -> Iterator[int]:
        from pyspark import BarrierTaskContext

        worker = BarrierTaskContext.get().partitionId()
        sock = socket.create_connection(address)
        conn = Connection(sock.detach())
        answer_challenge(conn, authkey)
        deliver_challenge(conn, authkey)
        conn.send(("hello", worker))
        # Counters carry on from earlier launches of the stage: every load and byte counts.
        stats = history.get(worker) or WorkerStats(worker, placement.partition_of(worker))
        serve(conn, trainer, partitions[placement.partition_of(worker)], stats)
        conn.close()
        yield worker

    return run


class SparkBackend(Backend):
    name = "spark"

    def __init__(
        self,
        master: str | None = None,
        driver_host: str = "127.0.0.1",
        start_timeout: float = 300.0,
        conf: dict[str, str] | None = None,
    ) -> None:
        self._master = master
        self._host = driver_host
        self._timeout = start_timeout
        self._conf = dict(conf or {})
        self._conns: dict[int, Connection] = {}
        self._stats: dict[int, WorkerStats] = {}
        self._running: dict[int, Unit] = {}
        self._job: threading.Thread | None = None
        self._job_error: BaseException | None = None
        self._session: Any = None
        self._owns_session = False
        self._trainer: Trainer | None = None
        self._partitions: list[list[DataFile]] = []
        self._placement: Placement | None = None
        self._lost: list[WorkerLost] = []
        # Workers whose current connection has not been lost since the last (re)launch.
        self._fresh: set[int] = set()

    def start(
        self, trainer: Trainer, partitions: Sequence[Sequence[DataFile]], placement: Placement
    ) -> None:
        from pyspark.sql import SparkSession

        n = placement.workers
        active = SparkSession.getActiveSession()
        if active is not None:
            self._session = active
        else:
            builder = SparkSession.builder.master(self._master or f"local[{n}]")
            builder = builder.appName("trainport-select")
            # Workers must run this interpreter, where trainport and the trainer import.
            builder = builder.config("spark.pyspark.python", sys.executable)
            builder = builder.config("spark.ui.enabled", "false")
            for key, value in self._conf.items():
                builder = builder.config(key, value)
            self._session = builder.getOrCreate()
            self._owns_session = True
        self._trainer = trainer
        self._partitions = [list(p) for p in partitions]
        self._placement = placement
        self._launch()

    def _launch(self) -> None:
        """Run the barrier stage and wait until every task has connected and loaded."""
        # Both set by start(), not user input.
        assert self._placement is not None and self._trainer is not None
        n = self._placement.workers
        server = socket.create_server((self._host, 0))
        # Short accept timeouts so a failed stage is noticed well before the deadline.
        server.settimeout(1.0)
        authkey = os.urandom(32)
        task = _task(
            server.getsockname()[:2],
            authkey,
            self._trainer,
            self._partitions,
            self._placement,
            dict(self._stats),
        )
        sc = self._session.sparkContext
        self._job_error = None

        def job() -> None:
            try:
                sc.parallelize(range(n), n).barrier().mapPartitions(task).collect()
            except BaseException as exc:  # surfaced to the driver as lost workers
                self._job_error = exc
                log.warning("spark backend: barrier stage ended: %s", str(exc)[:500])

        self._job = threading.Thread(target=job, name="trainport-select-spark", daemon=True)
        self._job.start()
        deadline = time.monotonic() + self._timeout
        conns: dict[int, Connection] = {}
        try:
            while len(conns) < n:
                if self._job_error is not None or time.monotonic() > deadline:
                    raise JobError(
                        f"spark backend: only {len(conns)} of {n} barrier tasks connected "
                        f"({self._job_error or 'timed out'}); the cluster needs {n} free slots"
                    )
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                sock.settimeout(None)
                conn = Connection(sock.detach())
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                kind, worker = conn.recv()
                if kind != "hello":
                    raise JobError(f"spark backend: a task sent {kind!r} instead of hello")
                conns[worker] = conn
        finally:
            server.close()
        for worker, conn in conns.items():
            kind, stats = conn.recv()
            if kind != "ready":
                raise JobError(f"spark worker {worker} failed to load its partition")
            self._stats[worker] = stats
        self._conns = conns
        self._fresh = set(conns)
        log.info("spark backend: %d barrier tasks ready", n)

    def restart(self, worker: int) -> None:
        """Restart the whole barrier stage: Spark cannot replace one barrier task alone.

        Units still running on the other tasks die with the stage; they are reported as
        lost by the next :meth:`wait`, and restarting those workers afterwards is a no-op.
        """
        if worker in self._fresh:
            return  # already relaunched with the stage that replaced the lost one
        for conn in self._conns.values():
            with contextlib.suppress(OSError):
                conn.close()
        for other, unit in sorted(self._running.items()):
            if other != worker:
                self._lost.append(WorkerLost(other, unit, "barrier stage restarted"))
        self._running.clear()
        if self._job is not None:
            self._job.join(timeout=self._timeout)
        log.info("spark backend: restarting the barrier stage after worker %d was lost", worker)
        self._launch()

    def submit(self, task: UnitTask) -> None:
        self._running[task.unit.worker] = task.unit
        # A send to a dead task fails quietly: wait() reports it as a lost worker.
        with contextlib.suppress(OSError):
            self._conns[task.unit.worker].send(("unit", task))

    def wait(self) -> list[Event]:
        if self._lost:
            lost: list[Event] = list(self._lost)
            self._lost.clear()
            return lost
        busy = {w: self._conns[w] for w in self._running}
        if not busy:
            return []
        events: list[Event] = []
        ready = wait(list(busy.values()))
        for worker, conn in busy.items():
            if conn not in ready:
                continue
            unit = self._running.pop(worker)
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._fresh.discard(worker)
                events.append(WorkerLost(worker, unit, "barrier task connection closed"))
                continue
            if message[0] == "error":
                raise JobError(
                    f"training unit {message[1]} failed on worker {worker}: {message[2]}"
                )
            _, done, new_stats = message
            assert isinstance(done, UnitDone)  # protocol invariant of our own worker
            self._stats[worker] = new_stats
            events.append(done)
        return events

    def stats(self) -> list[WorkerStats]:
        return [self._stats[w] for w in sorted(self._stats)]

    def close(self) -> None:
        for conn in self._conns.values():
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        self._conns.clear()
        if self._job is not None:
            self._job.join(timeout=60)
        if self._owns_session and self._session is not None:
            self._session.stop()
            self._session = None
