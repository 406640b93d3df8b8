"""A URI of a request with '.' or '..' segments is refused naming the field that held it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import job, put


def _refusal(sm: Any, request: dict[str, Any]) -> str:
    with pytest.raises(ClientError) as caught:
        sm.create_training_job(**request)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    return str(caught.value.response["Error"]["Message"])


def test_dotdot_in_the_source_uri_names_its_field(server: Any, sm: Any) -> None:
    request = job("dotdot-src", "print(1)")
    # Script mode: the SDK's hyperparameters, no entrypoint of its own.
    del request["AlgorithmSpecification"]["ContainerEntrypoint"]
    request["HyperParameters"] = {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"s3://data/src/../sourcedir.tar.gz"',
    }
    message = _refusal(sm, request)
    assert "HyperParameters.sagemaker_submit_directory" in message
    assert "embedded store" not in message


def test_dotdot_in_a_manifest_prefix_names_its_field(
    server: Any, server_home: Path, sm: Any
) -> None:
    put(server_home, "data", "m.json", json.dumps([{"prefix": "s3://data/q/../"}, "a"]))
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "ManifestFile", "S3Uri": "s3://data/m.json"}},
    }
    message = _refusal(sm, job("dotdot-manifest", "print(1)", InputDataConfig=[channel]))
    assert "manifest s3://data/m.json prefix" in message
    assert "embedded store" not in message
