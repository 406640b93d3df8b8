"""Search strategies: the hyperparameter values each child of a tuning job trains with.

A strategy maps a child's index (and, for Bayesian, what earlier children scored) to a
definition and its tuned values, as the strings a child's HyperParameters hold. Every
proposal is a pure function of the tuning job's seed, the child's index and the history it
is given, so a driver that restarts proposes the same values again:

- :class:`RandomSearch`: each value drawn on the range's scale from a generator seeded by
  (seed, index), drawn again (up to :data:`REDRAWS` times) where a warm start's parents
  already trained those values; also what Hyperband draws its trials from.
- :class:`GridSearch`: the Cartesian product of the categorical ranges, in the order given.
- :class:`BayesianSearch`: Optuna's TPE sampler, fed the finished children (and a warm
  start's parents) as completed trials.

Strategies are chosen by name from :data:`STRATEGIES`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainport.tuning.spec import Definition, ParameterRange, TuningSpec

__all__ = [
    "BayesianSearch",
    "GridSearch",
    "RandomSearch",
    "Strategy",
    "Trial",
    "decode",
    "encode",
    "make_strategy",
]


@dataclass(frozen=True)
class Trial:
    """A child as a strategy learns from it: its definition, values and final objective."""

    definition: str | None
    tuned: dict[str, str]
    value: float | None


class Strategy(Protocol):
    def propose(self, index: int, history: Sequence[Trial]) -> tuple[int, dict[str, str]]:
        """The definition (its position) and tuned values of child ``index``."""
        ...


def encode(rng: ParameterRange, value: Any) -> str:
    """A value as a child's HyperParameters carry it: integers as integers, categorical
    values exactly as the request gave them (the SageMaker SDK has already JSON-quoted
    them for a framework estimator)."""
    if rng.kind == "Integer":
        return str(int(value))
    if rng.kind == "Continuous":
        return repr(float(value))
    return str(value)


def decode(rng: ParameterRange, text: str) -> Any:
    """The inverse of :func:`encode`; None for a value outside the range (a warm start's
    parent tuned over another range)."""
    if rng.kind == "Categorical":
        return text if text in rng.values else None
    try:
        value: float = int(text) if rng.kind == "Integer" else float(text)
    except ValueError:
        return None
    return value if rng.low <= value <= rng.high else None


def _draw(rng: ParameterRange, gen: random.Random) -> Any:
    if rng.kind == "Categorical":
        return gen.choice(rng.values)
    low, high = rng.low, rng.high
    if rng.kind == "Integer":
        if rng.scaling == "Logarithmic":
            # Uniform in log space over [low, high + 1), floored: each integer gets the
            # share of log space its unit interval spans.
            x = math.exp(gen.uniform(math.log(low), math.log(high + 1)))
            return min(int(high), int(x))
        return gen.randint(int(low), int(high))
    if rng.scaling == "Logarithmic":
        return math.exp(gen.uniform(math.log(low), math.log(high)))
    if rng.scaling == "ReverseLogarithmic":
        # 1 - x log-uniform: values close to 1 are searched finely.
        return 1 - math.exp(gen.uniform(math.log(1 - high), math.log(1 - low)))
    return gen.uniform(low, high)


# Draws Random search makes for one child before it takes values a parent already trained:
# a small space may hold nothing new.
REDRAWS = 50


def _key(definition: str | None, tuned: dict[str, str]) -> tuple[object, ...]:
    return (definition, tuple(sorted(tuned.items())))


@dataclass(frozen=True)
class RandomSearch:
    definitions: tuple[Definition, ...]
    seed: int
    # Values a warm start's parents trained already, as (definition, sorted values).
    seen: frozenset[tuple[object, ...]] = frozenset()

    def propose(self, index: int, history: Sequence[Trial]) -> tuple[int, dict[str, str]]:
        which = index % len(self.definitions)
        d = self.definitions[which]
        tuned: dict[str, str] = {}
        for attempt in range(REDRAWS):
            # The first draw is seeded as without a warm start: the same seed, the same values.
            gen = random.Random(f"{self.seed}:{index}" + (f":{attempt}" if attempt else ""))
            tuned = {r.name: encode(r, _draw(r, gen)) for r in d.ranges}
            if _key(d.name, tuned) not in self.seen:
                break
        return which, tuned


@dataclass(frozen=True)
class GridSearch:
    definitions: tuple[Definition, ...]

    def points(self) -> list[tuple[int, dict[str, str]]]:
        out: list[tuple[int, dict[str, str]]] = []
        for which, d in enumerate(self.definitions):
            names = [r.name for r in d.ranges]
            for combo in itertools.product(*(r.values for r in d.ranges)):
                out.append((which, dict(zip(names, combo, strict=True))))
        return out

    def propose(self, index: int, history: Sequence[Trial]) -> tuple[int, dict[str, str]]:
        return self.points()[index]


@dataclass(frozen=True)
class BayesianSearch:
    """Optuna's TPE over the finished trials. Each proposal builds a fresh study from the
    history and seeds the sampler with (seed, index): children proposed together (with the
    same history) still differ, and a restarted driver proposes the same values."""

    definitions: tuple[Definition, ...]
    seed: int
    minimize: bool
    startup: int = 10

    def propose(self, index: int, history: Sequence[Trial]) -> tuple[int, dict[str, str]]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        which = index % len(self.definitions)
        d = self.definitions[which]
        spaces = {r.name: _distribution(r) for r in d.ranges}
        sampler = optuna.samplers.TPESampler(
            seed=random.Random(f"{self.seed}:{index}").getrandbits(31),
            n_startup_trials=self.startup,
        )
        study = optuna.create_study(
            direction="minimize" if self.minimize else "maximize", sampler=sampler
        )
        for trial in history:
            params = _optuna_params(d, trial)
            if params is not None and trial.value is not None:
                study.add_trial(
                    optuna.trial.create_trial(
                        params=params, distributions=spaces, value=trial.value
                    )
                )
        asked = study.ask(spaces)
        return which, {r.name: encode(r, _from_optuna(r, asked.params[r.name])) for r in d.ranges}


def _distribution(rng: ParameterRange) -> Any:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    log = rng.scaling == "Logarithmic"
    if rng.kind == "Categorical":
        return CategoricalDistribution(rng.values)
    if rng.kind == "Integer":
        return IntDistribution(int(rng.low), int(rng.high), log=log)
    if rng.scaling == "ReverseLogarithmic":
        return FloatDistribution(math.log(1 - rng.high), math.log(1 - rng.low))
    return FloatDistribution(rng.low, rng.high, log=log)


def _to_optuna(rng: ParameterRange, value: Any) -> Any:
    if rng.scaling == "ReverseLogarithmic" and rng.kind == "Continuous":
        return math.log(1 - value)
    return value


def _from_optuna(rng: ParameterRange, value: Any) -> Any:
    if rng.scaling == "ReverseLogarithmic" and rng.kind == "Continuous":
        return 1 - math.exp(value)
    return value


def _optuna_params(d: Definition, trial: Trial) -> dict[str, Any] | None:
    """A trial's values in the study's space; None when one is missing or out of range."""
    if trial.definition != d.name:
        return None
    params: dict[str, Any] = {}
    for r in d.ranges:
        value = decode(r, trial.tuned.get(r.name, ""))
        if value is None:
            return None
        params[r.name] = _to_optuna(r, value)
    return params


def make_strategy(spec: TuningSpec, seed: int, parents: Sequence[Trial] = ()) -> Strategy:
    """The strategy ``spec`` names; Hyperband draws its trials at random. ``parents``: a
    warm start's parents' children, which Random search does not train again."""
    if spec.strategy == "Grid":
        return GridSearch(spec.definitions)
    if spec.strategy == "Bayesian":
        startup = min(10, max(2, spec.max_jobs // 5))
        return BayesianSearch(spec.definitions, seed, spec.objective.minimize, startup)
    return RandomSearch(
        spec.definitions, seed, frozenset(_key(t.definition, t.tuned) for t in parents)
    )
