"""The pure parts of what a tuning job does beyond a plain search: Hyperband pausing and
resuming trials that keep checkpoints, ConvergenceDetected, ScalingType Auto, Random
search after a warm start, and Autotune's choices."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from trainport.errors import ValidationError
from trainport.tuning.autotune import autotuned, range_from_hint
from trainport.tuning.plan import ChildView, best_child, converged, decide
from trainport.tuning.records import Child, ChildState, TuningRecord
from trainport.tuning.spec import (
    Definition,
    Objective,
    ParameterRange,
    TuningSpec,
    auto_scaling,
)
from trainport.tuning.stopping import Progress, hyperband_pauses, hyperband_promotions
from trainport.tuning.strategies import RandomSearch, _key

MIN = Objective("loss", minimize=True)
SHIFT = ParameterRange("shift", "Continuous", 0, 6)


def _trial(name: str, index: int, values: list[float], start: float, **kw: Any) -> Progress:
    points = tuple((start + i, v) for i, v in enumerate(values))
    return dataclasses.replace(Progress(name, index, points, True), **kw)


def test_a_trial_pauses_at_a_rung_unless_it_is_already_among_the_best_third() -> None:
    first = _trial("a", 0, [2.0], 0, running=False, paused=True, paused_at=1)
    second = _trial("b", 1, [3.0], 1)
    # Two at the rung: none goes on yet (n // 3 == 0).
    assert hyperband_pauses([first, second], 1, 9, MIN) == ([("b", 1)], [])
    third = _trial("c", 2, [1.0], 2)
    assert hyperband_pauses([first, second, third], 1, 9, MIN) == ([("b", 1)], [])
    # A continuation is judged only at rungs it reached itself.
    resumed = _trial("a-r1", 0, [2.0, 1.5], 0, before=1)
    assert hyperband_pauses([resumed, second, third], 1, 9, MIN)[0] == [("b", 1)]


def test_promotions_take_the_best_third_and_the_last_call_takes_the_best() -> None:
    paused = [
        _trial(f"p{i}", i, [v], i, running=False, paused=True, paused_at=1)
        for i, v in enumerate([3, 1, 2])
    ]
    assert hyperband_promotions(paused, 1, 9, MIN) == ["p1"]
    # Two at rung 3, none running and no new trial left: the better one goes on.
    high = [
        _trial("h0", 0, [1, 0.9, 0.8], 0, running=False, paused=True, paused_at=3),
        _trial("h1", 1, [1, 0.7, 0.6], 0, running=False, paused=True, paused_at=3),
    ]
    assert hyperband_promotions(high, 1, 9, MIN) == []
    assert hyperband_promotions(high, 1, 9, MIN, last_call=True) == ["h1"]


@dataclass
class _Job:
    shift: float
    start: int
    status: str = "InProgress"
    points: list[tuple[float, float]] = field(default_factory=list)


def _simulate(lag: int) -> tuple[TuningRecord, dict[str, _Job], list[ChildView]]:
    """A Hyperband run with checkpoints on a fake clock: each running child reports one
    epoch a tick, and a stop takes effect ``lag`` ticks after it is asked for (a child
    trains on meanwhile, as a real one does until the stop reaches it)."""
    body = {"CheckpointConfig": {"S3Uri": "s3://ckpt"}}
    definition = Definition(None, body, (SHIFT,), MIN, {})
    spec = TuningSpec("t", "Hyperband", (definition,), 6, 2, max_resource=9)
    shifts = [5.0, 2.0, 4.5, 3.1, 0.5, 3.0]
    record = TuningRecord("t", "arn", {}, 0.0, seed=1)
    jobs: dict[str, _Job] = {}
    stopping: dict[str, int] = {}
    for tick in range(1, 200):
        for name, job in jobs.items():
            epoch = job.start + len(job.points)
            if name in stopping and tick >= stopping[name]:
                job.status = "Stopped"
            elif job.status in ("InProgress", "Stopping") and epoch == 9:
                job.status = "Completed"
            elif job.status in ("InProgress", "Stopping"):
                job.points.append((tick, (job.shift - 3) ** 2 + 1 / (epoch + 1)))
        views = [
            ChildView(c, jobs[c.name].status, tuple(jobs[c.name].points), 0, tick)
            for c in record.children
        ]
        plan = decide(spec, record, views, tick)
        if plan.finish:
            assert plan.finish == ("Completed", None)
            return record, jobs, views
        rungs = dict(plan.paused_at)
        for name, why in plan.stop:
            jobs[name].status = "Stopping"
            stopping[name] = tick + lag
            record = record.with_child(name, stop_reason=why, paused_at=rungs.get(name))
        new = []
        for paused in plan.promote:
            name = f"{record.first_of_trial(paused).name}-r"
            was = jobs[paused]
            jobs[name] = _Job(was.shift, was.start + len(was.points))
            new.append(Child(0, name, None, {}, "created", tick, continues=paused))
        for trial in range(record.trials, record.trials + plan.launch):
            jobs[f"t{trial}"] = _Job(shifts[trial], 0)
            new.append(Child(0, f"t{trial}", None, {}, "created", tick))
        new = [dataclasses.replace(c, index=len(record.children) + i) for i, c in enumerate(new)]
        record = dataclasses.replace(record, children=record.children + tuple(new))
    raise AssertionError("the tuning job never ended")


def test_a_hyperband_run_with_checkpoints_trains_fewer_epochs_and_completes_the_best() -> None:
    record, jobs, views = _simulate(lag=0)
    assert record.trials == 6
    # The best trial (shift 3) was paused at rung 3 and resumed there, to MaxResource.
    best = best_child(views, MIN)
    assert best is not None and best.child.name == "t5-r"
    assert jobs["t5-r"].start == 3 and jobs["t5-r"].status == "Completed"
    # 16 epochs in all, against 54 for six full trials; restarting would cost 3 more.
    assert sum(len(j.points) for j in jobs.values()) == 16


def test_epochs_trained_past_a_rung_before_a_pause_landed_promote_no_one() -> None:
    record, jobs, views = _simulate(lag=2)
    best = best_child(views, MIN)
    assert best is not None and best.child.name.startswith("t5-r")
    assert jobs[best.child.name].start + len(jobs[best.child.name].points) == 9
    # Only the best trial trained to MaxResource: the others' extra epochs (trained while
    # their pause was on its way) did not carry them past the rungs.
    full = {
        record.first_of_trial(c.name).name
        for c in record.children
        if jobs[c.name].start + len(jobs[c.name].points) == 9
    }
    assert full == {"t5"}
    assert sum(len(j.points) for j in jobs.values()) < 6 * 9


def _ended(values: list[float]) -> list[ChildView]:
    return [
        ChildView(
            Child(i, f"c{i}", None, {}, ChildState.CREATED.value, 0.0),
            "Completed",
            ((0.0, v),),
            0,
            i,
        )
        for i, v in enumerate(values)
    ]


def test_convergence_is_no_more_than_one_percent_gain_over_the_last_children() -> None:
    # A window of 3 (MaxNumberOfTrainingJobs 20): at least 6 ended.
    assert not converged(_ended([5, 4, 3, 3, 3]), MIN, 20)
    assert converged(_ended([5, 4, 3, 3.01, 2.99, 3.5]), MIN, 20)
    assert not converged(_ended([5, 4, 3, 3.01, 2.5, 3.5]), MIN, 20)
    assert not converged(_ended([5, 4, 3, 3, 3, 3]), MIN, 40)  # a window of 4


def test_scaling_auto_is_logarithmic_over_two_orders_of_magnitude() -> None:
    assert auto_scaling(1e-4, 1e-1) == "Logarithmic"
    assert auto_scaling(1, 100) == "Logarithmic"
    assert auto_scaling(1, 99) == "Linear"
    assert auto_scaling(0, 1000) == "Linear"


def test_random_search_skips_values_a_warm_start_parent_trained() -> None:
    shift = ParameterRange("shift", "Categorical", values=("0", "1", "2", "3"))
    d = Definition(None, {}, (shift,), MIN, {})
    seen = frozenset(_key(None, {"shift": v}) for v in ("0", "1", "3"))
    plain = RandomSearch((d,), seed=4)
    warm = RandomSearch((d,), seed=4, seen=seen)
    assert [warm.propose(i, [])[1] for i in range(6)] == [{"shift": "2"}] * 6
    # Values no parent trained are drawn as without a warm start.
    same = [i for i in range(20) if plain.propose(i, [])[1] == {"shift": "2"}]
    assert all(warm.propose(i, [])[1] == {"shift": "2"} for i in same)


def test_autotune_ranges_come_from_value_hints() -> None:
    assert range_from_hint("layers", "4", "w") == (
        "Integer",
        {"Name": "layers", "ScalingType": "Auto", "MinValue": "1", "MaxValue": "40"},
    )
    kind, lr = range_from_hint("lr", "0.01", "w")
    assert kind == "Continuous" and (float(lr["MinValue"]), float(lr["MaxValue"])) == (
        pytest.approx(0.001),
        pytest.approx(0.901),
    )
    assert range_from_hint("shuffle", "True", "w")[1]["Values"] == ["True", "False"]
    with pytest.raises(ValidationError, match="give its values in CategoricalParameterRanges"):
        range_from_hint("optimizer", "adam", "w")
    with pytest.raises(ValidationError, match="gives no scale"):
        range_from_hint("bias", "0", "w")


def test_autotune_picks_the_strategy_limits_and_completion() -> None:
    request = {
        "HyperParameterTuningJobConfig": {
            "Strategy": "Random",
            "ResourceLimits": {"MaxParallelTrainingJobs": 2},
            "ParameterRanges": {"AutoParameters": [{"Name": "lr", "ValueHint": "0.1"}]},
        },
        "TrainingJobDefinition": {"StaticHyperParameters": {}},
        "Autotune": {"Mode": "Enabled"},
    }
    config = autotuned(request)["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Bayesian" and config["TrainingJobEarlyStoppingType"] == "Auto"
    assert config["ResourceLimits"] == {"MaxParallelTrainingJobs": 2, "MaxNumberOfTrainingJobs": 10}
    assert config["TuningJobCompletionCriteria"]["ConvergenceDetected"] == {
        "CompleteOnConvergence": "Enabled"
    }
    assert [r["Name"] for r in config["ParameterRanges"]["ContinuousParameterRanges"]] == ["lr"]
    request["TrainingJobDefinition"]["StaticHyperParameters"] = {"epochs": "9"}
    assert autotuned(request)["HyperParameterTuningJobConfig"]["Strategy"] == "Hyperband"
    del request["Autotune"]
    assert autotuned(request) is request
