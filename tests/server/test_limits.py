"""The server's bounds against abusive clients: forged signatures, idle and slow
connections, deeply nested bodies. Each is a real client on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.server.conftest import KEY_ID, SECRET, client, start_server
from tests.server.security_support import raw_call
from trainport.server.sigv4 import SigV4Verifier


@pytest.fixture
def quick_server(server_home: Any) -> Iterator[Any]:
    srv = start_server(idle_timeout=2, request_timeout=1)
    yield srv
    srv.close()


def _forged(server: Any, region: str) -> int:
    """A request signed for ``region`` with the server's key id but a wrong secret."""
    body = b"{}"
    req = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.1",
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
        },
    )
    SigV4Auth(Credentials(KEY_ID, "not-the-secret"), "sagemaker", region).add_auth(req)
    conn = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
        conn.sendall(
            f"POST / HTTP/1.1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode()
            + body
        )
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
        return int(reply.split()[1])
    finally:
        conn.close()


def test_forged_signatures_do_not_grow_the_key_cache(server: Any) -> None:
    verifier = server.protocol.verifier
    for i in range(SigV4Verifier.CACHE_SIZE + 50):
        assert _forged(server, f"forged-{i}") == 403
    assert verifier.cached_scopes <= 1
    client(server).list_training_jobs()  # an honest client still gets in
    assert verifier.cached_scopes == 1


def _closed_by_server(conn: socket.socket) -> bool:
    """Whether the server ends the connection (reads EOF or a reset) before the test's
    own 30 s socket timeout."""
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def test_an_idle_connection_is_closed(quick_server: Any) -> None:
    with socket.create_connection(("127.0.0.1", quick_server.port), timeout=30) as conn:
        assert _closed_by_server(conn)


def test_headers_that_never_end_are_cut_off(quick_server: Any) -> None:
    with socket.create_connection(("127.0.0.1", quick_server.port), timeout=30) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert _closed_by_server(conn)


def test_a_body_that_never_comes_is_cut_off(quick_server: Any) -> None:
    with socket.create_connection(("127.0.0.1", quick_server.port), timeout=30) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        assert _closed_by_server(conn)


def test_a_connection_in_use_stays_open(quick_server: Any) -> None:
    """One keep-alive connection, busy for longer than the idle and request deadlines
    together (2 s and 1 s), serves every request without being closed or replaced."""
    body = b"{}"
    conn = http.client.HTTPConnection("127.0.0.1", quick_server.port, timeout=30)
    try:
        served = 0
        busy_until = time.monotonic() + 4
        first_socket = None
        while served < 2 or time.monotonic() < busy_until:
            req = AWSRequest(
                method="POST",
                url=quick_server.url + "/",
                data=body,
                headers={
                    "Content-Type": "application/x-amz-json-1.1",
                    "X-Amz-Target": "SageMaker.ListTrainingJobs",
                },
            )
            SigV4Auth(Credentials(KEY_ID, SECRET), "sagemaker", "us-east-1").add_auth(req)
            conn.request("POST", "/", body=body, headers=dict(req.headers.items()))
            reply = conn.getresponse()
            assert reply.status == 200
            assert "TrainingJobSummaries" in json.loads(reply.read())
            # http.client drops a socket the server said it would close, and opens a new one
            # for the next request: the same socket throughout is the same connection.
            assert conn.sock is not None
            first_socket = first_socket or conn.sock
            assert conn.sock is first_socket, f"connection replaced after {served + 1} requests"
            served += 1
    finally:
        conn.close()


@pytest.mark.parametrize("depth", [100_000, 65])
def test_a_deeply_nested_body_is_a_validation_error(server: Any, depth: int) -> None:
    body = b'{"TrainingJobName": ' + b"[" * depth + b"]" * depth + b"}"
    status, err = raw_call(server, body, target="SageMaker.DescribeTrainingJob")
    assert (status, err["__type"]) == (400, "ValidationException")
    assert "levels deep" in err["message"]
    client(server).list_training_jobs()


def test_a_body_of_normal_depth_is_read(server: Any) -> None:
    body = json.dumps({"NameContains": "x"}).encode()
    status, _ = raw_call(server, body, target="SageMaker.ListTrainingJobs")
    assert status == 200
