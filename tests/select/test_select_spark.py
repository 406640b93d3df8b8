"""MOP in a Spark barrier stage (local mode): same numbers as the local backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import select_testkit
from select_testkit import (
    KillOnce,
    assert_no_overlap,
    final_weights,
    marker_path,
    max_weight_diff,
    trainer,
    unit_intervals,
    workload,
)

from trainport.errors import JobError
from trainport.select.mop import run_workload

pytestmark = pytest.mark.slow


def test_spark_gives_the_same_results_as_local(
    local_run, dataset: Path, require, require_binary
) -> None:
    require("pyspark", "the Spark backend tests run Spark in local mode")
    require_binary("java")
    from trainport.select.backends.spark import SparkBackend

    result = run_workload(workload(dataset), SparkBackend())
    assert result.backend == "spark"
    assert max_weight_diff(final_weights(result), final_weights(local_run)) <= 1e-6
    for a, b in zip(result.epochs, local_run.epochs, strict=True):
        assert (a.model, a.epoch) == (b.model, b.epoch)
        assert a.validation == pytest.approx(b.validation, abs=1e-6)
    assert_no_overlap(unit_intervals(result, "model"))
    assert_no_overlap(unit_intervals(result, "worker"))
    assert {s.worker: s.loads for s in result.workers} == {0: 1, 1: 1}


def test_spark_task_killed_mid_unit_restarts_the_stage(
    local_run, dataset: Path, tmp_path: Path, require, require_binary
) -> None:
    cloudpickle = require("pyspark.cloudpickle", "the Spark backend tests run Spark locally")
    require_binary("java")
    from trainport.select.backends.spark import SparkBackend

    # Spark's workers cannot import the test helpers; ship them by value instead.
    cloudpickle.register_pickle_by_value(select_testkit)
    try:
        killer = KillOnce(trainer(), marker_path(tmp_path), epoch=2)
        result = run_workload(workload(dataset, trainer=killer), SparkBackend())
    finally:
        cloudpickle.unregister_pickle_by_value(select_testkit)
    lost = [u for u in result.units if u.status == "lost"]
    assert 1 <= len(lost) <= 2  # the killed unit, and the other task's if one was running
    done = [(u.round, u.model, u.partition) for u in result.units if u.status == "done"]
    assert len(done) == len(set(done)) == 3 * 4 * 2
    assert {s.worker: s.loads for s in result.workers} == {0: 2, 1: 2}  # whole stage reloaded
    assert max_weight_diff(final_weights(result), final_weights(local_run)) <= 1e-6


def test_spark_executors_run_the_tests_environment(require, require_binary) -> None:
    """Executors must run this environment's interpreter, not the machine's python3."""
    require("pyspark", "the Spark backend tests run Spark in local mode")
    require_binary("java")
    from trainport.select.backends.spark import SparkBackend, probe_executors

    backend = SparkBackend()
    try:
        report = probe_executors(backend.open_session(1))
    finally:
        backend.close()
    assert report.problem is None
    assert Path(report.prefix).resolve() == Path(sys.prefix).resolve()


def test_spark_executors_without_trainport_fail_at_once_naming_the_interpreter(
    dataset: Path, tmp_path: Path, require, require_binary
) -> None:
    require("pyspark", "the Spark backend tests run Spark in local mode")
    require_binary("java")
    from trainport.select.backends.spark import SparkBackend

    # A bare environment of the same Python version: Spark's worker runs, trainport is absent.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    # Spark's own Python modules come from its PYTHONPATH, so only trainport is missing.
    backend = SparkBackend(conf={"spark.pyspark.python": python})
    with pytest.raises(JobError) as caught:
        run_workload(workload(dataset), backend)
    message = str(caught.value)
    assert python in message or str(bare) in message
    assert "PYSPARK_PYTHON" in message
    assert "trainport" in message
    assert "barrier tasks connected" not in message  # the probe's report, not a timeout
