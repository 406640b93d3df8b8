"""The CLI against a running server (``--endpoint``): real ``trainport`` subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.server.conftest import TRAIN, job, wait_for

TRAINPORT = [sys.executable, "-m", "trainport.cli"]


def tp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=120)


def test_describe_through_the_server_prints_json(server: Any, sm: Any) -> None:
    sm.create_training_job(**job("remote-describe", TRAIN))
    wait_for(sm, "remote-describe")
    done = tp("--endpoint", server.url, "jobs", "describe", "remote-describe")
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert described["TrainingJobStatus"] == "Completed"
    # Timestamps print as epoch seconds, as they do without a server.
    assert isinstance(described["CreationTime"], float)
    assert isinstance(described["SecondaryStatusTransitions"][0]["StartTime"], float)


def test_a_job_from_trainport_run_has_a_real_instance_type(
    server: Any, sm: Any, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('trained')\n")
    done = tp(
        "--endpoint",
        server.url,
        "run",
        "--name",
        "cli-made",
        "--entry-point",
        str(tmp_path / "train.py"),
        "--detach",
    )
    assert done.returncode == 0, done.stderr
    described = wait_for(sm, "cli-made")
    # The SageMaker SDK attaches to a job only with an instance type it knows.
    assert described["ResourceConfig"]["InstanceType"] == "ml.m5.large"
    assert described["HyperParameters"]["sagemaker_container_log_level"] == "20"


def test_ended_jobs_through_the_server(server: Any, sm: Any) -> None:
    sm.create_training_job(**job("remote-ended", TRAIN))
    wait_for(sm, "remote-ended")
    listed = tp("--endpoint", server.url, "jobs", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    (summary,) = json.loads(listed.stdout)["TrainingJobSummaries"]
    assert summary["TrainingJobName"] == "remote-ended"
    assert summary["FinalMetricDataList"][0]["MetricName"] == "loss"
    table = tp("--endpoint", server.url, "jobs", "list").stdout
    assert "loss=0.25" in table.splitlines()[1], table  # the last epoch's
    described = tp("--endpoint", server.url, "jobs", "describe", "remote-ended", "-o", "table")
    assert described.returncode == 0, described.stderr
    assert "Completed (Completed)" in described.stdout
    stopped = tp("--endpoint", server.url, "jobs", "stop", "remote-ended")
    assert stopped.returncode == 0 and "already Completed" in stopped.stderr
    unknown = tp("--endpoint", server.url, "jobs", "logs", "remote-ended", "--host", "algo-2")
    assert unknown.returncode == 2 and "its hosts are algo-1" in unknown.stderr
