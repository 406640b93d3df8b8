"""Requests are checked against botocore's service model and trainport's rules."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.conftest import request
from trainport.errors import ValidationError
from trainport.spec import parse_request


def test_a_request_boto3_would_send_is_accepted() -> None:
    spec = parse_request(
        request(
            "ok-1",
            HyperParameters={"epochs": "3", "name": '"quoted"'},
            InputDataConfig=[
                {
                    "ChannelName": "train",
                    "DataSource": {
                        "S3DataSource": {
                            "S3DataType": "S3Prefix",
                            "S3Uri": "s3://bucket/train/",
                            "S3DataDistributionType": "ShardedByS3Key",
                        }
                    },
                    "ContentType": "text/csv",
                    "ShuffleConfig": {"Seed": 3},
                }
            ],
            CheckpointConfig={"S3Uri": "s3://bucket/ckpt"},
        )
    )
    assert spec.hyperparameters == {"epochs": "3", "name": '"quoted"'}
    (channel,) = spec.channels
    assert channel.input_data_config_entry() == {
        "TrainingInputMode": "File",
        "S3DistributionType": "ShardedByS3Key",
        "RecordWrapperType": "None",
        "ContentType": "text/csv",
    }
    assert channel.shuffle_seed == 3
    assert spec.checkpoint_local_path == "/opt/ml/checkpoints"


@pytest.mark.parametrize("name", ["bad_name", "-lead", "trail-", "a" * 64, "spa ce", ""])
def test_invalid_job_names(name: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(f"TrainingJobName {name!r} is invalid")):
        parse_request(request(name))


def test_unknown_field_is_named_with_its_path() -> None:
    body = request("x1")
    body["AlgorithmSpecification"]["TrainingImagee"] = "typo"
    with pytest.raises(
        ValidationError, match='Unknown parameter in AlgorithmSpecification: "TrainingImagee"'
    ):
        parse_request(body)
    with pytest.raises(ValidationError, match='Unknown parameter in input: "Extra"'):
        parse_request(request("x1", Extra=1))


def test_missing_and_malformed_required_fields() -> None:
    body = request("x1")
    del body["OutputDataConfig"]
    with pytest.raises(
        ValidationError, match='Missing required parameter in input: "OutputDataConfig"'
    ):
        parse_request(body)
    with pytest.raises(ValidationError, match=r"OutputDataConfig\.S3OutputPath"):
        parse_request(request("x1", OutputDataConfig={"S3OutputPath": 5}))
    with pytest.raises(ValidationError, match="MaxRuntimeInSeconds"):
        parse_request(request("x1", StoppingCondition={"MaxRuntimeInSeconds": "soon"}))


def test_non_string_hyperparameter() -> None:
    with pytest.raises(ValidationError, match=r"HyperParameters\.epochs"):
        parse_request(request("x1", HyperParameters={"epochs": 3}))


def _channel(**source: Any) -> dict[str, Any]:
    base = {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/p"}
    base.update(source)
    return {"ChannelName": "train", "DataSource": {"S3DataSource": base}}


@pytest.mark.parametrize("uri", ["/local/path", "http://bucket/p", "s3:///nobucket"])
def test_non_s3_uris(uri: str) -> None:
    # The message names the field's full path and its value, then what is wrong with it.
    field = re.escape(f"InputDataConfig[0].DataSource.S3DataSource.S3Uri: {uri!r}")
    with pytest.raises(ValidationError, match=f"{field} (.*not an S3 URI|.*bucket|.*pattern)"):
        parse_request(request("x1", InputDataConfig=[_channel(S3Uri=uri)]))


def test_non_s3_output_path() -> None:
    with pytest.raises(ValidationError, match="S3OutputPath"):
        parse_request(request("x1", OutputDataConfig={"S3OutputPath": "/tmp/out"}))


def test_channel_rules() -> None:
    with pytest.raises(ValidationError, match="Gzip is only supported in Pipe mode"):
        parse_request(request("x1", InputDataConfig=[{**_channel(), "CompressionType": "Gzip"}]))
    with pytest.raises(
        ValidationError, match="AttributeNames needs S3DataType AugmentedManifestFile"
    ):
        parse_request(request("x1", InputDataConfig=[_channel(AttributeNames=["a"])]))
    with pytest.raises(ValidationError, match="appears twice"):
        parse_request(request("x1", InputDataConfig=[_channel(), _channel()]))
    with pytest.raises(ValidationError, match="ChannelName"):
        parse_request(request("x1", InputDataConfig=[{**_channel(), "ChannelName": "bad/name"}]))


def test_extension_tags() -> None:
    spec = parse_request(request("x1", Tags=[{"Key": "trainport:runner", "Value": "process"}]))
    assert spec.runner == "process"
    with pytest.raises(ValidationError, match="unknown trainport extension"):
        parse_request(request("x1", Tags=[{"Key": "trainport:nope", "Value": "1"}]))
    with pytest.raises(ValidationError, match="stop-grace-seconds"):
        parse_request(request("x1", Tags=[{"Key": "trainport:stop-grace-seconds", "Value": "-1"}]))


def test_retry_strategy_is_read() -> None:
    spec = parse_request(request("retried", RetryStrategy={"MaximumRetryAttempts": 3}))
    assert spec.retry_attempts == 3
    assert parse_request(request("not-retried")).retry_attempts == 0


@pytest.mark.parametrize(
    ("strategy", "says"),
    [
        ({"MaximumRetryAttempts": 0}, r"RetryStrategy\.MaximumRetryAttempts.*valid min value: 1"),
        ({"MaximumRetryAttempts": 31}, r"RetryStrategy\.MaximumRetryAttempts.*valid max value: 30"),
        ({}, r'Missing required parameter in RetryStrategy: "MaximumRetryAttempts"'),
        ({"MaximumRetryAttempts": "2"}, r"RetryStrategy\.MaximumRetryAttempts.*type"),
        ({"MaximumRetryAttempts": 1, "Tries": 2}, r'Unknown parameter in RetryStrategy: "Tries"'),
    ],
)
def test_a_malformed_retry_strategy_is_named(strategy: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        parse_request(request("retried", RetryStrategy=strategy))
