"""MOP in a Spark barrier stage (local mode): same numbers as the local backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from select_testkit import (
    assert_no_overlap,
    final_weights,
    max_weight_diff,
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
