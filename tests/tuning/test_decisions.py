"""The pure parts of tuning: strategies' proposals, early stopping, and the step plan."""

from __future__ import annotations

import dataclasses
import math

import pytest

from trainport.tuning.plan import PLANNED, ChildView, decide
from trainport.tuning.records import Child, ChildState, TuningRecord
from trainport.tuning.spec import Definition, Objective, ParameterRange, TuningSpec
from trainport.tuning.stopping import Progress, hyperband_stops, median_stops, rungs
from trainport.tuning.strategies import (
    BayesianSearch,
    GridSearch,
    RandomSearch,
    Trial,
    decode,
    encode,
)

MIN = Objective("loss", minimize=True)


def _definition(*ranges: ParameterRange) -> Definition:
    return Definition(None, {}, ranges, MIN, {})


LR = ParameterRange("lr", "Continuous", 1e-4, 1e-1, "Logarithmic")
MOMENTUM = ParameterRange("momentum", "Continuous", 0.9, 0.999, "ReverseLogarithmic")
LAYERS = ParameterRange("layers", "Integer", 1, 8)
OPT = ParameterRange("opt", "Categorical", values=('"adam"', '"sgd"'))


def test_random_search_is_reproducible_and_within_ranges() -> None:
    search = RandomSearch((_definition(LR, MOMENTUM, LAYERS, OPT),), seed=42)
    first = [search.propose(i, []) for i in range(20)]
    assert first == [search.propose(i, []) for i in range(20)]
    assert first != [RandomSearch(search.definitions, seed=43).propose(i, []) for i in range(20)]
    for _, tuned in first:
        assert 1e-4 <= float(tuned["lr"]) <= 1e-1
        assert 0.9 <= float(tuned["momentum"]) <= 0.999
        assert tuned["layers"] in {str(n) for n in range(1, 9)}
        assert tuned["opt"] in OPT.values  # categorical values exactly as given
    # Logarithmic: about as many draws below the geometric middle as above it.
    draws = [float(RandomSearch(search.definitions, 1).propose(i, [])[1]["lr"]) for i in range(400)]
    below = sum(d < math.sqrt(1e-4 * 1e-1) for d in draws)
    assert 140 < below < 260


def test_grid_search_walks_the_product_in_order() -> None:
    kind = ParameterRange("kind", "Categorical", values=("a", "b"))
    size = ParameterRange("size", "Categorical", values=("1", "2", "3"))
    points = GridSearch((_definition(kind, size),)).points()
    assert [p[1] for p in points] == [
        {"kind": k, "size": s} for k in ("a", "b") for s in ("1", "2", "3")
    ]


def test_bayesian_search_learns_from_history() -> None:
    x = ParameterRange("x", "Continuous", 0, 10)
    search = BayesianSearch((_definition(x),), seed=0, minimize=True, startup=3)
    history = [
        Trial(None, {"x": encode(x, v)}, (v - 7) ** 2) for v in (0.5, 1, 2, 3, 5, 6.5, 7.5, 9)
    ]
    proposals = [float(search.propose(i, history)[1]["x"]) for i in range(8, 20)]
    # TPE concentrates where the good trials were (around 7).
    near = sum(abs(p - 7) < 2 for p in proposals)
    assert near >= len(proposals) // 2, proposals
    assert proposals == [float(search.propose(i, history)[1]["x"]) for i in range(8, 20)]


def test_decode_refuses_values_outside_the_range() -> None:
    assert decode(LAYERS, "3") == 3
    assert decode(LAYERS, "9") is None
    assert decode(OPT, '"adam"') == '"adam"' and decode(OPT, "adam") is None


def _progress(
    name: str, index: int, values: list[float], start: float, running: bool = True
) -> Progress:
    return Progress(name, index, tuple((start + i, v) for i, v in enumerate(values)), running)


def test_rungs() -> None:
    assert rungs(1, 9) == [1, 3]
    assert rungs(1, 27) == [1, 3, 9]
    assert rungs(2, 2) == []


def test_hyperband_stops_a_child_worse_than_those_before_it_at_a_rung() -> None:
    strong = _progress("strong", 0, [1.0, 0.5, 0.3, 0.2], start=0)
    weak = _progress("weak", 1, [5.0], start=0.5)
    assert hyperband_stops([strong, weak], 1, 9, MIN) == ["weak"]
    # The first at a rung always goes on, and so does a child better than the earlier ones.
    assert hyperband_stops([strong], 1, 9, MIN) == []
    better = _progress("better", 2, [0.5, 0.4], start=1)
    assert hyperband_stops([strong, better], 1, 9, MIN) == []
    # Judged against the children that reached the rung before it, not after.
    late_strong = _progress("late", 3, [0.1], start=10)
    assert "weak" in hyperband_stops([strong, weak, late_strong], 1, 9, MIN)
    early_weak = _progress("early-weak", 4, [5.0], start=-5)
    assert hyperband_stops([early_weak, _progress("s", 5, [1.0], start=0)], 1, 9, MIN) == []


