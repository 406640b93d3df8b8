"""Tuning jobs for the server tests: a tiny script-mode training whose loss per epoch is a
known function of its hyperparameters, and the request that tunes it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.server.conftest import put
from trainport.host.script_mode import pack_entry_point

# loss = (shift - 3)^2 + 1/(epoch + 1), plus 0.5 for kind "b": shift 3, kind "a" is best.
TRAIN_PY = """\
import argparse, time
p = argparse.ArgumentParser()
p.add_argument("--shift", type=float, default=0.0)
p.add_argument("--kind", default="a")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--pause", type=float, default=0.05)
a, _ = p.parse_known_args()
for e in range(a.epochs):
    loss = (a.shift - 3) ** 2 + 1 / (e + 1) + (0.5 if a.kind == "b" else 0)
    print(f"epoch={e} loss={loss:.4f}", flush=True)
    time.sleep(a.pause)
"""
SOURCE = "s3://data/code/tune/sourcedir.tar.gz"
TUNING_TERMINAL = ("Completed", "Failed", "Stopped")


def put_source(home: Path, tmp_path: Path) -> None:
    entry = tmp_path / "train.py"
    entry.write_text(TRAIN_PY)
    put(home, "data", "code/tune/sourcedir.tar.gz", pack_entry_point(entry))


def definition(**static: str) -> dict[str, Any]:
    """A TrainingJobDefinition running train.py in script mode."""
    return {
        "StaticHyperParameters": {
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_submit_directory": json.dumps(SOURCE),
            **static,
        },
        "AlgorithmSpecification": {
            "TrainingImage": "trainport/python",
            "TrainingInputMode": "File",
            "MetricDefinitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
        },
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-test",
        "OutputDataConfig": {"S3OutputPath": "s3://out/tuning"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 300},
    }


def tuning_request(
    name: str,
    strategy: str,
    *,
    max_jobs: int | None = 4,
    parallel: int = 2,
    ranges: dict[str, Any] | None = None,
    static: dict[str, str] | None = None,
    **config: Any,
) -> dict[str, Any]:
    limits: dict[str, Any] = {"MaxParallelTrainingJobs": parallel}
    if max_jobs is not None:
        limits["MaxNumberOfTrainingJobs"] = max_jobs
    return {
        "HyperParameterTuningJobName": name,
        "HyperParameterTuningJobConfig": {
            "Strategy": strategy,
            "HyperParameterTuningJobObjective": {"Type": "Minimize", "MetricName": "loss"},
            "ResourceLimits": limits,
            "ParameterRanges": ranges
            or {
                "ContinuousParameterRanges": [{"Name": "shift", "MinValue": "0", "MaxValue": "6"}],
                "CategoricalParameterRanges": [{"Name": "kind", "Values": ["a", "b"]}],
            },
            **config,
        },
        "TrainingJobDefinition": definition(**(static or {})),
    }


def wait_tuning(sm: Any, name: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        d: dict[str, Any] = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        if d["HyperParameterTuningJobStatus"] in TUNING_TERMINAL:
            return d
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} still {d['HyperParameterTuningJobStatus']}: {d}")
        time.sleep(0.2)


def children(sm: Any, name: str, **params: Any) -> list[dict[str, Any]]:
    """Every child's summary, through every page."""
    out: list[dict[str, Any]] = []
    token = None
    while True:
        extra = {"NextToken": token} if token else {}
        page = sm.list_training_jobs_for_hyper_parameter_tuning_job(
            HyperParameterTuningJobName=name, MaxResults=2, **params, **extra
        )
        out += page["TrainingJobSummaries"]
        token = page.get("NextToken")
        if not token:
            return out
