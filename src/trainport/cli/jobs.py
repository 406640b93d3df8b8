"""``trainport jobs``: list, describe, stop and read the logs of jobs.

Tables are for people (local times, durations, a job's final metrics and why it failed);
``--output json`` is for programs, with the fields and epoch-second times of the SageMaker
API's answers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click

from trainport.cli.common import echo_err, fmt_duration, fmt_time, handle_errors, service
from trainport.errors import ValidationError
from trainport.follow import summary

__all__ = ["describe_table", "job_hosts", "jobs", "list_rows"]

_TERMINAL = ("Completed", "Failed", "Stopped")
# A failure reason is cut to this many characters in a table; describe shows it whole.
_REASON_WIDTH = 60
_DESCRIBE_TIMES = (
    ("CreationTime", "Created"),
    ("TrainingStartTime", "Started"),
    ("TrainingEndTime", "Ended"),
    ("LastModifiedTime", "Modified"),
)

_output_option = click.option(
    "-o",
    "--output",
    "output",
    type=click.Choice(["table", "json"]),
    default=None,
    help="table for people, json for programs.",
)


@click.group()
def jobs() -> None:
    """List, describe, stop and read the logs of jobs."""


def _metrics_cell(record: Any) -> str:
    return " ".join(f"{m.name}={m.value:g}" for m in record.final_metrics) or "-"


def _reason_cell(record: Any) -> str:
    reason = " ".join((record.failure_reason or "").split())
    if not reason:
        return "-"
    return reason if len(reason) <= _REASON_WIDTH else reason[: _REASON_WIDTH - 3] + "..."


def list_rows(records: Sequence[Any], now: float) -> list[tuple[str, ...]]:
    """The table of ``trainport jobs list``, its header first."""
    rows: list[tuple[str, ...]] = [
        ("NAME", "STATUS", "SECONDARY", "CREATED", "DURATION", "METRICS", "FAILURE")
    ]
    for r in records:
        end = r.training_end_time or now
        rows.append(
            (
                r.name,
                r.status,
                r.secondary_status,
                fmt_time(r.creation_time),
                fmt_duration(end - r.creation_time),
                _metrics_cell(r),
                _reason_cell(r),
            )
        )
    return rows


def _list_json(record: Any) -> dict[str, Any]:
    """One job as ListTrainingJobs summarises it, with what the table shows besides."""
    out: dict[str, Any] = {
        "TrainingJobName": record.name,
        "TrainingJobArn": record.arn,
        "TrainingJobStatus": record.status,
        "SecondaryStatus": record.secondary_status,
        "CreationTime": record.creation_time,
        "LastModifiedTime": record.last_modified_time or record.creation_time,
    }
    if record.training_start_time is not None:
        out["TrainingStartTime"] = record.training_start_time
    if record.training_end_time is not None:
        out["TrainingEndTime"] = record.training_end_time
    if record.failure_reason:
        out["FailureReason"] = record.failure_reason
    out["FinalMetricDataList"] = [
        {"MetricName": m.name, "Value": m.value, "Timestamp": m.timestamp}
        for m in record.final_metrics
    ]
    return out


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@jobs.command("list")
@click.option(
    "--status", type=click.Choice(["InProgress", "Completed", "Failed", "Stopping", "Stopped"])
)
@click.option("--name-contains", help="Only jobs whose name contains this.")
@click.option("--limit", type=int, default=50, show_default=True)
@_output_option
@handle_errors
def list_jobs(
    status: str | None, name_contains: str | None, limit: int, output: str | None
) -> None:
    """Jobs, newest first, with their final metrics and why any failed."""
    from trainport.jobs.db import ListQuery

    if limit < 1:
        raise ValidationError(f"--limit {limit}: give a number of jobs, at least 1")
    records = service().list(
        ListQuery(name_contains=name_contains, status_equals=status, limit=limit)
    )
    if output == "json":
        click.echo(json.dumps({"TrainingJobSummaries": [_list_json(r) for r in records]}, indent=2))
        return
    _print_table(list_rows(records, time.time()))


def describe_table(doc: dict[str, Any]) -> list[str]:
    """DescribeTrainingJob as people read it: times in this machine's zone, the request's
    settings one a line, Environment values left out."""
    lines: list[str] = []

    def add(label: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            lines.append(f"{label + ':':<20} {value}")

    add("Name", doc.get("TrainingJobName"))
    add("ARN", doc.get("TrainingJobArn"))
    add("Status", f"{doc.get('TrainingJobStatus')} ({doc.get('SecondaryStatus', '')})")
    add("FailureReason", doc.get("FailureReason"))
    for key, label in _DESCRIBE_TIMES:
        if doc.get(key) is not None:
            add(label, fmt_time(float(doc[key])))
    if doc.get("TrainingTimeInSeconds") is not None:
        add("Duration", fmt_duration(float(doc["TrainingTimeInSeconds"])))
    algo = doc.get("AlgorithmSpecification") or {}
    add("Image", algo.get("TrainingImage"))
    add("Entrypoint", " ".join(algo.get("ContainerEntrypoint") or []))
    resources = doc.get("ResourceConfig") or {}
    groups = resources.get("InstanceGroups") or []
    if groups:
        add("Instances", ", ".join(f"{g['InstanceCount']} x {g['InstanceType']}" for g in groups))
    else:
        add("Instances", f"{resources.get('InstanceCount', 1)} x {resources.get('InstanceType')}")
    for channel in doc.get("InputDataConfig") or []:
        source = (channel.get("DataSource") or {}).get("S3DataSource") or {}
        mode = channel.get("InputMode") or algo.get("TrainingInputMode", "File")
        add(f"Channel {channel.get('ChannelName')}", f"{source.get('S3Uri', '')} ({mode})")
    add("Output", (doc.get("OutputDataConfig") or {}).get("S3OutputPath"))
    add("Model", (doc.get("ModelArtifacts") or {}).get("S3ModelArtifacts"))
    stopping = doc.get("StoppingCondition") or {}
    if stopping.get("MaxRuntimeInSeconds"):
        add("MaxRuntime", fmt_duration(float(stopping["MaxRuntimeInSeconds"])))
    for key, value in sorted((doc.get("HyperParameters") or {}).items()):
        add(f"HP {key}", value)
    add("Environment", ", ".join(sorted(doc.get("Environment") or {})))
    for metric in doc.get("FinalMetricDataList") or []:
        add(f"Metric {metric['MetricName']}", f"{float(metric['Value']):g}")
    transitions = doc.get("SecondaryStatusTransitions") or []
    if transitions:
        lines.append("Transitions:")
        for t in transitions:
            lines.append(
                f"  {fmt_time(float(t['StartTime'])):<20} {t['Status']:<12} "
                f"{t.get('StatusMessage', '')}".rstrip()
            )
    return lines


@jobs.command()
@click.argument("name")
@_output_option
@handle_errors
def describe(name: str, output: str | None) -> None:
    """A job's DescribeTrainingJob answer (JSON), or a table of it (--output table)."""
    doc = service().describe(name)
    if output == "table":
        click.echo("\n".join(describe_table(doc)))
    else:
        click.echo(json.dumps(doc, indent=2))


