"""Proposed with process-optml-hostname.patch (runners/process.py): under the process runner
a job's host name is its host's, and /opt/ml is its host's tree, FIFOs included."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import put, python_job, require, wait_for
from trainport.jobs.service import JobService
from trainport.runners.process import hosts_namespace_problem

PROBE = """
import json, socket
config = json.load(open("/opt/ml/input/config/resourceconfig.json"))
with open("/opt/ml/input/data/train_0", "rb") as f:
    data = f.read().decode()
print("PROBE", socket.gethostname(), config["current_host"], data, flush=True)
"""


def test_process_runner_hostname_and_opt_ml(home: Path, service: JobService) -> None:
    require(hosts_namespace_problem() is None, f"no mount namespace: {hosts_namespace_problem()}")
    put(home, "data", "train/x", "1")
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/train/"}},
        "InputMode": "Pipe",
    }
    body = python_job(
        "optml",
        PROBE,
        InputDataConfig=[channel],
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        StoppingCondition={"MaxRuntimeInSeconds": 60},
    )
    service.create(body, runner="process")
    record = wait_for(service, "optml")
    assert record.status == "Completed", record.failure_reason
    for host in ("algo-1", "algo-2"):
        lines = [t for _, t in service.logs("optml", host=host) if t.startswith("PROBE")]
        assert lines == [f"PROBE {host} {host} 1"]
