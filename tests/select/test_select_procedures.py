from __future__ import annotations

import math

import pytest

from trainport.errors import ValidationError
from trainport.select.partition import DataFile, split_partitions
from trainport.select.procedures import (
    HyperBand,
    ModelView,
    SuccessiveHalving,
    model_id,
)
from trainport.select.result import EpochRecord, pick_best
from trainport.select.space import GridSpace, RandomSpace, Uniform
from trainport.select.trainer import UnitMetrics, step_weighted


def views(scores: dict[str, float]) -> dict[str, ModelView]:
    return {m: ModelView({}, (s,), True) for m, s in scores.items()}


def test_successive_halving_keeps_the_best_third_at_each_rung() -> None:
    sh = SuccessiveHalving(GridSpace({"x": list(range(9))}), eta=3, min_epochs=1)
    configs = sh.initial()
    assert len(configs) == 9
    scores = {model_id(i): float(i) for i in range(9)}
    decision = sh.after_epoch(1, views(scores), minimize=True)
    assert decision.stop == {model_id(i) for i in range(3, 9)}
    # Not a rung: nothing stops.
    models = {m: ModelView({}, (s,), m not in decision.stop) for m, s in scores.items()}
    assert sh.after_epoch(2, models, minimize=True).stop == frozenset()
    # Epoch 3 is the next rung; maximizing keeps the highest.
    assert sh.after_epoch(3, models, minimize=False).stop == {model_id(0), model_id(1)}


def test_halving_ranks_diverged_models_last() -> None:
    sh = SuccessiveHalving(GridSpace({"x": [1, 2, 3]}), eta=3)
    sh.initial()
    decision = sh.after_epoch(1, views({"c000": math.nan, "c001": 5.0, "c002": 4.0}), True)
    assert decision.stop == {"c000", "c001"}


def test_hyperband_brackets() -> None:
    hb = HyperBand(RandomSpace({"lr": Uniform(0, 1)}), max_epochs=9, eta=3)
    assert hb.brackets() == [(9, 1), (5, 3), (3, 9)]
    configs = hb.initial()
    assert len(configs) == 17
    scores = {model_id(i): float(i) for i in range(17)}
    stop = hb.after_epoch(1, views(scores), minimize=True).stop
    # Only the most aggressive bracket (the first 9 models) has a rung at epoch 1.
    assert stop == {model_id(i) for i in range(3, 9)}
    with pytest.raises(ValidationError, match="eta"):
        HyperBand(RandomSpace({}), max_epochs=9, eta=1)


def test_epoch_metrics_are_step_weighted() -> None:
    units = [UnitMetrics(3, 96, {"loss": 1.0}), UnitMetrics(1, 20, {"loss": 5.0})]
    assert step_weighted(units) == {"loss": 2.0}  # not (1 + 5) / 2


def test_best_respects_the_direction_and_uses_the_last_epoch() -> None:
    records = [
        EpochRecord("a", 1, 1, 1, {}, {"acc": 0.9}),
        EpochRecord("a", 2, 2, 1, {}, {"acc": 0.5}),
        EpochRecord("b", 1, 1, 1, {}, {"acc": 0.7}),
        EpochRecord("c", 1, 1, 1, {}, {"acc": math.nan}),
    ]
    assert pick_best(records, "val_acc", minimize=False) == ("b", 0.7)
    assert pick_best(records, "val_acc", minimize=True) == ("a", 0.5)


def test_partitions_are_balanced_and_seeded() -> None:
    files = [DataFile(f"f{i}", size) for i, size in enumerate([10, 9, 8, 7, 6, 5, 4, 3])]
    parts = split_partitions(files, 2, seed=1)
    assert sorted(f.uri for p in parts for f in p) == sorted(f.uri for f in files)
    loads = [sum(f.size for f in p) for p in parts]
    assert abs(loads[0] - loads[1]) <= 2
    assert split_partitions(files, 2, seed=1) == parts
    with pytest.raises(ValidationError, match="partitions=9"):
        split_partitions(files, 9, seed=1)
