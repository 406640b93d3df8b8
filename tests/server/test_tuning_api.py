"""Hyperparameter tuning jobs through boto3 against a real server: each strategy runs
real script-mode children, and the API answers as SageMaker's does."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import client, start_server
from tests.server.tuning_support import (
    children,
    definition,
    put_source,
    tuning_request,
    wait_tuning,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def sm(server_home: Path, tmp_path: Path) -> Any:
    put_source(server_home, tmp_path)
    srv = start_server()
    yield client(srv)
    srv.close()


def _intervals(sm: Any, names: list[str]) -> list[tuple[float, float]]:
    out = []
    for name in names:
        d = sm.describe_training_job(TrainingJobName=name)
        transitions = d["SecondaryStatusTransitions"]
        out.append((d["CreationTime"].timestamp(), transitions[-1]["StartTime"].timestamp()))
    return out


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_random_search_runs_its_children_and_names_the_best(sm: Any) -> None:
    sm.create_hyper_parameter_tuning_job(
        **tuning_request("rnd", "Random", max_jobs=5, RandomSeed=7)
    )
    d = wait_tuning(sm, "rnd")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    assert d["TrainingJobStatusCounters"]["Completed"] == 5
    assert d["ObjectiveStatusCounters"] == {"Succeeded": 5, "Pending": 0, "Failed": 0}
    kids = children(sm, "rnd")
    assert len(kids) == 5 and len({k["TrainingJobName"] for k in kids}) == 5
    values = {
        k["TrainingJobName"]: k["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
        for k in kids
    }
    best = d["BestTrainingJob"]
    assert best["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == min(values.values())
    for kid in kids:
        job = sm.describe_training_job(TrainingJobName=kid["TrainingJobName"])
        assert job["TuningJobArn"] == d["HyperParameterTuningJobArn"]
        tuned = kid["TunedHyperParameters"]
        # The child's own hyperparameters: the static ones and the tuned values.
        assert job["HyperParameters"] == {
            **d["TrainingJobDefinition"]["StaticHyperParameters"],
            **tuned,
        }
        shift, kind = float(tuned["shift"]), tuned["kind"]
        expected = (shift - 3) ** 2 + 1 / 3 + (0.5 if kind == "b" else 0)
        assert values[kid["TrainingJobName"]] == pytest.approx(expected, abs=1e-3)
    # MaxParallelTrainingJobs: never more than 2 children at once.
    assert _most_at_once(_intervals(sm, list(values))) <= 2
    # Children show wherever jobs show.
    listed = {
        j["TrainingJobName"] for j in sm.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]
    }
    assert set(values) <= listed


def test_a_random_seed_reproduces_the_values(sm: Any) -> None:
    for name in ("seeded-1", "seeded-2"):
        request = tuning_request(name, "Random", max_jobs=3, parallel=3, RandomSeed=11)
        sm.create_hyper_parameter_tuning_job(**request)
    tuned = []
    for name in ("seeded-1", "seeded-2"):
        wait_tuning(sm, name)
        kids = sorted(children(sm, name), key=lambda k: k["TrainingJobName"])
        tuned.append([k["TunedHyperParameters"] for k in kids])
    assert tuned[0] == tuned[1]
    assert len({json.dumps(t, sort_keys=True) for t in tuned[0]}) == 3


def test_grid_search_trains_each_combination_once(sm: Any) -> None:
    ranges = {
        "CategoricalParameterRanges": [
            {"Name": "kind", "Values": ["a", "b"]},
            {"Name": "shift", "Values": ["1", "3", "5"]},
        ]
    }
    request = tuning_request("grid", "Grid", max_jobs=None, parallel=3, ranges=ranges)
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "grid")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    combos = sorted(
        (k["TunedHyperParameters"]["kind"], k["TunedHyperParameters"]["shift"])
        for k in children(sm, "grid")
    )
    assert combos == [("a", "1"), ("a", "3"), ("a", "5"), ("b", "1"), ("b", "3"), ("b", "5")]
    assert d["BestTrainingJob"]["TunedHyperParameters"] == {"kind": "a", "shift": "3"}
    ordered = children(sm, "grid", SortBy="FinalObjectiveMetricValue", SortOrder="Ascending")
    values = [k["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] for k in ordered]
    assert values == sorted(values)


def test_bayesian_search_completes(sm: Any) -> None:
    request = tuning_request("bayes", "Bayesian", max_jobs=6, parallel=2, RandomSeed=5)
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "bayes")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    assert d["ObjectiveStatusCounters"]["Succeeded"] == 6
    assert "BestTrainingJob" in d


def test_hyperband_stops_weak_children_and_completes_the_best(sm: Any) -> None:
    request = tuning_request(
        "hband",
        "Hyperband",
        max_jobs=6,
        parallel=2,
        RandomSeed=3,
        static={"epochs": "9", "pause": "0.3"},
        StrategyConfig={"HyperbandStrategyConfig": {"MinResource": 1}},
    )
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "hband")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    kids = children(sm, "hband")
    stopped = [k for k in kids if k["TrainingJobStatus"] == "Stopped"]
    assert stopped, kids
    # A child stopped early counts as Stopped, and its objective as reported.
    assert d["TrainingJobStatusCounters"]["Stopped"] == len(stopped)
    assert all(k["ObjectiveStatus"] == "Succeeded" for k in stopped)
    best = d["BestTrainingJob"]
    assert best["TrainingJobStatus"] == "Completed"
    # MaxResource came from the epochs hyperparameter: the best child trained all 9.
    log = "\n".join(e["message"] for e in client_logs(sm, best["TrainingJobName"]))
    assert "epoch=8 " in log


def client_logs(sm: Any, job: str) -> list[dict[str, Any]]:
    logs = client_for_logs(sm)
    streams = logs.describe_log_streams(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=job
    )["logStreams"]
    return logs.get_log_events(
        logGroupName="/aws/sagemaker/TrainingJobs",
        logStreamName=streams[0]["logStreamName"],
        startFromHead=True,
    )["events"]


def client_for_logs(sm: Any) -> Any:
    import boto3

    return boto3.client(
        "logs",
        endpoint_url=sm.meta.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=sm._request_signer._credentials.access_key,
        aws_secret_access_key=sm._request_signer._credentials.secret_key,
    )


def test_stop_ends_every_child_and_launches_no_more(sm: Any) -> None:
    request = tuning_request(
        "stopped", "Random", max_jobs=6, parallel=2, static={"epochs": "1000", "pause": "1"}
    )
    sm.create_hyper_parameter_tuning_job(**request)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = children(sm, "stopped")
        if len(kids) == 2 and all(
            sm.describe_training_job(TrainingJobName=k["TrainingJobName"])["SecondaryStatus"]
            == "Training"
            for k in kids
        ):
            break
        time.sleep(0.2)
    sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="stopped")
    d = wait_tuning(sm, "stopped")
    assert d["HyperParameterTuningJobStatus"] == "Stopped"
    kids = children(sm, "stopped")
    assert len(kids) == 2
    assert {k["TrainingJobStatus"] for k in kids} == {"Stopped"}
    with pytest.raises(ClientError) as again:
        sm.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName="stopped")
    assert "cannot be stopped" in again.value.response["Error"]["Message"]


def test_list_describe_delete(sm: Any) -> None:
    for name in ("lst-b", "lst-a"):
        sm.create_hyper_parameter_tuning_job(
            **tuning_request(name, "Random", max_jobs=1, parallel=1)
        )
    with pytest.raises(ClientError) as running:
        sm.delete_hyper_parameter_tuning_job(HyperParameterTuningJobName="lst-a")
    assert "stop it first" in running.value.response["Error"]["Message"]
    for name in ("lst-b", "lst-a"):
        wait_tuning(sm, name)
    page = sm.list_hyper_parameter_tuning_jobs(SortBy="Name", SortOrder="Ascending", MaxResults=1)
    assert [s["HyperParameterTuningJobName"] for s in page["HyperParameterTuningJobSummaries"]] == [
        "lst-a"
    ]
    rest = sm.list_hyper_parameter_tuning_jobs(
        SortBy="Name", SortOrder="Ascending", NextToken=page["NextToken"]
    )
    assert [s["HyperParameterTuningJobName"] for s in rest["HyperParameterTuningJobSummaries"]] == [
        "lst-b"
    ]
    summary = rest["HyperParameterTuningJobSummaries"][0]
    assert (
        summary["Strategy"] == "Random" and summary["TrainingJobStatusCounters"]["Completed"] == 1
    )
    assert (
        sm.list_hyper_parameter_tuning_jobs(NameContains="b")["HyperParameterTuningJobSummaries"][
            0
        ]["HyperParameterTuningJobName"]
        == "lst-b"
    )
    sm.delete_hyper_parameter_tuning_job(HyperParameterTuningJobName="lst-a")
    with pytest.raises(ClientError) as gone:
        sm.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName="lst-a")
    assert "not found" in gone.value.response["Error"]["Message"]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda r: r["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"].update(
                MetricName="accuracy"
            ),
            "the objective metric 'accuracy' is not one of the definition's MetricDefinitions",
        ),
        (
            lambda r: r["HyperParameterTuningJobConfig"]["ParameterRanges"][
                "ContinuousParameterRanges"
            ][0].update(MinValue="7"),
            "MinValue (7) must be less than or equal to MaxValue (6)",
        ),
        (
            lambda r: r["HyperParameterTuningJobConfig"].update(Strategy="Grid"),
            "Grid searches categorical ranges only",
        ),
        (
            lambda r: r["TrainingJobDefinition"]["StaticHyperParameters"].update(shift="1"),
            "'shift' is both static and tuned",
        ),
        (
            lambda r: r["TrainingJobDefinition"]["StaticHyperParameters"].update(
                sagemaker_submit_directory=json.dumps("s3://data/code/missing.tar.gz")
            ),
            "its training jobs would be refused",
        ),
    ],
)
def test_bad_requests_are_refused_before_anything_runs(sm: Any, change: Any, said: str) -> None:
    request = tuning_request("bad", "Random")
    change(request)
    with pytest.raises(ClientError) as refused:
        sm.create_hyper_parameter_tuning_job(**request)
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException" and said in error["Message"], error
    assert sm.list_hyper_parameter_tuning_jobs()["HyperParameterTuningJobSummaries"] == []


def test_a_byo_image_is_tuned(
    server_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = tmp_path / "image"
    image.mkdir()
    train = image / "train"
    train.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os\n"
        "base = os.environ.get('SAGEMAKER_BASE_DIR', '/opt/ml')\n"
        "hp = json.load(open(base + '/input/config/hyperparameters.json'))\n"
        "print('loss=%.3f' % abs(float(hp['shift']) - 3), flush=True)\n"
    )
    train.chmod(train.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("TRAINPORT_SERVER_ALLOW_HOST_PATHS", "1")
    srv = start_server()
    try:
        sm = client(srv)
        body = definition()
        body["StaticHyperParameters"] = {}
        body["AlgorithmSpecification"]["TrainingImage"] = str(image)
        request = tuning_request("byo", "Random", max_jobs=3)
        request["TrainingJobDefinition"] = body
        # The image folder is under pytest's private tmp, which a sandbox's identity cannot
        # read; the tuning job's tags go to every child.
        request["Tags"] = [{"Key": "trainport:runner", "Value": "process"}]
        request["HyperParameterTuningJobConfig"]["ParameterRanges"] = {
            "IntegerParameterRanges": [{"Name": "shift", "MinValue": "0", "MaxValue": "6"}]
        }
        sm.create_hyper_parameter_tuning_job(**request)
        d = wait_tuning(sm, "byo")
        assert d["HyperParameterTuningJobStatus"] == "Completed", d
        for kid in children(sm, "byo"):
            shift = int(kid["TunedHyperParameters"]["shift"])
            value = kid["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
            assert value == pytest.approx(abs(shift - 3))
            job = sm.describe_training_job(TrainingJobName=kid["TrainingJobName"])
            assert job["HyperParameters"] == {
                "_tuning_objective_metric": "loss",
                "shift": str(shift),
            }
    finally:
        srv.close()


def test_auto_early_stopping_stops_a_child_worse_than_the_median(sm: Any) -> None:
    ranges = {
        "CategoricalParameterRanges": [
            {"Name": "kind", "Values": ["a"]},
            {"Name": "shift", "Values": ["3", "2.5", "3.5", "0"]},
        ]
    }
    request = tuning_request(
        "median",
        "Grid",
        max_jobs=None,
        parallel=1,
        ranges=ranges,
        static={"epochs": "6", "pause": "0.3"},
        TrainingJobEarlyStoppingType="Auto",
    )
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "median")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    status = {
        k["TunedHyperParameters"]["shift"]: k["TrainingJobStatus"] for k in children(sm, "median")
    }
    # The first three are judged against fewer than three children before them; the fourth
    # (loss 9 and more) is far worse than their median, and is stopped.
    assert status == {"3": "Completed", "2.5": "Completed", "3.5": "Completed", "0": "Stopped"}
    assert d["TrainingJobStatusCounters"]["Stopped"] == 1
    assert d["BestTrainingJob"]["TunedHyperParameters"]["shift"] == "3"


def test_a_warm_start_reads_its_parents(sm: Any) -> None:
    ranges = {
        "CategoricalParameterRanges": [
            {"Name": "kind", "Values": ["a"]},
            {"Name": "shift", "Values": ["3", "0", "6"]},
        ]
    }
    parent = tuning_request("parent", "Grid", max_jobs=None, parallel=3, ranges=ranges)
    sm.create_hyper_parameter_tuning_job(**parent)
    with pytest.raises(ClientError) as early:
        child = tuning_request("warm", "Bayesian", max_jobs=2, parallel=2, RandomSeed=1)
        child["WarmStartConfig"] = {
            "ParentHyperParameterTuningJobs": [{"HyperParameterTuningJobName": "parent"}],
            "WarmStartType": "IdenticalDataAndAlgorithm",
        }
        sm.create_hyper_parameter_tuning_job(**child)
    assert "a parent must have ended" in early.value.response["Error"]["Message"]
    parent_best = wait_tuning(sm, "parent")["BestTrainingJob"]
    sm.create_hyper_parameter_tuning_job(**child)
    d = wait_tuning(sm, "warm")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    assert d["WarmStartConfig"]["ParentHyperParameterTuningJobs"] == [
        {"HyperParameterTuningJobName": "parent"}
    ]
    # The overall best is the parent's (loss 1/3 at shift 3) unless a child matched it.
    overall = d["OverallBestTrainingJob"]
    value = overall["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
    assert value == parent_best["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
    assert value <= d["BestTrainingJob"]["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]


def test_several_definitions_take_turns(sm: Any) -> None:
    request = tuning_request("multi", "Random", max_jobs=4, parallel=2, RandomSeed=3)
    config = request["HyperParameterTuningJobConfig"]
    objective = config.pop("HyperParameterTuningJobObjective")
    ranges = config.pop("ParameterRanges")
    body = request.pop("TrainingJobDefinition")
    request["TrainingJobDefinitions"] = [
        {
            **body,
            "DefinitionName": name,
            "TuningObjective": objective,
            "HyperParameterRanges": ranges,
        }
        for name in ("first", "second")
    ]
    request["TrainingJobDefinitions"][1]["StaticHyperParameters"] = {
        **body["StaticHyperParameters"],
        "epochs": "2",
    }
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "multi")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    assert [x["DefinitionName"] for x in d["TrainingJobDefinitions"]] == ["first", "second"]
    kids = sorted(children(sm, "multi"), key=lambda k: k["TrainingJobName"])
    assert [k["TrainingJobDefinitionName"] for k in kids] == ["first", "second"] * 2
    for kid in kids:
        job = sm.describe_training_job(TrainingJobName=kid["TrainingJobName"])
        epochs = job["HyperParameters"].get("epochs")
        assert epochs == ("2" if kid["TrainingJobDefinitionName"] == "second" else None)
    completed = children(sm, "multi", StatusEquals="Completed")
    assert len(completed) == 4
    assert children(sm, "multi", StatusEquals="Failed") == []


def test_a_tuning_job_whose_children_all_fail_fails(sm: Any) -> None:
    # --pause is not a number: every child's script exits with an argparse error.
    request = tuning_request("broken", "Random", max_jobs=5, parallel=3, static={"pause": "x"})
    sm.create_hyper_parameter_tuning_job(**request)
    d = wait_tuning(sm, "broken")
    assert d["HyperParameterTuningJobStatus"] == "Failed", d
    assert "No training job reported the objective metric 'loss'" in d["FailureReason"]
    # Three failed, and the tuning job ended: those running then were stopped.
    counters = d["TrainingJobStatusCounters"]
    assert counters["NonRetryableError"] >= 3
    launched = len(children(sm, "broken"))
    assert counters["NonRetryableError"] + counters["Stopped"] == launched
    assert d["ObjectiveStatusCounters"]["Failed"] == launched
    assert "BestTrainingJob" not in d
