"""boto3's CloudWatch Logs client reads a job's log through GetLogEvents' forward tokens."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import TRAIN, client, job, wait_for

GROUP = "/aws/sagemaker/TrainingJobs"


def test_get_log_events_follows_forward_tokens(sm: Any, server: Any) -> None:
    sm.create_training_job(**job("logged", TRAIN))
    done = wait_for(sm, "logged")
    logs = client(server, "logs")
    streams = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix="logged/")
    [stream] = streams["logStreams"]
    created = int(done["CreationTime"].timestamp())
    assert stream["logStreamName"] == f"logged/algo-1-{created}"

    events: list[dict[str, Any]] = []
    token = None
    calls = 0
    while True:
        params: dict[str, Any] = {
            "logGroupName": GROUP,
            "logStreamName": stream["logStreamName"],
            "startFromHead": True,
            "limit": 3,
        }
        if token:
            params["nextToken"] = token
        page = logs.get_log_events(**params)
        calls += 1
        events += page["events"]
        if page["nextForwardToken"] == token:  # CloudWatch's end-of-stream signal
            break
        token = page["nextForwardToken"]
    assert [e["message"] for e in events] == [f"epoch {i} loss={1 / (i + 1):.3f}" for i in range(4)]
    assert calls >= 3  # two pages of at most 3 events, then the unchanged token
    # Every event carries the time its line was written, in epoch milliseconds: within the
    # job's life (its recorded times are whole seconds at worst), in the order written.
    stamps = [e["timestamp"] for e in events]
    first_ms = int(done["CreationTime"].timestamp()) * 1000
    last_ms = (int(done["TrainingEndTime"].timestamp()) + 1) * 1000
    assert all(first_ms <= t <= last_ms for t in stamps), (first_ms, stamps, last_ms)
    assert stamps == sorted(stamps)

    with pytest.raises(ClientError) as err:
        logs.get_log_events(logGroupName=GROUP, logStreamName="logged/algo-1-1")
    assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"
