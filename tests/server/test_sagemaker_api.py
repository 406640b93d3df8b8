"""boto3's SageMaker client against a real trainport server on 127.0.0.1."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import SLEEP, TRAIN, job, wait_for


def test_create_wait_describe(sm: Any) -> None:
    arn = sm.create_training_job(**job("tiny", TRAIN))["TrainingJobArn"]
    assert arn.endswith(":training-job/tiny")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="tiny", WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )
    d = sm.describe_training_job(TrainingJobName="tiny")
    assert d["TrainingJobStatus"] == "Completed", d.get("FailureReason")
    assert d["SecondaryStatus"] == "Completed"
    steps = [t["Status"] for t in d["SecondaryStatusTransitions"]]
    assert steps == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    for before, after in zip(
        d["SecondaryStatusTransitions"], d["SecondaryStatusTransitions"][1:], strict=False
    ):
        assert before["EndTime"] == after["StartTime"]
    assert d["ModelArtifacts"]["S3ModelArtifacts"] == "s3://out/models/tiny/output/model.tar.gz"
    assert [(m["MetricName"], m["Value"]) for m in d["FinalMetricDataList"]] == [("loss", 0.25)]
    assert d["CreationTime"] <= d["TrainingStartTime"] <= d["TrainingEndTime"]
    assert d["BillableTimeInSeconds"] >= 1
    assert d["HyperParameters"] == {"epochs": "3", "lr": "0.1"}


def test_list_pages_and_filters(sm: Any, server: Any) -> None:
    # Records straight into the server's database: listing needs no running jobs.
    from trainport.jobs.records import JobRecord

    db = server.service.db
    base = float(int(time.time()) - 100)  # whole seconds: boto3 sends timestamps as such
    for i in range(25):
        name = f"{'alpha' if i % 2 else 'beta'}-{i:02d}"
        status = "Completed" if i % 3 else "Failed"
        db.insert(
            JobRecord(
                name=name,
                arn=server.service.arn(name),
                request={},
                creation_time=base + i + 0.5,
                last_modified_time=base + i + 0.5,
                status=status,
                secondary_status=status,
            )
        )
    pages = list(sm.get_paginator("list_training_jobs").paginate(PaginationConfig={"PageSize": 10}))
    assert len(pages) == 3
    names = [s["TrainingJobName"] for p in pages for s in p["TrainingJobSummaries"]]
    assert len(names) == 25 == len(set(names))
    assert names[0] == "alpha-24" or names[0] == "beta-24"  # newest first by default
    alpha = [
        s["TrainingJobName"]
        for p in sm.get_paginator("list_training_jobs").paginate(
            NameContains="alpha",
            SortBy="Name",
            SortOrder="Ascending",
            PaginationConfig={"PageSize": 5},
        )
        for s in p["TrainingJobSummaries"]
    ]
    assert alpha == sorted(f"alpha-{i:02d}" for i in range(1, 25, 2))
    failed = sm.list_training_jobs(StatusEquals="Failed", MaxResults=100)["TrainingJobSummaries"]
    assert {s["TrainingJobName"] for s in failed} == {
        f"{'alpha' if i % 2 else 'beta'}-{i:02d}" for i in range(0, 25, 3)
    }
    recent = sm.list_training_jobs(CreationTimeAfter=base + 20, MaxResults=100)
    assert len(recent["TrainingJobSummaries"]) == 5  # jobs 20 .. 24
    assert "NextToken" not in recent


def test_list_filters_on_what_no_job_has_match_no_job(sm: Any, server: Any) -> None:
    from trainport.jobs.records import JobRecord

    for name in ("kept-a", "kept-b"):
        server.service.db.insert(
            JobRecord(name=name, arn=server.service.arn(name), request={}, creation_time=1.0)
        )
    assert len(sm.list_training_jobs()["TrainingJobSummaries"]) == 2
    # No trainport job runs in a warm pool or under a training plan; in SageMaker such a
    # job never matches these filters.
    assert sm.list_training_jobs(WarmPoolStatusEquals="Available")["TrainingJobSummaries"] == []
    plan = "arn:aws:sagemaker:us-east-1:000000000000:training-plan/a-plan-of-the-team"
    assert sm.list_training_jobs(TrainingPlanArnEquals=plan)["TrainingJobSummaries"] == []
    with pytest.raises(ClientError) as err:
        sm.list_training_jobs(TrainingPlanArnEquals="arn:aws:sagemaker:" + "x" * 60)
    assert "TrainingPlanArnEquals" in err.value.response["Error"]["Message"]


def test_a_next_token_continues_only_its_own_order(sm: Any, server: Any) -> None:
    from trainport.jobs.records import JobRecord

    for i in range(3):
        name = f"ordered-{i}"
        server.service.db.insert(
            JobRecord(name=name, arn=server.service.arn(name), request={}, creation_time=1.0 + i)
        )
    first = sm.list_training_jobs(MaxResults=1, SortBy="Name")
    with pytest.raises(ClientError) as err:
        sm.list_training_jobs(MaxResults=1, SortBy="CreationTime", NextToken=first["NextToken"])
    message = err.value.response["Error"]["Message"]
    assert "NextToken" in message and "sorted by Name" in message
    second = sm.list_training_jobs(MaxResults=1, SortBy="Name", NextToken=first["NextToken"])
    assert [s["TrainingJobName"] for s in second["TrainingJobSummaries"]] == ["ordered-1"]


def test_stop_running_job(sm: Any) -> None:
    sm.create_training_job(**job("sleeper", SLEEP))
    wait_for(sm, "sleeper", ("Training",))
    sm.stop_training_job(TrainingJobName="sleeper")
    sm.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="sleeper", WaiterConfig={"Delay": 1, "MaxAttempts": 30}
    )
    d = sm.describe_training_job(TrainingJobName="sleeper")
    assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "Stopping" in [t["Status"] for t in d["SecondaryStatusTransitions"]]


def test_duplicate_name_is_resource_in_use(sm: Any) -> None:
    sm.create_training_job(**job("twice", TRAIN))
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**job("twice", TRAIN))
    assert err.value.response["Error"]["Code"] == "ResourceInUse"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    wait_for(sm, "twice")


def test_unknown_job_is_validation_exception(sm: Any) -> None:
    with pytest.raises(ClientError) as err:
        sm.describe_training_job(TrainingJobName="no-such-job")
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "Requested resource not found" in err.value.response["Error"]["Message"]


def test_malformed_request_names_the_field(sm: Any) -> None:
    bad = job("bad-one", TRAIN)
    bad["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = "s3://data/nothing-here/"
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**bad)
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "No S3 objects found" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as err:
        sm.list_training_jobs(NextToken="not-a-token")
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "NextToken" in err.value.response["Error"]["Message"]
    with pytest.raises(ClientError):
        sm.describe_training_job(TrainingJobName="bad-one")  # nothing was stored


def test_queue_starts_in_submission_order(server_home: Any) -> None:
    from tests.server.conftest import client, start_server

    srv = start_server(max_concurrent_jobs=1)
    try:
        sm = client(srv)
        sm.create_training_job(**job("q-first", SLEEP))
        sm.create_training_job(**job("q-second", TRAIN))
        sm.create_training_job(**job("q-third", TRAIN))
        wait_for(sm, "q-first", ("Training",))
        for name in ("q-second", "q-third"):
            d = sm.describe_training_job(TrainingJobName=name)
            assert (d["TrainingJobStatus"], d["SecondaryStatus"]) == ("InProgress", "Pending")
        sm.stop_training_job(TrainingJobName="q-first")
        second = wait_for(sm, "q-second")
        third = wait_for(sm, "q-third")
        assert second["TrainingJobStatus"] == third["TrainingJobStatus"] == "Completed"
        assert second["TrainingStartTime"] < third["TrainingStartTime"]
        assert [t["Status"] for t in third["SecondaryStatusTransitions"]][:2] == [
            "Pending",
            "Starting",
        ]
    finally:
        srv.close()