@jobs.command()
@click.argument("name")
@click.option("--wait/--no-wait", default=False, help="Wait until the job has stopped.")
@handle_errors
def stop(name: str, wait: bool) -> None:
    """Stop a job: SIGTERM, the grace period, then SIGKILL."""
    jobs_ = service()
    record = jobs_.get(name)
    if record.status in _TERMINAL:
        ended = fmt_time(record.training_end_time or record.last_modified_time)
        echo_err(f"{name}: already {record.status} (at {ended}); nothing to stop")
        return
    record = jobs_.stop(name)
    echo_err(f"{name}: {record.status} ({record.secondary_status})")
    while wait and record.status not in _TERMINAL:
        time.sleep(0.2)
        record = jobs_.get(name)
    if wait:
        echo_err(summary(record))


def job_hosts(request: dict[str, Any]) -> tuple[str, ...]:
    """algo-1 .. algo-N of a job, from its ResourceConfig (instance groups counted)."""
    resources = request.get("ResourceConfig") or {}
    groups = resources.get("InstanceGroups") or []
    count = (
        sum(int(g["InstanceCount"]) for g in groups)
        if groups
        else resources.get("InstanceCount", 1)
    )
    return tuple(f"algo-{k}" for k in range(1, int(count) + 1))


@jobs.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--timestamps", is_flag=True, help="Prefix each line with its time.")
@click.option("--host", default="algo-1", show_default=True, help="Which host's log.")
@handle_errors
def logs(name: str, follow: bool, timestamps: bool, host: str) -> None:
    """Print a job's log (one host's)."""
    jobs_ = service()
    hosts = job_hosts(jobs_.get(name).request)
    if host not in hosts:
        raise ValidationError(
            f"--host {host}: job {name} has no such host; its hosts are {', '.join(hosts)}"
        )
    for ts, text in jobs_.logs(name, follow=follow, host=host):
        click.echo(f"{fmt_time(ts)} {text}" if timestamps else text)
