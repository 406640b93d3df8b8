"""AddTags, ListTags and DeleteTags for training jobs, through boto3."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import TRAIN, job, wait_for


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


def test_describe_has_the_fields_the_sdk_reads(
    server: Any, sm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the SageMaker Python SDK reads by subscript (a missing one is a KeyError there):
    Estimator.attach's own reading of the description, then what its waiter and log
    reader take (status, secondary status and its transitions, instance count, artifacts)."""
    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")  # v2 is what attach() here is
    from sagemaker.estimator import Estimator

    sm.create_training_job(**job("described", TRAIN))
    described = wait_for(sm, "described")
    assert described["OutputDataConfig"] == {"KmsKeyId": "", "S3OutputPath": "s3://out/models"}

    init = Estimator._prepare_init_params_from_job_description(described)
    assert {k: init[k] for k in SDK_INIT} == SDK_INIT
    assert described["TrainingJobArn"].endswith(":training-job/described")
    assert described["TrainingJobStatus"] == described["SecondaryStatus"] == "Completed"
    assert described["SecondaryStatusTransitions"][-1]["Status"] == "Completed"
    assert all("StartTime" in t for t in described["SecondaryStatusTransitions"])
    assert described["ResourceConfig"]["InstanceCount"] == 1
    assert described["ModelArtifacts"]["S3ModelArtifacts"] == (
        "s3://out/models/described/output/model.tar.gz"
    )
    assert described["TrainingEndTime"] >= described["TrainingStartTime"]
    assert isinstance(described["BillableTimeInSeconds"], int)


# Estimator.attach's arguments as read from a description of job() in tests.server.conftest.
SDK_INIT = {
    "role": "arn:aws:iam::000000000000:role/trainport-test",
    "instance_count": 1,
    "instance_type": "ml.m5.large",
    "volume_size": 1,
    "max_run": 120,
    "input_mode": "File",
    "base_job_name": "described",
    "output_path": "s3://out/models",
    "output_kms_key": "",
    "hyperparameters": {"epochs": "3", "lr": "0.1"},
    "image_uri": "trainport/python",
}


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
