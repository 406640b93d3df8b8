"""The server under many clients at once: thousands of idle connections held open while
others are served, and hundreds of requests arriving together, each answered."""

from __future__ import annotations

import http.client
import json
import resource
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.conftest import require
from tests.server.conftest import KEY_ID, SECRET, client

IDLE = 2000
CONCURRENT = 300


@pytest.fixture
def many_files() -> Iterator[None]:
    """Room for IDLE connections at both ends (this process holds both)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * IDLE + 1000
    require(
        hard == resource.RLIM_INFINITY or hard >= wanted,
        f"the open-files limit is {hard}; these tests need {wanted} (ulimit -Hn)",
    )
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _still_open(conn: socket.socket) -> bool:
    conn.setblocking(False)
    try:
        return conn.recv(1) != b""  # data from a server that says nothing: not expected
    except BlockingIOError:
        return True  # nothing to read, not closed
    except ConnectionError:
        return False


def test_thousands_of_idle_connections_leave_the_server_serving(
    server: Any, many_files: None
) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(IDLE)]
    try:
        # Half of them have begun a request and stopped.
        for conn in idle[::2]:
            conn.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sm = client(server)
        for _ in range(3):
            assert sm.list_training_jobs()["TrainingJobSummaries"] == []
        assert all(_still_open(conn) for conn in idle)
    finally:
        for conn in idle:
            conn.close()


def _signed_list(port: int) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"MaxResults": 10}).encode()
    req = AWSRequest(
        method="POST",
        url=f"http://127.0.0.1:{port}/",
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.1",
            "X-Amz-Target": "SageMaker.ListTrainingJobs",
        },
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "sagemaker", "us-east-1").add_auth(req)
    return body, dict(req.headers.items())


def test_hundreds_of_requests_at_once_are_all_answered(server: Any, many_files: None) -> None:
    body, headers = _signed_list(server.port)
    conns = [
        http.client.HTTPConnection("127.0.0.1", server.port, timeout=60) for _ in range(CONCURRENT)
    ]
    for conn in conns:
        conn.connect()
    statuses: list[int] = []
    failures: list[BaseException] = []
    gate = threading.Barrier(CONCURRENT)
    lock = threading.Lock()

    def ask(conn: http.client.HTTPConnection) -> None:
        try:
            gate.wait()
            conn.request("POST", "/", body=body, headers=headers)
            resp = conn.getresponse()
            reply = json.loads(resp.read())
            with lock:
                statuses.append(resp.status)
            assert reply == {"TrainingJobSummaries": []}, reply
        except BaseException as exc:  # reported below, with the others
            with lock:
                failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=ask, args=(conn,)) for conn in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert statuses == [200] * CONCURRENT
