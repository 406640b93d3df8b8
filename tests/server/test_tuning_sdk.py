"""The SageMaker Python SDK v2's HyperparameterTuner, unchanged, against a real trainport
server: fit, attach, best_training_job, analytics and stop_tuning_job, with a script-mode
estimator whose sources the SDK uploads to moto's S3 server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.server.test_sagemaker_sdk import run_session, sdk_server  # noqa: F401
from tests.server.tuning_support import TRAIN_PY

pytestmark = pytest.mark.slow

_ESTIMATOR = """
from sagemaker.pytorch import PyTorch
from sagemaker.tuner import CategoricalParameter, ContinuousParameter, HyperparameterTuner

def make_tuner(max_jobs, parallel, hyperparameters, strategy="Random", **kwargs):
    estimator = PyTorch(
        entry_point="train.py",
        source_dir="src",
        role=ROLE,
        framework_version="2.5",
        py_version="py311",
        instance_type="ml.m5.large",
        instance_count=1,
        hyperparameters=hyperparameters,
        sagemaker_session=session,
    )
    return HyperparameterTuner(
        estimator,
        objective_metric_name="loss",
        objective_type="Minimize",
        metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
        hyperparameter_ranges={
            "shift": ContinuousParameter(0, 6),
            "kind": CategoricalParameter(["a", "b"]),
        },
        strategy=strategy,
        max_jobs=max_jobs,
        max_parallel_jobs=parallel,
        **kwargs,
    )
"""

_FIT = """
tuner = make_tuner(4, 2, {"epochs": 3}, random_seed=4)
tuner.fit(wait=True)
name = tuner.latest_tuning_job.name
print("status:", tuner.describe()["HyperParameterTuningJobStatus"])
print("best:", tuner.best_training_job())
attached = HyperparameterTuner.attach(name, sagemaker_session=session)
print("attached best:", attached.best_training_job())
frame = tuner.analytics().dataframe()
print("rows:", len(frame))
print("columns:", sorted(frame.columns))
best = frame.sort_values("FinalObjectiveValue").iloc[0]
print("best row:", best["TrainingJobName"])
"""

_HYPERBAND = """
from sagemaker.tuner import HyperbandStrategyConfig, StrategyConfig

tuner = make_tuner(
    6,
    2,
    {"epochs": 9, "pause": 0.3},
    strategy="Hyperband",
    random_seed=3,
    strategy_config=StrategyConfig(HyperbandStrategyConfig(min_resource=1, max_resource=9)),
)
tuner.fit(wait=True)
statuses = sorted(
    s["TrainingJobStatus"]
    for s in session.sagemaker_client.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName=tuner.latest_tuning_job.name, MaxResults=100
    )["TrainingJobSummaries"]
)
print("statuses:", statuses)
print("best:", tuner.best_training_job())
"""

_STOP = """
import time

tuner = make_tuner(6, 2, {"epochs": 1000, "pause": 1})
tuner.fit(wait=False)
client = session.sagemaker_client
name = tuner.latest_tuning_job.name
while len(client.list_training_jobs_for_hyper_parameter_tuning_job(
    HyperParameterTuningJobName=name)["TrainingJobSummaries"]) < 2:
    time.sleep(0.2)
tuner.stop_tuning_job()
tuner.wait()
print("status:", tuner.describe()["HyperParameterTuningJobStatus"])
kids = client.list_training_jobs_for_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
print("children:", sorted(k["TrainingJobStatus"] for k in kids["TrainingJobSummaries"]))
"""


_BYO = """
from sagemaker.estimator import Estimator
from sagemaker.tuner import HyperparameterTuner, IntegerParameter

estimator = Estimator(
    image_uri=IMAGE,
    role=ROLE,
    instance_type="ml.m5.large",
    instance_count=1,
    hyperparameters={"epochs": 2},
    sagemaker_session=session,
)
tuner = HyperparameterTuner(
    estimator,
    objective_metric_name="loss",
    objective_type="Minimize",
    metric_definitions=[{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
    hyperparameter_ranges={"shift": IntegerParameter(0, 6)},
    strategy="Random",
    max_jobs=3,
    max_parallel_jobs=3,
    random_seed=2,
    # The image folder is under pytest's private tmp: the process runner reads it.
    tags=[{"Key": "trainport:runner", "Value": "process"}],
)
tuner.fit(wait=True)
best = session.sagemaker_client.describe_hyper_parameter_tuning_job(
    HyperParameterTuningJobName=tuner.latest_tuning_job.name
)["BestTrainingJob"]
print("best:", best["TunedHyperParameters"]["shift"], best["FinalHyperParameterTuningJobObjectiveMetric"]["Value"])
"""

BYO_TRAIN = """#!/usr/bin/env python3
import json, os
base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
hp = json.load(open(base + "/input/config/hyperparameters.json"))
for e in range(int(hp["epochs"])):
    print("loss=%.3f" % (abs(int(hp["shift"]) - 3) + 1 / (e + 1)), flush=True)
"""


@pytest.fixture
def host_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the server starts: it lets a tuning job name an image folder of this machine."""
    monkeypatch.setenv("TRAINPORT_SERVER_ALLOW_HOST_PATHS", "1")


def _run(server: Any, moto_endpoint: str, tmp_path: Path, code: str) -> str:
    workdir = tmp_path / "work"
    (workdir / "src").mkdir(parents=True)
    (workdir / "src" / "train.py").write_text(TRAIN_PY)
    done = run_session(server, moto_endpoint, workdir, _ESTIMATOR + code, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def _line(out: str, prefix: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(prefix))[len(prefix) :].strip()


def test_fit_attach_best_and_analytics(
    sdk_server: Any,  # noqa: F811
    moto_endpoint: str,
    tmp_path: Path,
) -> None:
    out = _run(sdk_server, moto_endpoint, tmp_path, _FIT)
    assert _line(out, "status:") == "Completed", out
    best = _line(out, "best:")
    assert best and _line(out, "attached best:") == best
    assert _line(out, "rows:") == "4"
    columns = _line(out, "columns:")
    for column in ("FinalObjectiveValue", "TrainingJobName", "shift", "kind"):
        assert repr(column) in columns, columns
    assert _line(out, "best row:") == best


def test_hyperband(sdk_server: Any, moto_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    out = _run(sdk_server, moto_endpoint, tmp_path, _HYPERBAND)
    statuses = _line(out, "statuses:")
    assert "'Stopped'" in statuses and "'Completed'" in statuses, out


def test_stop_tuning_job(sdk_server: Any, moto_endpoint: str, tmp_path: Path) -> None:  # noqa: F811
    out = _run(sdk_server, moto_endpoint, tmp_path, _STOP)
    assert _line(out, "status:") == "Stopped", out
    assert _line(out, "children:") == "['Stopped', 'Stopped']", out


def test_a_byo_image_estimator(
    host_paths: None,
    sdk_server: Any,  # noqa: F811
    moto_endpoint: str,
    tmp_path: Path,
) -> None:
    image = tmp_path / "image"
    image.mkdir()
    (image / "train").write_text(BYO_TRAIN)
    (image / "train").chmod(0o755)
    out = _run(sdk_server, moto_endpoint, tmp_path, f"IMAGE = {str(image)!r}\n" + _BYO)
    shift, value = _line(out, "best:").split()
    assert float(value) == pytest.approx(abs(int(shift) - 3) + 0.5, abs=1e-3), out
