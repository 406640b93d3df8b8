from __future__ import annotations

import math

import pytest

from trainport.errors import ValidationError
from trainport.select.space import (
    Choice,
    GridSpace,
    LogUniform,
    Quantized,
    RandomSpace,
    Uniform,
    parse_distribution,
)


def test_grid_is_the_full_product_in_stable_order() -> None:
    grid = GridSpace({"lr": [0.1, 0.01], "hidden": [8, 16, 32]})
    configs = grid.configs()
    assert len(configs) == 6
    assert configs == grid.configs()
    assert {(c["lr"], c["hidden"]) for c in configs} == {
        (lr, h) for lr in (0.1, 0.01) for h in (8, 16, 32)
    }


def test_grid_rejects_empty_and_scalar_values() -> None:
    with pytest.raises(ValidationError, match="'lr'"):
        GridSpace({"lr": []})
    with pytest.raises(ValidationError, match="'lr'"):
        GridSpace({"lr": 0.1})  # type: ignore[dict-item]


def test_random_space_draws_inside_the_ranges_and_repeats_with_the_seed() -> None:
    space = RandomSpace(
        {
            "lr": LogUniform(1e-4, 1e-1),
            "dropout": Uniform(0.0, 0.5),
            "hidden": Quantized(Uniform(8, 64), 8),
            "act": Choice(("relu", "tanh")),
            "layers": 2,
        }
    )
    configs = space.configs(200, seed=3)
    assert configs == space.configs(200, seed=3)
    assert configs != space.configs(200, seed=4)
    for c in configs:
        assert 1e-4 <= c["lr"] <= 1e-1
        assert 0.0 <= c["dropout"] <= 0.5
        assert isinstance(c["hidden"], int) and c["hidden"] % 8 == 0 and 8 <= c["hidden"] <= 64
        assert c["act"] in ("relu", "tanh")
        assert c["layers"] == 2
    # Log-uniform: about half the draws below the geometric midpoint.
    below = sum(c["lr"] < math.sqrt(1e-4 * 1e-1) for c in configs)
    assert 60 < below < 140
    assert {c["act"] for c in configs} == {"relu", "tanh"}


def test_quantized_float_step() -> None:
    q = Quantized(LogUniform(0.001, 0.1), 0.005)
    import random

    rng = random.Random(0)
    for _ in range(100):
        v = q.sample(rng)
        assert abs(v / 0.005 - round(v / 0.005)) < 1e-9
        assert 0.005 <= v <= 0.1


def test_distributions_validate_their_bounds() -> None:
    with pytest.raises(ValidationError, match="low"):
        Uniform(1.0, 1.0)
    with pytest.raises(ValidationError, match="loguniform"):
        LogUniform(0.0, 1.0)
    with pytest.raises(ValidationError, match="choice"):
        Choice(())
    with pytest.raises(ValidationError, match="samples"):
        RandomSpace({"a": Uniform(0, 1)}).configs(None)


def test_parse_distribution_from_spec_entries() -> None:
    assert parse_distribution("lr", 0.1) == 0.1
    assert parse_distribution("lr", {"loguniform": [1e-4, 1e-1]}) == LogUniform(1e-4, 1e-1)
    assert parse_distribution("h", {"uniform": [8, 64], "q": 8}) == Quantized(Uniform(8, 64), 8)
    assert parse_distribution("a", {"choice": ["x", "y"]}) == Choice(("x", "y"))
    with pytest.raises(ValidationError, match=r"'lr'.*normal"):
        parse_distribution("lr", {"normal": [0, 1]})
    with pytest.raises(ValidationError, match="'lr'"):
        parse_distribution("lr", {"uniform": [1]})
