"""How long and how much a client may take: the server's connection limits.

HTTP itself is uvicorn's, with httptools' parser (llhttp, the parser of Node.js). That
parser refuses the framings that let a proxy and a server disagree on where a request
ends: Content-Length beside Transfer-Encoding, a repeated Content-Length, a
Transfer-Encoding whose last coding is not chunked. uvicorn answers those 400 and closes
the connection, so no byte of such a request is ever read as a request of its own.

uvicorn bounds the wait between two requests of a connection (its keep-alive timeout) but
not a connection that never sends its first request, nor a request that trickles in a
byte at a time. :class:`LimitedHttpProtocol` adds both, as one deadline per connection
that follows the request's life through the parser's callbacks:

- connected, or every answer given: the next request must begin within ``idle_timeout``;
- a request has begun: its head and body must have arrived within ``request_timeout``;
- a request has arrived: no deadline while it is handled (an operation takes the time it
  takes), nor while earlier requests wait for their answers.

Past its deadline the connection is closed. A request head over ``max_head_bytes`` is
refused (400) like any malformed request.

uvicorn writes a response's head and its body separately. The protocol hands it a
transport that sends what was written in one turn of the event loop as one write: one
system call and one packet for a small response, so a client wakes once to read it, not
once for the head and again for the body.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ConnectionLimits", "HeadTooLarge", "LimitedHttpProtocol", "limited_protocol"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    # Seconds a connection may wait for its next request, and a request may take to
    # arrive once it has begun.
    idle_timeout: float = 30.0
    request_timeout: float = 15.0
    # Bytes of request line and headers; no client of this API sends a tenth of it.
    max_head_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if self.idle_timeout <= 0 or self.request_timeout <= 0:
            raise ValueError("connection timeouts must be positive")


class _CoalescingTransport:
    """A transport whose writes in one turn of the event loop go out together."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():  # else the client is gone: nobody to read
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeadTooLarge(Exception):
    """Raised inside the parser's callback; httptools turns it into a parse error, which
    uvicorn answers with 400 and a closed connection."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for every moment a client owes us
    bytes (see the module's docstring)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._deadline: asyncio.TimerHandle | None = None
        self._reading = False  # a request has begun and not yet fully arrived
        self._unanswered = 0  # requests that have arrived and wait for their answers
        self._head_bytes = 0

    # -- the deadline -----------------------------------------------------------------------

    def _arm(self, seconds: float, why: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, why)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, why: str) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.debug("closing a connection from %s: %s", self.client, why)
            self.transport.close()

    def _await_next_request(self) -> None:
        if not self._reading and self._unanswered <= 0:
            self._arm(self._limits.idle_timeout, "idle too long")

    # -- the connection's and the request's life --------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        coalescing = _CoalescingTransport(cast(asyncio.Transport, transport), self.loop)
        super().connection_made(cast(asyncio.Transport, coalescing))
        self._await_next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = True
        self._head_bytes = 0
        self._arm(self._limits.request_timeout, "request not sent in time")

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = False
        self._unanswered += 1
        if self._unanswered > 0:
            self._disarm()
        else:  # answered before it had all arrived (a refusal): wait for the next one
            self._await_next_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._unanswered -= 1
        self._await_next_request()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_head_bytes:
            raise HeadTooLarge(f"request head over {self._limits.max_head_bytes} bytes")


def limited_protocol(limits: ConnectionLimits) -> Any:
    """What uvicorn's ``Config(http=...)`` takes: a factory of protocols with ``limits``.

    ``Any``: uvicorn types the option as a protocol class, and calls it with keywords."""
    return functools.partial(LimitedHttpProtocol, limits=limits)
