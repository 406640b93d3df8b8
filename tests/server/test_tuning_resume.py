"""Tuning beyond a plain search, through boto3 against a real server: Hyperband resuming
promoted trials from their checkpoints, ConvergenceDetected, and Random search after a
warm start."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import client, put, start_server
from tests.server.test_tuning_api import client_logs
from tests.server.tuning_support import children, put_source, tuning_request, wait_tuning
from trainport.host.script_mode import pack_entry_point

pytestmark = pytest.mark.slow

# As tuning_support's script, but resuming from the epoch its checkpoint holds. The
# checkpoint is written before the epoch's loss is logged, so a child stopped once its
# tuning job has seen the loss keeps that epoch.
RESUMING_PY = """\
import argparse, os, pathlib, time
p = argparse.ArgumentParser()
p.add_argument("--shift", type=float, default=0.0)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--pause", type=float, default=0.05)
a, _ = p.parse_known_args()
ckpt = pathlib.Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")) / "checkpoints"
ckpt.mkdir(parents=True, exist_ok=True)
state = ckpt / "epoch.txt"
start = int(state.read_text()) if state.exists() else 0
print(f"starting at epoch {start}", flush=True)
for e in range(start, a.epochs):
    time.sleep(a.pause)
    (ckpt / "epoch.tmp").write_text(str(e + 1))
    (ckpt / "epoch.tmp").replace(state)
    print(f"epoch={e} loss={(a.shift - 3) ** 2 + 1 / (e + 1):.4f}", flush=True)
