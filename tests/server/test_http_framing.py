"""Requests whose end a proxy and the server could place differently (request smuggling):
Content-Length beside Transfer-Encoding, or two Content-Lengths. Each is refused with 400
and its connection closed; the bytes after the point where one reading ends the request
are never answered as a request of their own. Raw sockets on 127.0.0.1, as an attacker
behind a proxy would send them."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.server.conftest import client

# What a smuggled request asks for: answered, it would be a second response (200).
SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

CASES = {
    # A proxy reading Content-Length forwards all; a server reading chunked stops at 0.
    "content-length then chunked": (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        % (5 + len(SMUGGLED))
        + SMUGGLED
    ),
    # The other way round: the smuggled request hides inside a chunk.
    "chunked then content-length": (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        b"%x\r\n" % len(SMUGGLED) + SMUGGLED + b"\r\n0\r\n\r\n"
    ),
    "two different content-lengths": (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 2\r\nContent-Length: %d\r\n\r\n{}" % (2 + len(SMUGGLED)) + SMUGGLED
    ),
    "two equal content-lengths": (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}" + SMUGGLED
    ),
    "a coding after chunked": (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n" + SMUGGLED
    ),
    "a list of content-lengths": (
        b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2, 2\r\n\r\n{}" + SMUGGLED
    ),
}


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` at once and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(data)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize("case", list(CASES))
def test_an_ambiguous_request_is_refused_and_nothing_after_it_is_answered(
    server: Any, case: str
) -> None:
    reply = exchange(server.port, CASES[case])
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 1, reply
    client(server).list_training_jobs()


def test_a_request_with_one_framing_is_answered_and_the_next_one_too(server: Any) -> None:
    """The control: the same bytes with one Content-Length are two requests, two answers."""
    body = b"{}"
    first = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n" + body
    last = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    reply = exchange(server.port, first + last)
    assert reply.count(b"HTTP/1.1 ") == 2, reply
    assert reply.startswith(b"HTTP/1.1 403 ")  # unsigned
    assert reply.rstrip().endswith(b'{"ok": true}')


def test_a_request_head_past_the_limit_is_refused(server: Any) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Filler: %s\r\n" % (b"a" * 70_000)
    reply = exchange(server.port, head + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
