"""The Spark backend: long-running workers inside one barrier stage, as Cerebro runs MOP.

A dummy RDD with one partition per worker is run as a *barrier* stage, so Spark launches
all worker tasks at once (or not at all). Each task connects back to a listener on the
driver, authenticates with a per-run key, loads its data partition and then serves units
with the same protocol as the local backend's processes (:mod:`.worker`). The driver blocks
in :func:`multiprocessing.connection.wait` on the task connections.

Spark restarts a barrier stage only as a whole, so a lost task cannot be replaced alone:
with replicas the epoch continues on the other copies while Spark keeps them running;
otherwise the run fails with a :class:`~trainport.errors.JobError` and must be resumed.
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
        stats = WorkerStats(worker, placement.partition_of(worker))
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
        server = socket.create_server((self._host, 0))
        server.settimeout(self._timeout)
        authkey = os.urandom(32)
        task = _task(
            server.getsockname()[:2], authkey, trainer, [list(p) for p in partitions], placement
        )
        sc = self._session.sparkContext

        def job() -> None:
            try:
                sc.parallelize(range(n), n).barrier().mapPartitions(task).collect()
            except BaseException as exc:  # surfaced to the driver as lost workers
                self._job_error = exc
                log.error("spark backend: barrier stage ended: %s", exc)

        self._job = threading.Thread(target=job, name="trainport-select-spark", daemon=True)
        self._job.start()
        deadline = time.monotonic() + self._timeout
        try:
            while len(self._conns) < n:
                if self._job_error is not None or time.monotonic() > deadline:
                    raise JobError(
                        f"spark backend: only {len(self._conns)} of {n} barrier tasks connected "
                        f"({self._job_error or 'timed out'}); the cluster needs {n} free slots"
                    )
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                conn = Connection(sock.detach())
                deliver_challenge(conn, authkey)
                answer_challenge(conn, authkey)
                kind, worker = conn.recv()
                if kind != "hello":
                    raise JobError(f"spark backend: a task sent {kind!r} instead of hello")
                self._conns[worker] = conn
        finally:
            server.close()
        for worker, conn in self._conns.items():
            kind, stats = conn.recv()
            if kind != "ready":
                raise JobError(f"spark worker {worker} failed to load its partition")
            self._stats[worker] = stats
        log.info("spark backend: %d barrier tasks ready", n)

    def restart(self, worker: int) -> None:
        raise JobError(
            f"spark worker {worker} was lost and its partition has no other copy; Spark "
            "restarts barrier stages only as a whole. Rerun with replicas >= 2 or use the "
            "local or ray backend"
        )

    def submit(self, task: UnitTask) -> None:
        self._running[task.unit.worker] = task.unit
        # A send to a dead task fails quietly: wait() reports it as a lost worker.
        with contextlib.suppress(OSError):
            self._conns[task.unit.worker].send(("unit", task))

    def wait(self) -> list[Event]:
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
