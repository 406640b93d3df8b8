"""Search spaces: where configurations come from.

A configuration is a plain ``dict`` of hyperparameter values. Two space kinds:

- :class:`GridSpace`: the Cartesian product of value lists, in a stable order;
- :class:`RandomSpace`: each parameter drawn from a :class:`Distribution`
  (:class:`Uniform`, :class:`LogUniform`, :class:`Quantized`, :class:`Choice`) or fixed.

Sampling is a pure function of the seed (``random.Random(seed)``), so the same seed always
gives the same configurations, on every backend.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trainport.errors import ValidationError

__all__ = [
    "Choice",
    "Config",
    "Distribution",
    "GridSpace",
    "LogUniform",
    "Quantized",
    "RandomSpace",
    "SearchSpace",
    "Uniform",
    "parse_distribution",
]

Config = dict[str, Any]


@runtime_checkable
class Distribution(Protocol):
    def sample(self, rng: random.Random) -> Any: ...


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValidationError(f"uniform: low={self.low} must be below high={self.high}")

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)


@dataclass(frozen=True)
class LogUniform:
    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high:
            raise ValidationError(
                f"loguniform: need 0 < low < high, got low={self.low}, high={self.high}"
            )

    def sample(self, rng: random.Random) -> float:
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))


@dataclass(frozen=True)
class Quantized:
    """A draw from ``base`` rounded to a multiple of ``q`` (an int when ``q`` is one)."""

    base: Uniform | LogUniform
    q: float

    def __post_init__(self) -> None:
        if self.q <= 0:
            raise ValidationError(f"quantized: q={self.q} must be positive")

    def sample(self, rng: random.Random) -> float | int:
        value = round(self.base.sample(rng) / self.q) * self.q
        # Rounding may step just outside the range; clamp to the nearest multiple inside it.
        low = math.ceil(self.base.low / self.q) * self.q
        high = math.floor(self.base.high / self.q) * self.q
        value = min(max(value, low), high)
        return round(value) if float(self.q).is_integer() else value


@dataclass(frozen=True)
class Choice:
    options: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise ValidationError("choice: give at least one option")

    def sample(self, rng: random.Random) -> Any:
        return self.options[rng.randrange(len(self.options))]


class SearchSpace(Protocol):
    def configs(self, n: int | None, seed: int) -> list[Config]:
        """The configurations to try: all of a grid, or ``n`` random draws."""
        ...


@dataclass(frozen=True)
class GridSpace:
    params: Mapping[str, Sequence[Any]]

    def __post_init__(self) -> None:
        for name, values in self.params.items():
            if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
                raise ValidationError(
                    f"grid parameter {name!r}: give a non-empty list of values, got {values!r}"
                )

    def configs(self, n: int | None = None, seed: int = 0) -> list[Config]:
        names = sorted(self.params)
        grid = [
            dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(self.params[k] for k in names))
        ]
        return grid if n is None else grid[:n]


@dataclass(frozen=True)
class RandomSpace:
    params: Mapping[str, Any]  # Distribution or a fixed value

    def configs(self, n: int | None = None, seed: int = 0) -> list[Config]:
        if n is None or n < 1:
            raise ValidationError(f"random search: samples={n!r} must be a positive integer")
        rng = random.Random(seed)
        names = sorted(self.params)
        out: list[Config] = []
        for _ in range(n):
            cfg: Config = {}
            for name in names:
                spec = self.params[name]
                cfg[name] = spec.sample(rng) if isinstance(spec, Distribution) else spec
            out.append(cfg)
        return out


def parse_distribution(name: str, raw: Any) -> Any:
    """Turn a spec entry (``{"loguniform": [1e-4, 1e-1], "q": ...}``) into a distribution.

    Anything that is not a one-key mapping naming a distribution is a fixed value.
    """
    if not isinstance(raw, Mapping):
        return raw
    raw = dict(raw)
    q = raw.pop("q", None)
    if len(raw) != 1:
        raise ValidationError(
            f"search parameter {name!r}: write one of uniform, loguniform, choice "
            f"(optionally with q), got keys {sorted(raw)}"
        )
    kind, args = next(iter(raw.items()))
    try:
        if kind == "choice":
            dist: Any = Choice(tuple(args))
        elif kind in ("uniform", "loguniform"):
            low, high = (float(a) for a in args)
            dist = Uniform(low, high) if kind == "uniform" else LogUniform(low, high)
        else:
            raise ValidationError(
                f"search parameter {name!r}: unknown distribution {kind!r}; "
                "use uniform, loguniform or choice"
            )
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"search parameter {name!r}: {kind} needs [low, high], got {args!r}"
        ) from exc
    if q is not None:
        if isinstance(dist, Choice):
            raise ValidationError(f"search parameter {name!r}: q applies to uniform/loguniform")
        dist = Quantized(dist, float(q))
    return dist