"""
RESUMING_SOURCE = "s3://data/code/resume/sourcedir.tar.gz"


@pytest.fixture
def sm(server_home: Path, tmp_path: Path) -> Any:
    put_source(server_home, tmp_path)
    entry = tmp_path / "resume" / "train.py"
    entry.parent.mkdir()
    entry.write_text(RESUMING_PY)
    put(server_home, "data", "code/resume/sourcedir.tar.gz", pack_entry_point(entry))
    srv = start_server()
    yield client(srv)
    srv.close()


def _epochs(sm: Any, job: str) -> list[int]:
    # The job's own stream: a prefix without the "/" would match its continuations' too.
    lines = [e["message"] for e in client_logs(sm, job + "/")]
    return [int(m.group(1)) for line in lines if (m := re.search(r"epoch=(\d+) ", line))]


def test_hyperband_resumes_a_promoted_trial_from_its_checkpoint(sm: Any) -> None:
    request = tuning_request(
        "resume",
        "Hyperband",
        max_jobs=6,
        parallel=2,
        RandomSeed=3,
        ranges={"ContinuousParameterRanges": [{"Name": "shift", "MinValue": "0", "MaxValue": "6"}]},
        static={"epochs": "9", "pause": "0.3"},
        StrategyConfig={"HyperbandStrategyConfig": {"MinResource": 1}},
    )
    body = request["TrainingJobDefinition"]
    body["StaticHyperParameters"]["sagemaker_submit_directory"] = json.dumps(RESUMING_SOURCE)
    body["CheckpointConfig"] = {"S3Uri": "s3://out/checkpoints"}
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "resume")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    kids = {k["TrainingJobName"]: k for k in children(sm, "resume")}
    firsts = [n for n in kids if not re.search(r"-r\d+$", n)]
    continuations = sorted(set(kids) - set(firsts))
    assert len(firsts) == 6 and continuations, sorted(kids)
    # Every job is listed and counted; a paused one counts as Stopped.
    assert sum(d["TrainingJobStatusCounters"].values()) == len(kids)
    trained = restarted = 0
    for name in kids:
        epochs = _epochs(sm, name)
        trained += len(epochs)
        restarted += len(epochs) + (epochs[0] if epochs else 0)
        if name in continuations:
            first = name.rsplit("-r", 1)[0]
            assert kids[name]["TunedHyperParameters"] == kids[first]["TunedHyperParameters"]
            job = sm.describe_training_job(TrainingJobName=name)
            assert job["CheckpointConfig"]["S3Uri"] == f"s3://out/checkpoints/{first}"
            # It resumed where the paused child of its trial left off, not at epoch 0.
            assert epochs and epochs[0] > 0, (name, epochs)
    # The best trial trained to MaxResource, in a continuation; resuming saved epochs.
    best = d["BestTrainingJob"]
    assert best["TrainingJobName"] in continuations and best["TrainingJobStatus"] == "Completed"
    assert _epochs(sm, best["TrainingJobName"])[-1] == 8
    assert trained < restarted and trained < 6 * 9


def test_convergence_completes_the_tuning_job(sm: Any) -> None:
    # Every value of shift gives nearly the same loss: no child improves by more than 1%.
    ranges = {
        "ContinuousParameterRanges": [{"Name": "shift", "MinValue": "2.99", "MaxValue": "3.01"}]
    }
    request = tuning_request(
        "converge",
        "Random",
        max_jobs=20,
        parallel=1,
        ranges=ranges,
        static={"epochs": "1"},
        TuningJobCompletionCriteria={"ConvergenceDetected": {"CompleteOnConvergence": "Enabled"}},
    )
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "converge")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    # A window of 3 children (a tenth of 20, at least 3): it ends after the sixth.
    assert len(children(sm, "converge")) == 6
    assert "ConvergenceDetectedTime" in d["TuningJobCompletionDetails"]


def test_random_search_after_a_warm_start_trains_what_its_parent_did_not(sm: Any) -> None:
    shifts = {"Name": "shift", "Values": ["3", "0", "6", "1", "2"]}
    parent_ranges = {
        "CategoricalParameterRanges": [
            {"Name": "kind", "Values": ["a"]},
            {**shifts, "Values": ["3", "0", "6"]},
        ]
    }
    sm.create_hyper_parameter_tuning_job(
        **tuning_request("parent", "Grid", max_jobs=None, parallel=3, ranges=parent_ranges)
    )
    parent_best = wait_tuning(sm, "parent")["BestTrainingJob"]
    warm = {
        "ParentHyperParameterTuningJobs": [{"HyperParameterTuningJobName": "parent"}],
        "WarmStartType": "IdenticalDataAndAlgorithm",
    }
    ranges = {"CategoricalParameterRanges": [{"Name": "kind", "Values": ["a"]}, shifts]}
    for strategy in ("Grid", "Hyperband"):
        refused = tuning_request(
            "warm-refused",
            strategy,
            max_jobs=None if strategy == "Grid" else 2,
            ranges=ranges,
            static={"epochs": "2"},
        )
        refused["WarmStartConfig"] = warm
        with pytest.raises(ClientError) as error:
            sm.create_hyper_parameter_tuning_job(**refused)
        said = error.value.response["Error"]["Message"]
        assert f"supported with Strategy Bayesian or Random only, not {strategy}" in said
    request = tuning_request(
        "warm-random", "Random", max_jobs=3, parallel=3, RandomSeed=1, ranges=ranges
    )
    request["WarmStartConfig"] = warm
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "warm-random")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    assert {k["TunedHyperParameters"]["shift"] for k in children(sm, "warm-random")} <= {"1", "2"}
    # The parent's best (shift 3) stays the best overall.
    assert d["OverallBestTrainingJob"]["TrainingJobName"] == parent_best["TrainingJobName"]


def test_autotune_chooses_ranges_strategy_and_completion(sm: Any) -> None:
    request = tuning_request("auto", "Random", max_jobs=3, parallel=3, RandomSeed=2)
    config = request["HyperParameterTuningJobConfig"]
    config["ParameterRanges"] = {"AutoParameters": [{"Name": "shift", "ValueHint": "2.5"}]}
    request["Autotune"] = {"Mode": "Enabled"}
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "auto")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    chosen = d["HyperParameterTuningJobConfig"]
    assert d["Autotune"] == {"Mode": "Enabled"}
    assert chosen["Strategy"] == "Bayesian" and chosen["TrainingJobEarlyStoppingType"] == "Auto"
    assert chosen["ParameterRanges"]["ContinuousParameterRanges"] == [
        {"Name": "shift", "MinValue": "0.25", "MaxValue": "25.0", "ScalingType": "Auto"}
    ]
    assert chosen["ResourceLimits"]["MaxNumberOfTrainingJobs"] == 3  # as the request gave
    shifts = [float(k["TunedHyperParameters"]["shift"]) for k in children(sm, "auto")]
    assert len(shifts) == 3 and all(0.25 <= s <= 25 for s in shifts)
    refused = tuning_request("auto-bad", "Random")
    refused["HyperParameterTuningJobConfig"]["ParameterRanges"] = {
        "AutoParameters": [{"Name": "kind", "ValueHint": "a"}]
    }
    with pytest.raises(ClientError) as error:
        sm.create_hyper_parameter_tuning_job(**refused)
    assert "read only with Autotune" in error.value.response["Error"]["Message"]
    refused["Autotune"] = {"Mode": "Enabled"}
    with pytest.raises(ClientError) as error:
        sm.create_hyper_parameter_tuning_job(**refused)
    assert "cannot choose other values for 'kind'" in error.value.response["Error"]["Message"]
