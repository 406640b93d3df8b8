"""The MOP scheduler's rules, checked on the pure functions over many seeds and shapes."""

from __future__ import annotations

import itertools

import pytest

from trainport.errors import ValidationError
from trainport.select.scheduler import Placement, Unit, assign, lower_bound, plan_epoch

SHAPES = [(m, p, r) for m in (1, 2, 3, 5, 8) for p in (1, 2, 3, 4) for r in (1, 2)]


@pytest.mark.parametrize(("models", "partitions", "replicas"), SHAPES)
def test_plan_keeps_completeness_isolation_and_exclusivity(
    models: int, partitions: int, replicas: int
) -> None:
    names = [f"m{i}" for i in range(models)]
    placement = Placement(partitions, replicas)
    cost = {m: 1.0 + (i % 3) * 0.5 for i, m in enumerate(names)}
    for seed in range(5):
        plan = plan_epoch(names, placement, f"s{seed}", lambda m, _p: cost[m])
        # Completeness: exactly one unit per (model, partition).
        pairs = [(u.unit.model, u.unit.partition) for u in plan.units]
        assert sorted(pairs) == sorted(itertools.product(names, range(partitions)))
        for m in names:
            assert sorted(plan.visit_order[m]) == list(range(partitions))
        # Exclusivity: only where the partition is, one unit per worker at a time;
        # isolation: one unit per model at a time.
        for u in plan.units:
            assert placement.partition_of(u.unit.worker) == u.unit.partition
        for key in ("worker", "model"):
            spans: dict[object, list[tuple[float, float]]] = {}
            for u in plan.units:
                spans.setdefault(getattr(u.unit, key), []).append((u.start, u.end))
            for items in spans.values():
                items.sort()
                for (_, end), (start, _) in itertools.pairwise(items):
                    assert start >= end


def test_plan_is_a_function_of_the_seed() -> None:
    names = ["a", "b", "c", "d", "e"]
    placement = Placement(3)
    assert plan_epoch(names, placement, "x") == plan_epoch(names, placement, "x")
    orders = {tuple(plan_epoch(names, placement, f"s{i}").visit_order.items()) for i in range(20)}
    assert len(orders) > 1  # randomized, as Algorithm 1 is


@pytest.mark.parametrize(("models", "partitions"), [(2, 2), (3, 2), (4, 2), (6, 2), (5, 3), (8, 4)])
def test_uniform_units_meet_the_lower_bound(models: int, partitions: int) -> None:
    names = [f"m{i}" for i in range(models)]
    placement = Placement(partitions)
    plan = plan_epoch(names, placement, "lb")
    work = {(u.unit.model, u.unit.partition): u.end - u.start for u in plan.units}
    bound = lower_bound(work, placement)
    assert bound == max(models, partitions)
    # With equal units MOP's randomized schedule stays close to the bound.
    assert plan.makespan <= 1.34 * bound


def test_assign_gives_each_idle_worker_an_eligible_idle_model() -> None:
    placement = Placement(2)
    remaining = {"a": [0, 1], "b": [1], "c": [0]}
    units = assign(remaining, {"c"}, [0, 1], placement, "k")
    assert len(units) == 2
    assert len({u.model for u in units}) == 2
    assert all(u.model != "c" for u in units)
    for u in units:
        assert u.partition in remaining[u.model]
        assert u.partition == placement.partition_of(u.worker)


def test_assign_ordered_only_takes_the_next_planned_partition() -> None:
    placement = Placement(2)
    units = assign({"a": [1, 0]}, set(), [0], placement, "k", ordered=True)
    assert units == []
    assert assign({"a": [1, 0]}, set(), [0, 1], placement, "k", ordered=True) == [Unit("a", 1, 1)]


def test_replicas_share_a_partition_and_lower_the_worker_bound() -> None:
    placement = Placement(2, replicas=2)
    assert placement.workers == 4
    assert placement.holders(1) == [1, 3]
    work = {("a", 0): 1.0, ("b", 0): 1.0, ("a", 1): 1.0, ("b", 1): 1.0}
    assert lower_bound(work, placement) == 2.0  # each model's two units in sequence


def test_placement_validates() -> None:
    with pytest.raises(ValidationError, match="partitions"):
        Placement(0)
    with pytest.raises(ValidationError, match="replicas"):
        Placement(2, 0)
