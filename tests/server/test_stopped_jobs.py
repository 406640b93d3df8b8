"""What DescribeTrainingJob says of a stopped job: the upload of what it saved, and no
training time for a job that never left the queue."""

from __future__ import annotations

from typing import Any

from tests.server.conftest import SLEEP, client, job, start_server, wait_for
from trainport.jobs.records import JobRecord, Transition
from trainport.jobs.status import Finished, Phase, StopRequested, advance


def test_a_stopped_job_that_uploads_shows_uploading_before_stopped(server_home: Any) -> None:
    srv = start_server(max_concurrent_jobs=1)
    try:
        sm = client(srv)
        sm.create_training_job(**job("runs", SLEEP))
        sm.create_training_job(**job("queued", SLEEP))
        wait_for(sm, "runs", ("Training",))
        sm.stop_training_job(TrainingJobName="queued")
        queued = wait_for(sm, "queued")
        sm.stop_training_job(TrainingJobName="runs")
        runs = wait_for(sm, "runs")
    finally:
        srv.close()
    steps = [t["Status"] for t in runs["SecondaryStatusTransitions"]]
    assert steps[-3:] == ["Stopping", "Uploading", "Stopped"], steps
    assert runs["ModelArtifacts"]["S3ModelArtifacts"].endswith("/runs/output/model.tar.gz")
    assert runs["BillableTimeInSeconds"] >= 1

    assert [t["Status"] for t in queued["SecondaryStatusTransitions"]] == [
        "Pending",
        "Stopping",
        "Stopped",
    ]
    assert queued["TrainingJobStatus"] == "Stopped"
    assert queued["TrainingTimeInSeconds"] == 0
    assert queued["BillableTimeInSeconds"] == 0


def test_uploading_after_a_stop_keeps_the_job_stopping() -> None:
    record = JobRecord(
        name="j",
        arn="arn",
        request={},
        creation_time=0.0,
        secondary_status="Training",
        transitions=(Transition("Training", 0.0, None, ""),),
        training_start_time=1.0,
    )
    record = advance(record, StopRequested("user", "Stopping the training job"), 10.0)
    record = advance(record, Phase("Training", "late news of a host"), 11.0)
    assert record.secondary_status == "Stopping"  # no phase but Uploading after a stop
    record = advance(record, Phase("Uploading", "Uploading generated training model"), 12.0)
    assert (record.status, record.secondary_status) == ("Stopping", "Uploading")
    record = advance(record, Finished(0), 13.0)
    assert [t.status for t in record.transitions] == [
        "Training",
        "Stopping",
        "Uploading",
        "Stopped",
    ]
    assert record.to_describe()["TrainingTimeInSeconds"] == 12
