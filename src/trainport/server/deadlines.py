"""Deadlines for the server's connections: an idle client is let go, a slow one cut off.

One handler thread serves one connection and blocks reading while it waits for a request,
so a client that connects and sends nothing, or a header line a minute, would hold a thread
and a file descriptor for ever. Each handler says what it is waiting for: the next request
(at most ``idle_timeout`` seconds), or the rest of a request whose first line has come (at
most ``request_timeout`` seconds for its headers and body, however slowly they trickle in).
One reaper thread shuts down the socket of a connection past its deadline; the blocked read
then returns and the handler ends. While a request is being handled there is no deadline:
an operation takes the time it takes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

__all__ = ["ConnectionDeadlines"]

log = logging.getLogger(__name__)


class ConnectionDeadlines:
    def __init__(self, idle_timeout: float, request_timeout: float) -> None:
        if idle_timeout <= 0 or request_timeout <= 0:
            raise ValueError("connection timeouts must be positive")
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        # How often the reaper looks: a fraction of the shorter timeout, so a connection
        # outlives its deadline by little, and at most once a second.
        self._tick = min(1.0, max(0.05, min(idle_timeout, request_timeout) / 4))
        self._due: dict[socket.socket, tuple[float, str]] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def waiting(self, conn: socket.socket) -> None:
        """``conn`` waits for its next request."""
        self._set(conn, time.monotonic() + self.idle_timeout, "idle")

    def reading(self, conn: socket.socket) -> None:
        """A request has begun on ``conn``; the rest of it must come in time."""
        self._set(conn, time.monotonic() + self.request_timeout, "slow")

    def handling(self, conn: socket.socket) -> None:
        """``conn``'s request has been read: no deadline while it is handled."""
        with self._lock:
            self._due.pop(conn, None)

    forget = handling

    def _set(self, conn: socket.socket, when: float, why: str) -> None:
        with self._lock:
            self._due[conn] = (when, why)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._reap, name="deadlines", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _reap(self) -> None:
        while not self._stopped.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                late = [(c, why) for c, (when, why) in self._due.items() if when <= now]
                for conn, _ in late:
                    del self._due[conn]
            for conn, why in late:
                log.debug(
                    "closing a connection: %s",
                    "idle too long" if why == "idle" else "request not sent in time",
                )
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
