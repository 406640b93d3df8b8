"""Model-selection procedures: which configurations to train, and which to stop or add.

A procedure proposes the first configurations and, after every epoch, looks at each
model's validation scores and returns a :class:`Decision` (stop some, add new ones). The
driver calls it between epochs, so a procedure is a pure policy with no I/O.

Models are named by creation order (:func:`model_id`): the initial configurations are
``c000, c001, ...`` and added ones continue the count, which lets a procedure know the
names of what it adds without a round trip.

- :class:`FixedSearch`: grid or random search; every configuration trains every epoch.
- :class:`SuccessiveHalving`: at rungs ``min_epochs * eta**k`` keep the best ``1/eta``.
- :class:`HyperBand`: several successive-halving brackets that trade the number of
  configurations against their minimum budget, run side by side in one MOP workload.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainport.errors import ValidationError
from trainport.select.space import Config, RandomSpace, SearchSpace

__all__ = [
    "Decision",
    "FixedSearch",
    "HyperBand",
    "ModelView",
    "Procedure",
    "SuccessiveHalving",
    "model_id",
]


def model_id(index: int) -> str:
    return f"c{index:03d}"


@dataclass(frozen=True)
class ModelView:
    """What a procedure sees of one model after an epoch."""

    config: Config
    scores: tuple[float, ...]  # the selection metric after each of its epochs
    active: bool


@dataclass(frozen=True)
class Decision:
    stop: frozenset[str] = frozenset()
    add: tuple[Config, ...] = ()


class Procedure:
    """Base class: train the initial configurations for every epoch, stop nothing."""

    def initial(self) -> list[Config]:
        raise NotImplementedError

    def after_epoch(self, epoch: int, models: Mapping[str, ModelView], minimize: bool) -> Decision:
        return Decision()


@dataclass
class FixedSearch(Procedure):
    """Grid search (``samples=None``) or random search over a space."""

    space: SearchSpace
    samples: int | None = None
    seed: int = 0

    def initial(self) -> list[Config]:
        return self.space.configs(self.samples, self.seed)


def _rank(ids: Sequence[str], models: Mapping[str, ModelView], minimize: bool) -> list[str]:
    # A model without a finite score (diverged) ranks last; ties break by name for determinism.
    def key(mid: str) -> tuple[float, str]:
        score = models[mid].scores[-1] if models[mid].scores else math.nan
        if not math.isfinite(score):
            return (math.inf, mid)
        return (score if minimize else -score, mid)

    return sorted(ids, key=key)


@dataclass
class _Bracket:
    members: list[str]
    eta: int
    min_epochs: int

    def rung(self, epoch: int) -> bool:
        # Rungs at min_epochs * eta**k.
        k = epoch / self.min_epochs
        if k < 1 or epoch % self.min_epochs:
            return False
        k_int = int(k)
        while k_int % self.eta == 0:
            k_int //= self.eta
        return k_int == 1

    def cut(self, epoch: int, models: Mapping[str, ModelView], minimize: bool) -> set[str]:
        alive = [m for m in self.members if models[m].active]
        if not self.rung(epoch) or len(alive) <= 1:
            return set()
        keep = max(1, len(alive) // self.eta)
        return set(_rank(alive, models, minimize)[keep:])


@dataclass
class SuccessiveHalving(Procedure):
    """Successive halving over configurations from a space."""

    space: SearchSpace
    samples: int | None = None
    eta: int = 3
    min_epochs: int = 1
    seed: int = 0
    _bracket: _Bracket | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.eta < 2:
            raise ValidationError(f"eta={self.eta}: successive halving needs eta >= 2")
        if self.min_epochs < 1:
            raise ValidationError(f"min_epochs={self.min_epochs}: must be at least 1")

    def initial(self) -> list[Config]:
        configs = self.space.configs(self.samples, self.seed)
        self._bracket = _Bracket(
            [model_id(i) for i in range(len(configs))], self.eta, self.min_epochs
        )
        return configs

    def after_epoch(self, epoch: int, models: Mapping[str, ModelView], minimize: bool) -> Decision:
        if self._bracket is None:
            return Decision()
        return Decision(stop=frozenset(self._bracket.cut(epoch, models, minimize)))


@dataclass
class HyperBand(Procedure):
    """HyperBand (Li et al.) with all brackets trained concurrently under one MOP schedule.

    ``max_epochs`` is R; bracket ``s`` in ``s_max..0`` starts ``ceil((s_max+1)/(s+1) *
    eta**s)`` configurations with a first rung at ``R / eta**s`` epochs.
    """

    space: RandomSpace
    max_epochs: int
    eta: int = 3
    seed: int = 0
    _brackets: list[_Bracket] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.eta < 2:
            raise ValidationError(f"eta={self.eta}: HyperBand needs eta >= 2")
        if self.max_epochs < 1:
            raise ValidationError(f"epochs={self.max_epochs}: HyperBand needs at least 1")

    def brackets(self) -> list[tuple[int, int]]:
        """(configurations, first rung) per bracket, most aggressive first."""
        s_max = math.floor(math.log(self.max_epochs, self.eta) + 1e-9)
        out = []
        for s in range(s_max, -1, -1):
            n = math.ceil((s_max + 1) / (s + 1) * self.eta**s)
            r = max(1, self.max_epochs // self.eta**s)
            out.append((n, r))
        return out

    def initial(self) -> list[Config]:
        configs: list[Config] = []
        self._brackets = []
        for i, (n, r) in enumerate(self.brackets()):
            start = len(configs)
            configs += self.space.configs(n, self.seed * 7919 + i)
            self._brackets.append(
                _Bracket([model_id(k) for k in range(start, len(configs))], self.eta, r)
            )
        return configs

    def after_epoch(self, epoch: int, models: Mapping[str, ModelView], minimize: bool) -> Decision:
        stop: set[str] = set()
        for bracket in self._brackets:
            stop |= bracket.cut(epoch, models, minimize)
        return Decision(stop=frozenset(stop))
