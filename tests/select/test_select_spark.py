"""MOP in a Spark barrier stage (local mode): same numbers as the local backend."""

from __future__ import annotations

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
