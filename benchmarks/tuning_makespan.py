"""How close a tuning job keeps its children's slots busy, and what Hyperband saves.

1. **Makespan.** A Random tuning job of ``--trials`` short script-mode trainings (each a few
   epochs of sleeping and printing its loss) with ``MaxParallelTrainingJobs`` = this
   machine's cores, on a real server in this process. Its makespan (creation to end) is set
   against the ideal: the sum of its children's own run times (each from its creation to
   its end, start-up included) divided by the parallelism. The ratio is what the tuning
   job's own steps cost: noticing a child's end and creating the next.
2. **Hyperband against Random.** The same trials (the same seed draws the same values)
   under Hyperband, whose rungs stop children early: the total epochs trained by each,
   and the best objective each found.
3. **Hyperband with checkpoints.** The same again with a CheckpointConfig: trials are
   paused at rungs and promoted ones resume from their checkpoints. Its epochs, and the
   epochs its continuations would have trained had they started again from the first.

    python benchmarks/tuning_makespan.py [--trials 16] [--parallel CORES] [--epochs 9]
        [--epoch-seconds 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

# loss per epoch: a floor set by the values (best at lr=0.01, momentum 0.9) over a
# learning curve that falls with the epochs.
# It resumes at the epoch its checkpoint holds (written before the epoch's loss is logged).
TRAIN_PY = """\
import argparse, math, os, pathlib, time
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
p.add_argument("--momentum", type=float)
p.add_argument("--epochs", type=int)
p.add_argument("--pause", type=float)
a, _ = p.parse_known_args()
ckpt = pathlib.Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / "checkpoints"
ckpt.mkdir(parents=True, exist_ok=True)
state = ckpt / "epoch.txt"
start = int(state.read_text()) if state.exists() else 0
floor = (math.log10(a.lr) + 2) ** 2 + 4 * (a.momentum - 0.9) ** 2
for e in range(start, a.epochs):
    time.sleep(a.pause)
    (ckpt / "epoch.tmp").write_text(str(e + 1))
    (ckpt / "epoch.tmp").replace(state)
    print(f"epoch={e} loss={floor + 2 / (e + 1):.5f}", flush=True)