def test_hyperband_stops_at_max_resource_only_when_asked() -> None:
    done = _progress("full", 0, [1.0] * 9, start=0)
    assert hyperband_stops([done], 1, 9, MIN) == []
    assert hyperband_stops([done], 1, 9, MIN, stop_at_max=True) == ["full"]


def test_median_rule_needs_peers_and_stops_the_worse_than_median() -> None:
    peers = [_progress(f"p{i}", i, [1.0, 0.8, 0.6], start=i, running=False) for i in range(3)]
    bad = _progress("bad", 3, [2.0, 1.9], start=10)
    good = _progress("good", 4, [0.5, 0.4], start=10)
    assert median_stops([*peers, bad, good], MIN) == ["bad"]
    assert median_stops([*peers[:2], bad], MIN) == []


def _spec(**changes: object) -> TuningSpec:
    spec = TuningSpec("t", "Random", (_definition(LAYERS),), max_jobs=5, max_parallel=2)
    return dataclasses.replace(spec, **changes)


def _view(
    index: int, status: str, values: tuple[float, ...] = (), end: float | None = None
) -> ChildView:
    child = Child(index, f"t-{index}", None, {"layers": "1"}, ChildState.CREATED.value, 0.0)
    points = tuple((float(i), v) for i, v in enumerate(values))
    return ChildView(child, status, points, 0.0, end)


def _record(n: int, status: str = "InProgress") -> TuningRecord:
    children = tuple(
        Child(i, f"t-{i}", None, {"layers": "1"}, ChildState.CREATED.value, 0.0) for i in range(n)
    )
    return TuningRecord("t", "arn", {}, 0.0, seed=1, status=status, children=children)


def test_the_plan_keeps_max_parallel_children_running() -> None:
    assert decide(_spec(), _record(0), [], 1.0).launch == 2
    running = [_view(0, "InProgress"), _view(1, PLANNED)]
    assert decide(_spec(), _record(2), running, 1.0).launch == 0
    one_done = [_view(0, "Completed", (1.0,), end=1), _view(1, "InProgress")]
    assert decide(_spec(), _record(2), one_done, 1.0).launch == 1
    # The budget: five children in all.
    four_done = [_view(i, "Completed", (1.0,), end=i) for i in range(4)] + [_view(4, "InProgress")]
    assert decide(_spec(), _record(5), four_done, 1.0).launch == 0
    all_done = [_view(i, "Completed", (1.0,), end=i) for i in range(5)]
    assert decide(_spec(), _record(5), all_done, 1.0).finish == ("Completed", None)


def test_the_plan_stops_children_of_a_stopping_tuning_job() -> None:
    views = [_view(0, "InProgress"), _view(1, "Stopping"), _view(2, "Completed", (1.0,), end=1)]
    plan = decide(_spec(), _record(3, "Stopping"), views, 1.0)
    assert plan.stop == (("t-0", "tuning"),) and plan.finish is None and plan.launch == 0
    ended = [_view(0, "Stopped"), _view(1, "Stopped"), _view(2, "Completed", (1.0,), end=1)]
    assert decide(_spec(), _record(3, "Stopping"), ended, 1.0).finish == ("Stopped", None)


@pytest.mark.parametrize(
    ("changes", "ending"),
    [
        ({"target": 0.5}, "target"),
        ({"not_improving": 2}, "not-improving"),
        ({"max_runtime": 1}, "runtime"),
    ],
)
def test_completion_criteria(changes: dict[str, object], ending: str) -> None:
    views = [
        _view(0, "Completed", (0.4,), end=1),
        _view(1, "Completed", (0.9,), end=2),
        _view(2, "Completed", (0.8,), end=3),
        _view(3, "InProgress"),
    ]
    plan = decide(_spec(**changes), _record(4), views, 5.0)
    assert plan.ending == ending and plan.stop == (("t-3", "tuning"),) and plan.launch == 0


def test_a_tuning_job_whose_children_all_fail_fails() -> None:
    views = [dataclasses.replace(_view(i, "Failed"), failure_reason="boom") for i in range(3)]
    plan = decide(_spec(), _record(3), views, 1.0)
    assert plan.ending == "failures"
    assert plan.finish is not None and plan.finish[0] == "Failed" and "boom" in str(plan.finish[1])
