"""Job records through one SQLite connection per server thread.

Opening a connection to a WAL database costs far more than a read through an open one
(about 0.3 ms against 0.01 ms here: the shared-memory index is mapped anew each time), and
the server answers many small reads. :class:`ThreadConnectionDB` keeps the connection
:class:`~trainport.jobs.db.JobDB` opens, with its own settings, for as long as a thread
holds it (a thread of the server's pool, or its event loop's, for as long as it serves).
Reads still see every commit of other processes (the supervisors): each statement outside a
transaction starts a fresh read transaction.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainport.jobs.db import JobDB

__all__ = ["ThreadConnectionDB"]


class ThreadConnectionDB(JobDB):
    def __init__(self, path: Path) -> None:
        self._local = threading.local()
        super().__init__(path)

    def hold(self) -> None:
        """Keep one connection for this thread until :meth:`release` (from this thread)."""
        self._local.hold = True

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not getattr(self._local, "hold", False):
            with super()._connect() as fresh:
                yield fresh
            return
        held: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if held is None:
            opener: Any = super()._connect()
            held = opener.__enter__()
            self._local.conn, self._local.opener = held, opener
        yield held

    def release(self) -> None:
        """Close this thread's held connection, if any."""
        opener = getattr(self._local, "opener", None)
        self._local.hold = False
        if opener is not None:
            self._local.conn = self._local.opener = None
            opener.__exit__(None, None, None)