"""
KEY_ID, SECRET = "TPAKBENCHMARK0000002", "benchmark-secret-tuning"


def _request(name: str, strategy: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "HyperParameterTuningJobName": name,
        "HyperParameterTuningJobConfig": {
            "Strategy": strategy,
            "HyperParameterTuningJobObjective": {"Type": "Minimize", "MetricName": "loss"},
            "ResourceLimits": {
                "MaxNumberOfTrainingJobs": args.trials,
                "MaxParallelTrainingJobs": args.parallel,
            },
            "ParameterRanges": {
                "ContinuousParameterRanges": [
                    {"Name": "lr", "MinValue": "0.0001", "MaxValue": "1",
                     "ScalingType": "Logarithmic"},
                    {"Name": "momentum", "MinValue": "0.5", "MaxValue": "0.99"},
                ]
            },
            "RandomSeed": 2024,
        },
        "TrainingJobDefinition": {
            "StaticHyperParameters": {
                "sagemaker_program": json.dumps("train.py"),
                "sagemaker_submit_directory": json.dumps("s3://bench/code/sourcedir.tar.gz"),
                "epochs": str(args.epochs),
                "pause": str(args.epoch_seconds),
            },
            "AlgorithmSpecification": {
                "TrainingImage": "trainport/python",
                "TrainingInputMode": "File",
                "MetricDefinitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
            },
            "RoleArn": "arn:aws:iam::000000000000:role/benchmark",
            "OutputDataConfig": {"S3OutputPath": "s3://bench/out"},
            "ResourceConfig": {
                "InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1
            },
            "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        },
    }  # fmt: skip


def _run(sm: Any, request: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    name = request["HyperParameterTuningJobName"]
    sm.create_hyper_parameter_tuning_job(**request)
    while True:
        d: dict[str, Any] = sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        if d["HyperParameterTuningJobStatus"] in ("Completed", "Failed", "Stopped"):
            break
        time.sleep(0.2)
    kids = sm.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName=name, MaxResults=100
    )["TrainingJobSummaries"]
    return d, kids


def _epochs(home: Path, child: str) -> tuple[int, int]:
    """The epochs a child trained, and the first of them."""
    log = home / "jobs" / child / "logs" / "algo-1.log"
    numbers = [int(m) for m in re.findall(r"epoch=(\d+) loss=", log.read_text())]
    return len(numbers), (numbers[0] if numbers else 0)


def _makespan(sm: Any, d: dict[str, Any], kids: list[dict[str, Any]], parallel: int) -> None:
    makespan = d["HyperParameterTuningEndTime"].timestamp() - d["CreationTime"].timestamp()
    own = []
    for k in kids:
        job = sm.describe_training_job(TrainingJobName=k["TrainingJobName"])
        end = job["SecondaryStatusTransitions"][-1]["StartTime"]
        own.append(end.timestamp() - job["CreationTime"].timestamp())
    ideal = sum(own) / parallel
    print(
        f"makespan: {makespan:.2f} s for {len(kids)} children, {parallel} at a time; "
        f"ideal (sum of their own {sum(own):.2f} s / {parallel}) {ideal:.2f} s; "
        f"ratio {makespan / ideal:.3f}; a child's own run time {min(own):.2f}-{max(own):.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--epochs", type=int, default=9)
    parser.add_argument("--epoch-seconds", type=float, default=0.3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainport-tuning-bench-") as tmp:
        home = Path(tmp) / "home"
        os.environ.update(
            TRAINPORT_HOME=str(home),
            TRAINPORT_SERVER_KEYS=f"{KEY_ID}:{SECRET}",
            TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER="1",
            TRAINPORT_RUNNER="process",  # the tuning job's own costs, not a sandbox's
        )
        from trainport.config import load_settings
        from trainport.host.script_mode import pack_entry_point
        from trainport.server.app import ServerConfig, build_server

        script = Path(tmp) / "train.py"
        script.write_text(TRAIN_PY)
        code = home / "store" / "bench" / "code" / "sourcedir.tar.gz"
        code.parent.mkdir(parents=True)
        code.write_bytes(pack_entry_point(script))
        config = ServerConfig(port=0, max_concurrent_jobs=args.parallel, scheduler_interval=0.2)
        server = build_server(config, load_settings())
        server.start_background()
        try:
            sm = boto3.client(
                "sagemaker",
                endpoint_url=server.url,
                region_name="us-east-1",
                aws_access_key_id=KEY_ID,
                aws_secret_access_key=SECRET,
            )
            print(
                f"{args.trials} trials of {args.epochs} epochs x {args.epoch_seconds} s, "
                f"MaxParallelTrainingJobs {args.parallel} ({os.cpu_count()} cores)"
            )
            results = {}
            for label, strategy in (
                ("Random", "Random"),
                ("Hyperband", "Hyperband"),
                ("Hyperband+checkpoints", "Hyperband"),
            ):
                request = _request(label.lower().replace("+", "-"), strategy, args)
                if label.endswith("checkpoints"):
                    request["TrainingJobDefinition"]["CheckpointConfig"] = {
                        "S3Uri": "s3://bench/checkpoints"
                    }
                started = time.monotonic()
                d, kids = _run(sm, request)
                took = time.monotonic() - started
                if strategy == "Random":
                    _makespan(sm, d, kids, args.parallel)
                counted = [_epochs(home, k["TrainingJobName"]) for k in kids]
                epochs = sum(n for n, _ in counted)
                again = sum(first for _, first in counted)  # had continuations restarted
                best = d["BestTrainingJob"]["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
                stopped = sum(k["TrainingJobStatus"] == "Stopped" for k in kids)
                results[label] = (epochs, best)
                extra = f"; {epochs + again} had they restarted" if again else ""
                print(
                    f"{label:<21}: {epochs:3d} epochs trained by {len(kids)} jobs ({stopped} "
                    f"stopped or paused{extra}), best loss {best:.4f}, {took:.1f} s"
                )
            r_epochs, r_best = results["Random"]
            for label in ("Hyperband", "Hyperband+checkpoints"):
                epochs, best = results[label]
                print(
                    f"{label}/Random: {epochs / r_epochs:.2f}x the epochs, best loss "
                    f"{best:.4f} vs {r_best:.4f}"
                )
        finally:
            server.close()


if __name__ == "__main__":
    main()
