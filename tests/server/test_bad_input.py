"""Bad input gets a clear AWS-style error, and the server stays up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import client, job, start_server
from tests.server.security_support import raw_call


def test_body_that_is_not_json(server: Any) -> None:
    status, err = raw_call(server, b"{not json", target="SageMaker.ListTrainingJobs")
    assert (status, err["__type"]) == (400, "SerializationException")
    assert "not valid JSON" in err["message"]
    client(server).list_training_jobs()


def test_unknown_target(server: Any) -> None:
    status, err = raw_call(server, b"{}", target="SageMaker.DeleteEverything")
    assert (status, err["__type"]) == (400, "UnknownOperationException")
    assert "SageMaker.DeleteEverything" in err["message"]
    client(server).list_training_jobs()


def test_oversize_body(server: Any) -> None:
    body = json.dumps({"TrainingJobName": "x" * (2 * 1024 * 1024)}).encode()
    status, err = raw_call(server, body, target="SageMaker.DescribeTrainingJob")
    assert (status, err["__type"]) == (413, "RequestEntityTooLarge")
    assert str(server.protocol.max_body) in err["message"]
    client(server).list_training_jobs()


def test_wrong_content_type(server: Any) -> None:
    status, err = raw_call(
        server, b"{}", target="SageMaker.ListTrainingJobs", content_type="text/plain"
    )
    assert (status, err["__type"]) == (400, "SerializationException")
    assert "application/x-amz-json-1.1" in err["message"]
    client(server).list_training_jobs()


def test_a_request_naming_the_servers_files_is_refused(server_home: Path, tmp_path: Path) -> None:
    """A client must not make the sandbox show it files of the server's machine."""
    secret = tmp_path / "operator-secret.txt"
    secret.write_text("not for clients")
    srv = start_server()
    try:
        sm = client(srv)
        reading = job("reads-host-file", "print(1)")
        reading["AlgorithmSpecification"]["ContainerEntrypoint"] = ["cat", str(secret)]
        with pytest.raises(ClientError) as caught:
            sm.create_training_job(**reading)
        error = caught.value.response["Error"]
        assert error["Code"] == "ValidationException"
        assert "ContainerEntrypoint[1]" in error["Message"]
        assert "TRAINPORT_SERVER_ALLOW_HOST_PATHS" in error["Message"]
        image = job("host-image", "print(1)")
        image["AlgorithmSpecification"]["TrainingImage"] = str(tmp_path)
        del image["AlgorithmSpecification"]["ContainerEntrypoint"]
        with pytest.raises(ClientError, match="TrainingImage"):
            sm.create_training_job(**image)
        # System files are shown to every job anyway; those are fine.
        sm.create_training_job(**job("system-python", "print(1)"))
    finally:
        srv.close()
