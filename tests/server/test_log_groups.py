"""The CloudWatch Logs calls beyond one stream's events, from boto3 and the aws CLI against
a real trainport server: FilterLogEvents, DescribeLogGroups, and DescribeLogStreams' orders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import KEY_ID, SECRET, client
from trainport.jobs.records import JobRecord

GROUP = "/aws/sagemaker/TrainingJobs"


def _job_with_logs(
    server: Any, name: str, created: float, hosts: dict[str, list[tuple[float, str]]]
) -> None:
    """A job record and its hosts' log files, as the host agents write them."""
    service = server.service
    service.db.insert(
        JobRecord(name=name, arn=service.arn(name), request={}, creation_time=created)
    )
    for host, lines in hosts.items():
        path = service.log_path(name, host)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{t:.3f}\t{text}\n" for t, text in lines))


@pytest.fixture
def two_jobs(server: Any) -> Any:
    _job_with_logs(
        server,
        "first",
        1000.0,
        {
            "algo-1": [
                (1001.0, "first a1 start"),
                (1003.0, "first a1 ERROR disk"),
                (1005.0, "first a1 end"),
            ],
            "algo-2": [(1002.0, "first a2 start"), (1004.0, "first a2 WARN slow")],
        },
    )
    _job_with_logs(
        server,
        "second",
        1000.5,
        {"algo-1": [(1002.5, "second start"), (1006.0, "second ERROR oom")]},
    )
    return client(server, "logs")


def test_filter_log_events_interleaves_streams_by_time(two_jobs: Any) -> None:
    events = two_jobs.filter_log_events(logGroupName=GROUP)["events"]
    assert [e["message"] for e in events] == [
        "first a1 start",
        "first a2 start",
        "second start",
        "first a1 ERROR disk",
        "first a2 WARN slow",
        "first a1 end",
        "second ERROR oom",
    ]
    assert events[0]["logStreamName"] == "first/algo-1-1000"
    assert events[0]["timestamp"] == 1001000
    assert len({e["eventId"] for e in events}) == len(events)


def test_filter_log_events_narrows_by_stream_time_and_pattern(two_jobs: Any) -> None:
    def messages(**params: Any) -> list[str]:
        pages = two_jobs.get_paginator("filter_log_events").paginate(logGroupName=GROUP, **params)
        return [e["message"] for page in pages for e in page["events"]]

    assert messages(logStreamNamePrefix="first/") == [
        "first a1 start",
        "first a2 start",
        "first a1 ERROR disk",
        "first a2 WARN slow",
        "first a1 end",
    ]
    assert messages(logStreamNames=["first/algo-2-1000", "second/algo-1-1000"]) == [
        "first a2 start",
        "second start",
        "first a2 WARN slow",
        "second ERROR oom",
    ]
    assert messages(startTime=1003000, endTime=1005000) == [
        "first a1 ERROR disk",
        "first a2 WARN slow",
        "first a1 end",
    ]
    assert messages(filterPattern="ERROR") == ["first a1 ERROR disk", "second ERROR oom"]
    assert messages(filterPattern="?ERROR ?WARN -oom") == [
        "first a1 ERROR disk",
        "first a2 WARN slow",
    ]
    assert messages(filterPattern='"a1 end"') == ["first a1 end"]
    # One event per page: the token carries where the page ended, and nothing repeats.
    assert messages(PaginationConfig={"PageSize": 1}) == messages()
    with pytest.raises(ClientError) as err:
        two_jobs.filter_log_events(logGroupName=GROUP, filterPattern="{ $.level = 1 }")
    assert err.value.response["Error"]["Code"] == "InvalidParameterException"


def test_aws_cli_filter_log_events(two_jobs: Any, server: Any, tmp_path: Path) -> None:
    aws = Path(sys.executable).with_name("aws")
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    out = subprocess.run(
        [str(aws), "--endpoint-url", server.url, "logs", "filter-log-events",
         "--log-group-name", GROUP, "--log-stream-name-prefix", "second/", "--output", "json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [e["message"] for e in json.loads(out.stdout)["events"]] == [
        "second start",
        "second ERROR oom",
    ]


def test_describe_log_groups(two_jobs: Any) -> None:
    [group] = two_jobs.describe_log_groups()["logGroups"]
    assert group["logGroupName"] == GROUP
    assert group["arn"].endswith(f":log-group:{GROUP}:*")
    assert group["creationTime"] == 1000000  # the oldest job's creation
    assert two_jobs.describe_log_groups(logGroupNamePrefix="/aws/sagemaker/")["logGroups"]
    assert two_jobs.describe_log_groups(logGroupNamePattern="trainingjobs")["logGroups"]
    assert two_jobs.describe_log_groups(logGroupNamePrefix="/aws/lambda/")["logGroups"] == []


def test_describe_log_streams_orders_by_last_event_time(two_jobs: Any, server: Any) -> None:
    mtimes = {("first", "algo-1"): 3000, ("first", "algo-2"): 1000, ("second", "algo-1"): 2000}
    for (job, host), when in mtimes.items():
        os.utime(server.service.log_path(job, host), (when, when))

    def names(**params: Any) -> list[str]:
        pages = two_jobs.get_paginator("describe_log_streams").paginate(
            logGroupName=GROUP, **params
        )
        return [s["logStreamName"] for page in pages for s in page["logStreams"]]

    by_time = ["first/algo-2-1000", "second/algo-1-1000", "first/algo-1-1000"]
    assert names(orderBy="LastEventTime") == by_time
    assert names(orderBy="LastEventTime", descending=True) == by_time[::-1]
    assert names(orderBy="LastEventTime", PaginationConfig={"PageSize": 1}) == by_time
    by_name = ["first/algo-1-1000", "first/algo-2-1000", "second/algo-1-1000"]
    assert names() == by_name
    assert names(descending=True, PaginationConfig={"PageSize": 2}) == by_name[::-1]
    with pytest.raises(ClientError) as err:
        two_jobs.describe_log_streams(
            logGroupName=GROUP, orderBy="LastEventTime", logStreamNamePrefix="first/"
        )
    assert err.value.response["Error"]["Code"] == "InvalidParameterException"
    assert "LastEventTime" in err.value.response["Error"]["Message"]
