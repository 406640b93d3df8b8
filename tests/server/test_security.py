"""Requests that must be refused: unsigned, a wrong secret, a tampered body, a signature
dated outside the 15-minute window; the server goes on serving signed clients."""

from __future__ import annotations

import datetime as dt
import hashlib
import http.client
import json
from typing import Any
from unittest import mock

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.server.conftest import KEY_ID, SECRET, client

TARGET = "SageMaker.DescribeTrainingJob"


def signed(server: Any, body: bytes, secret: str = SECRET) -> AWSRequest:
    req = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": TARGET},
    )
    SigV4Auth(Credentials(KEY_ID, secret), "sagemaker", "us-east-1").add_auth(req)
    return req


def send(server: Any, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", "/", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def still_serving(server: Any) -> None:
    listed = client(server).list_training_jobs()
    assert listed["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_unsigned_request_is_refused(server: Any) -> None:
    body = json.dumps({"TrainingJobName": "x"}).encode()
    status, err = send(
        server, body, {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": TARGET}
    )
    assert status == 403
    assert err["__type"] == "MissingAuthenticationTokenException"
    still_serving(server)


def test_wrong_secret_is_refused(server: Any) -> None:
    with pytest.raises(ClientError) as exc:
        client(server, secret="not-the-secret").list_training_jobs()
    assert exc.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    still_serving(server)


def test_tampered_body_is_refused(server: Any) -> None:
    req = signed(server, json.dumps({"TrainingJobName": "mine"}).encode())
    tampered = json.dumps({"TrainingJobName": "yours"}).encode()
    headers = {k: v for k, v in req.headers.items()}
    headers["Content-Length"] = str(len(tampered))
    status, err = send(server, tampered, headers)
    assert status == 403
    assert err["__type"] == "InvalidSignatureException"
    # The untampered request is accepted (and answers: no such job).
    status, err = send(server, req.body, dict(req.headers.items()))
    assert (status, err["__type"]) == (400, "ValidationException")
    still_serving(server)


@pytest.mark.parametrize("minutes", [-16, 16])
def test_signature_outside_15_minutes_is_refused(server: Any, minutes: int) -> None:
    when = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(minutes=minutes)
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        req = signed(server, json.dumps({"TrainingJobName": "x"}).encode())
    status, err = send(server, req.body, dict(req.headers.items()))
    assert status == 403
    assert err["__type"] == "InvalidSignatureException"
    assert "Signature expired" in err["message"]
    still_serving(server)


def test_dashboard_data_needs_the_token(server: Any) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/api/jobs")
    assert conn.getresponse().status == 401
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/api/jobs", headers={"Authorization": f"Bearer {server.dashboard.token}"})
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read()) == {"jobs": [], "next": None}
    conn.close()


def test_a_body_hash_header_does_not_vouch_for_a_different_body(server: Any) -> None:
    """A signed X-Amz-Content-SHA256 names the body the client signed; the server hashes
    the body it received, so a request replayed with another body is refused."""
    mine = json.dumps({"TrainingJobName": "mine"}).encode()
    req = AWSRequest(
        method="POST",
        url=server.url + "/",
        data=mine,
        headers={
            "Content-Type": "application/x-amz-json-1.1",
            "X-Amz-Target": TARGET,
            "X-Amz-Content-SHA256": hashlib.sha256(mine).hexdigest(),
        },
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "sagemaker", "us-east-1").add_auth(req)
    headers = dict(req.headers.items())
    status, err = send(server, mine, headers)
    assert (status, err["__type"]) == (400, "ValidationException")  # accepted: no such job
    yours = json.dumps({"TrainingJobName": "yours"}).encode()
    headers["Content-Length"] = str(len(yours))
    status, err = send(server, yours, headers)
    assert (status, err["__type"]) == (403, "InvalidSignatureException")
    still_serving(server)
