"""AddTags, ListTags and DeleteTags for training jobs, through boto3."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import TRAIN, job


def _tags(sm: Any, arn: str) -> list[tuple[str, str]]:
    return [(t["Key"], t["Value"]) for t in sm.list_tags(ResourceArn=arn)["Tags"]]


def test_tags_start_as_the_requests_and_change_with_add_and_delete(server: Any, sm: Any) -> None:
    arn = sm.create_training_job(**job("tagged", TRAIN, Tags=[{"Key": "team", "Value": "vision"}]))[
        "TrainingJobArn"
    ]
    assert _tags(sm, arn) == [("team", "vision")]
    sm.add_tags(
        ResourceArn=arn,
        Tags=[{"Key": "owner", "Value": "ana"}, {"Key": "team", "Value": "speech"}],
    )
    assert _tags(sm, arn) == [("team", "speech"), ("owner", "ana")]
    sm.delete_tags(ResourceArn=arn, TagKeys=["team"])
    assert _tags(sm, arn) == [("owner", "ana")]
    # The request's own Tags are echoed nowhere else and stay as sent.
    assert "Tags" not in sm.describe_training_job(TrainingJobName="tagged")


def test_a_job_without_tags_lists_none(server: Any, sm: Any) -> None:
    arn = sm.create_training_job(**job("untagged", TRAIN))["TrainingJobArn"]
    assert sm.list_tags(ResourceArn=arn)["Tags"] == []


def test_describe_has_the_fields_the_sdk_reads(server: Any, sm: Any) -> None:
    sm.create_training_job(**job("described", TRAIN))
    described = sm.describe_training_job(TrainingJobName="described")
    assert described["OutputDataConfig"] == {"KmsKeyId": "", "S3OutputPath": "s3://out/models"}


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:sagemaker:us-east-1:000000000000:training-job/no-such-job",
        "arn:aws:sagemaker:us-east-1:000000000000:endpoint/tagged",
    ],
)
def test_tags_of_what_is_not_a_job_here_are_refused(server: Any, sm: Any, arn: str) -> None:
    with pytest.raises(ClientError) as caught:
        sm.list_tags(ResourceArn=arn)
    assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_more_than_fifty_tags_are_refused(server: Any, sm: Any) -> None:
    arn = sm.create_training_job(**job("crowded", TRAIN))["TrainingJobArn"]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": f"k{i}", "Value": "v"} for i in range(40)])
    with pytest.raises(ClientError, match="the limit is 50"):
        sm.add_tags(ResourceArn=arn, Tags=[{"Key": f"x{i}", "Value": "v"} for i in range(20)])
    assert len(_tags(sm, arn)) == 40
