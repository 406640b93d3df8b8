"""Bad input gets a clear AWS-style error, and the server stays up."""

from __future__ import annotations

import json
from typing import Any

from tests.server.conftest import client
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
