"""MOP on a local Ray cluster: same numbers as the local backend, and actor loss recovery."""

from __future__ import annotations

from pathlib import Path

import pytest
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


@pytest.fixture(scope="module")
def ray_cluster(require):
    ray = require("ray", "the Ray backend tests start a local Ray cluster")
    # The test helpers live beside the tests; actors import them from there.
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}},
    )
    yield ray
    ray.shutdown()


def test_ray_gives_the_same_results_as_local(ray_cluster, local_run, dataset: Path) -> None:
    from trainport.select.backends.ray import RayBackend

    result = run_workload(workload(dataset), RayBackend())
    assert max_weight_diff(final_weights(result), final_weights(local_run)) <= 1e-6
    assert [(r.model, r.epoch) for r in result.epochs] == [
        (r.model, r.epoch) for r in local_run.epochs
    ]
    for a, b in zip(result.epochs, local_run.epochs, strict=True):
        assert a.validation == pytest.approx(b.validation, abs=1e-6)
        assert a.train == pytest.approx(b.train, abs=1e-6)
    assert result.best_model == local_run.best_model
    assert_no_overlap(unit_intervals(result, "model"))
    assert_no_overlap(unit_intervals(result, "worker"))
    assert result.bytes_hopped > 0


def test_ray_actor_killed_mid_unit_is_replaced(
    ray_cluster, local_run, dataset: Path, tmp_path: Path
) -> None:
    from trainport.select.backends.ray import RayBackend

    killer = KillOnce(trainer(), marker_path(tmp_path), epoch=2)
    result = run_workload(workload(dataset, trainer=killer), RayBackend())
    lost = [u for u in result.units if u.status == "lost"]
    assert len(lost) == 1
    done = [(u.round, u.model, u.partition) for u in result.units if u.status == "done"]
    assert len(done) == len(set(done)) == 3 * 4 * 2
    assert {s.worker: s.loads for s in result.workers}[lost[0].worker] == 2
    assert max_weight_diff(final_weights(result), final_weights(local_run)) <= 1e-6


def test_ray_workers_run_the_tests_environment(ray_cluster) -> None:
    """A worker must run this environment's interpreter, not the machine's python3."""
    import sys

    @ray_cluster.remote
    def where() -> tuple[str, str]:
        import sys

        import trainport

        return sys.prefix, trainport.__file__

    prefix, module = ray_cluster.get(where.remote())
    assert Path(prefix).resolve() == Path(sys.prefix).resolve()
    assert Path(module).resolve().is_relative_to(Path(__file__).resolve().parents[2] / "src")
