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

Which Python the executors run: PySpark fixes it when the SparkContext is created, from
``PYSPARK_PYTHON`` (``spark.pyspark.python`` is read only by ``spark-submit``), and falls
back to whatever ``python3`` is first on the executors' PATH. Started from a virtual
environment without ``spark-submit``, that is the machine's base interpreter, where neither
trainport nor the trainer imports. So a session this backend creates runs its executors on
:func:`executor_python` (this interpreter unless the user named another), and before the
barrier stage one plain task checks that an executor can import trainport and unpickle the
trainer, failing at once with the interpreter's path and what to set otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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

__all__ = ["ExecutorPython", "SparkBackend", "executor_python", "probe_executors"]

log = logging.getLogger(__name__)

_PYTHON_CONF = "spark.pyspark.python"


@dataclass(frozen=True)
class ExecutorPython:
    """What one executor's Python worker reported about itself."""

    executable: str
    prefix: str
    problem: str | None  # why trainport or the trainer does not load there, or None


def executor_python(conf: dict[str, str], environ: Mapping[str, str]) -> str:
    """The interpreter Spark's executors should run: the user's choice, else this one.

    ``spark.pyspark.python`` in the backend's ``conf`` wins, then ``PYSPARK_PYTHON``; else
    ``sys.executable``, the virtual environment's own ``python`` (not the base interpreter
    behind it), where trainport and the trainer's packages are installed.
    """
    return conf.get(_PYTHON_CONF) or environ.get("PYSPARK_PYTHON") or sys.executable


def _probe(trainer_blob: bytes) -> Callable[[Iterator[Any]], Iterator[ExecutorPython]]:
    """A task that reports the executor's interpreter and whether our code loads there.

    Built as a closure so cloudpickle ships it by value: a function pickled by reference
    would itself fail to unpickle where trainport is missing, with no useful report.
    """

    def probe(_rows: Iterator[Any]) -> Iterator[Any]:
        import importlib
        import pickle
        import sys

        problem = None
        try:
            importlib.import_module("trainport.select.backends.worker")
            pickle.loads(trainer_blob)
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        yield (sys.executable, sys.prefix, problem)

    return probe


def probe_executors(session: Any, trainer: Trainer | None = None) -> ExecutorPython:
    """Run one task on ``session``'s executors and report the interpreter it ran on.

    Raises :class:`JobError` naming the interpreter when the task cannot start there or when
    trainport (or ``trainer``) does not load in it.
    """
    from pyspark import cloudpickle

    sc = session.sparkContext
    python = getattr(sc, "pythonExec", "?")
    blob = cloudpickle.dumps(trainer) if trainer is not None else pickle.dumps(None)
    advice = (
        "Set PYSPARK_PYTHON (or the backend option conf: {spark.pyspark.python: ...}) to an "
        "interpreter that has trainport and the trainer's packages installed on every "
        "executor, e.g. this environment's python"
    )
    try:
        rows = sc.parallelize([0], 1).mapPartitions(_probe(blob)).collect()
    except Exception as exc:
        raise JobError(
            f"spark backend: a Python task could not run on the executors' interpreter "
            f"{python!r}: {_first_line(exc)}. {advice}"
        ) from exc
    report = ExecutorPython(*rows[0])
    if report.problem is not None:
        raise JobError(
            f"spark backend: the executors run {report.executable} (prefix {report.prefix}), "
            f"where trainport or the trainer does not load ({report.problem}). {advice}"
        )
    log.info("spark backend: executors run %s", report.executable)
    return report


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return text[:500]


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


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


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
        self.open_session(placement.workers)
        try:
            probe_executors(self._session, trainer)
        except JobError:
            self.close()  # the caller only closes a backend that started
            raise
        self._trainer = trainer
        self._partitions = [list(p) for p in partitions]
        self._placement = placement
        self._launch()

    def open_session(self, workers: int) -> Any:
        """The Spark session to run on: the active one, else a new one this backend owns."""
        from pyspark.sql import SparkSession

        if self._session is not None:
            return self._session
        active = SparkSession.getActiveSession()
        if active is not None:
            self._session = active
            return active
        builder = SparkSession.builder.master(self._master or f"local[{workers}]")
        builder = builder.appName("trainport-select")
        builder = builder.config("spark.ui.enabled", "false")
        python = executor_python(self._conf, os.environ)
        builder = builder.config(_PYTHON_CONF, python)
        for key, value in self._conf.items():
            builder = builder.config(key, value)
        # PySpark takes the executors' interpreter from PYSPARK_PYTHON when the context is
        # created, and only then: set it for that moment alone.
        with _environment("PYSPARK_PYTHON", python):
            self._session = builder.getOrCreate()
        self._owns_session = True
        return self._session

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
