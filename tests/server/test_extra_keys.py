"""More than one key pair: the server's own and TRAINPORT_SERVER_EXTRA_KEYS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.server.conftest import start_server

EXTRA_ID, EXTRA_SECRET = "S3KEYOFTHEUSER000001", "the-s3-secret"


def _logs(server: Any, key_id: str, secret: str) -> Any:
    return boto3.client(
        "logs",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )


@pytest.fixture
def file_key_server(server_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A server whose own key is created in its key file, plus one extra pair."""
    monkeypatch.delenv("TRAINPORT_SERVER_KEYS")
    monkeypatch.setenv("TRAINPORT_SERVER_EXTRA_KEYS", f"{EXTRA_ID}:{EXTRA_SECRET}")
    srv = start_server()
    yield srv
    srv.close()


def test_the_own_key_and_an_extra_pair_are_both_accepted(file_key_server: Any) -> None:
    own = file_key_server.created_key
    assert own is not None
    for key_id, secret in ((own.key_id, own.secret), (EXTRA_ID, EXTRA_SECRET)):
        streams = _logs(file_key_server, key_id, secret).describe_log_streams(
            logGroupName="/aws/sagemaker/TrainingJobs"
        )
        assert streams["logStreams"] == []
    with pytest.raises(ClientError) as caught:
        _logs(file_key_server, EXTRA_ID, "wrong").describe_log_streams(
            logGroupName="/aws/sagemaker/TrainingJobs"
        )
    assert caught.value.response["Error"]["Code"] == "InvalidSignatureException"


def test_an_extra_pair_cannot_replace_an_own_secret(
    server_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPORT_SERVER_KEYS", "OWNKEY:own-secret")
    monkeypatch.setenv("TRAINPORT_SERVER_EXTRA_KEYS", "OWNKEY:other-secret")
    srv = start_server()
    try:
        _logs(srv, "OWNKEY", "own-secret").describe_log_streams(
            logGroupName="/aws/sagemaker/TrainingJobs"
        )
        with pytest.raises(ClientError):
            _logs(srv, "OWNKEY", "other-secret").describe_log_streams(
                logGroupName="/aws/sagemaker/TrainingJobs"
            )
    finally:
        srv.close()
