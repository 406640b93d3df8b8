"""The worker side shared by the local and Spark backends: hold a partition, run units.

:func:`serve` speaks a tiny message protocol over a
:class:`multiprocessing.connection.Connection` (a pipe for local processes, a socket for
Spark tasks): the worker first sends ``("ready", stats)``, then answers each
``("unit", UnitTask)`` with ``("done", UnitDone, stats)`` until it receives ``None``.
"""

from __future__ import annotations

import logging
import resource
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from trainport.select.backends.api import UnitDone, UnitTask, WorkerStats
from trainport.select.partition import DataFile, fetch
from trainport.select.trainer import Trainer

__all__ = ["load", "peak_rss", "serve"]

log = logging.getLogger(__name__)


def peak_rss() -> int:
    # ru_maxrss is in KiB on Linux.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def load(trainer: Trainer, files: Sequence[DataFile], stats: WorkerStats, cache: Path) -> Any:
    """Fetch and load a partition, counting the bytes read."""
    paths = [fetch(f, cache) for f in files]
    data = trainer.load_partition(paths)
    stats.bytes_read += sum(p.stat().st_size for p in paths)
    stats.data_bytes = trainer.data_bytes(data)
    stats.loads += 1
    stats.peak_rss = peak_rss()
    return data


def run_unit(trainer: Trainer, data: Any, task: UnitTask) -> UnitDone:
    started = time.time()
    state, metrics = trainer.train_unit(task.state, data, task.config, task.epoch)
    return UnitDone(task.unit, state, metrics, len(state), started, time.time())


def serve(
    conn: Connection, trainer: Trainer, files: Sequence[DataFile], stats: WorkerStats
) -> None:
    with tempfile.TemporaryDirectory(prefix="trainport-select-") as cache:
        data = load(trainer, files, stats, Path(cache))
        conn.send(("ready", stats))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return  # the driver went away; nothing to report to
            if msg is None:
                return
            _, task = msg
            try:
                done = run_unit(trainer, data, task)
            except Exception as exc:
                # A failing trainer is the user's bug, not a lost worker: report it so the
                # driver stops instead of retrying the unit forever.
                log.exception("unit %s failed", task.unit)
                conn.send(("error", task.unit, f"{type(exc).__name__}: {exc}"))
                continue
            stats.peak_rss = peak_rss()
            conn.send(("done", done, stats))
