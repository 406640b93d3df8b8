"""The MOP scheduler: pure decisions about which training unit runs where.

Model hopper parallelism (Cerebro, VLDB 2020) keeps the data still and moves models. The
training data is split into ``p`` partitions; worker ``w`` holds partition ``w % p`` (with
``r`` replicas there are ``p * r`` workers). A *unit* is one model trained for one pass over
one partition. In every epoch each active model must run exactly one unit per partition, a
model runs at most one unit at a time, and a worker runs at most one unit at a time.

:func:`assign` is the decision step of Cerebro's randomized scheduler (Algorithm 1): every
idle worker picks, uniformly at random, an idle model that still has to visit the
worker's partition. :func:`plan_epoch` runs that same step on a simulated clock with cost
estimates, which fixes each model's visit order from the seed alone. Executors then run
:func:`assign` with ``ordered=True``: a model may only take the next partition in its planned
order, so the numbers a model ends up with depend on the seed and never on timing, on the
backend, or on which replica of a partition served a unit.

Nothing here does I/O or reads a clock; randomness is keyed by explicit seeds.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

from trainport.errors import ValidationError

__all__ = [
    "EpochPlan",
    "Placement",
    "PlannedUnit",
    "Unit",
    "assign",
    "lower_bound",
    "plan_epoch",
]


@dataclass(frozen=True, order=True)
class Unit:
    """One model trained for one pass over one partition on one worker."""

    model: str
    partition: int
    worker: int


@dataclass(frozen=True)
class Placement:
    """Which worker holds which partition: worker ``w`` holds partition ``w % partitions``."""

    partitions: int
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValidationError(f"partitions={self.partitions}: need at least one partition")
        if self.replicas < 1:
            raise ValidationError(f"replicas={self.replicas}: need at least one copy")

    @property
    def workers(self) -> int:
        return self.partitions * self.replicas

    def partition_of(self, worker: int) -> int:
        return worker % self.partitions

    def holders(self, partition: int) -> list[int]:
        return [w for w in range(self.workers) if self.partition_of(w) == partition]


def assign(
    remaining: Mapping[str, Sequence[int]],
    busy_models: Set[str],
    idle_workers: Sequence[int],
    placement: Placement,
    seed: str,
    *,
    ordered: bool = False,
) -> list[Unit]:
    """Algorithm 1's decision step: give each idle worker a random eligible idle model.

    ``remaining`` maps each model to the partitions it still has to visit this epoch (in
    planned order when ``ordered``). A model is eligible on a worker when it is idle and
    still needs that worker's partition (with ``ordered``: needs it *next*). Each model is
    given to at most one worker, so two units of one model never overlap.
    """
    rng = random.Random(seed)
    busy = set(busy_models)
    workers = sorted(idle_workers)
    # Visiting idle workers in random order keeps the first worker from always winning
    # the contested models, which is what makes the schedule fair across workers.
    rng.shuffle(workers)
    units: list[Unit] = []
    for worker in workers:
        part = placement.partition_of(worker)
        eligible = sorted(
            model
            for model, todo in remaining.items()
            if model not in busy and todo and (todo[0] == part if ordered else part in todo)
        )
        if eligible:
            model = eligible[rng.randrange(len(eligible))]
            busy.add(model)
            units.append(Unit(model, part, worker))
    return units


@dataclass(frozen=True)
class PlannedUnit:
    unit: Unit
    start: float
    end: float


@dataclass(frozen=True)
class EpochPlan:
    """The outcome of simulating one epoch: units with predicted times and visit orders."""

    units: tuple[PlannedUnit, ...]
    visit_order: Mapping[str, tuple[int, ...]]

    @property
    def makespan(self) -> float:
        return max((u.end for u in self.units), default=0.0)


CostFn = Callable[[str, int], float]


def plan_epoch(
    models: Sequence[str],
    placement: Placement,
    seed: str,
    cost: CostFn | None = None,
) -> EpochPlan:
    """Simulate Algorithm 1 for one epoch on a clock driven by ``cost(model, partition)``.

    Deterministic for a given seed: ties in the event queue break by worker number, and
    every random choice is keyed by ``seed`` and the decision's index.
    """
    cost = cost or (lambda _m, _p: 1.0)
    remaining: dict[str, list[int]] = {m: list(range(placement.partitions)) for m in models}
    busy: set[str] = set()
    idle = list(range(placement.workers))
    running: list[tuple[float, int, str]] = []
    now = 0.0
    planned: list[PlannedUnit] = []
    order: dict[str, list[int]] = {m: [] for m in models}
    decision = 0
    while any(remaining.values()):
        units = assign(remaining, busy, idle, placement, f"{seed}/plan/{decision}")
        decision += 1
        for unit in units:
            remaining[unit.model].remove(unit.partition)
            order[unit.model].append(unit.partition)
            busy.add(unit.model)
            idle.remove(unit.worker)
            end = now + float(cost(unit.model, unit.partition))
            planned.append(PlannedUnit(unit, now, end))
            heapq.heappush(running, (end, unit.worker, unit.model))
        if not running:
            # Only possible when a partition has no worker, which Placement rules out.
            raise ValidationError("no worker holds a partition that a model still needs")
        now, worker, model = heapq.heappop(running)
        idle.append(worker)
        busy.discard(model)
        # Free every unit that ends at the same instant before deciding again, so the
        # decision sees all idle workers at once, as Algorithm 1 does.
        while running and running[0][0] == now:
            _, worker, model = heapq.heappop(running)
            idle.append(worker)
            busy.discard(model)
    return EpochPlan(tuple(planned), {m: tuple(v) for m, v in order.items()})


def lower_bound(work: Mapping[tuple[str, int], float], placement: Placement) -> float:
    """max(max over models of total work, max over workers of total work).

    ``work[(model, partition)]`` is a unit's duration. A model's units run one after
    another; a partition's units are shared by its ``replicas`` holders at best evenly.
    """
    per_model: dict[str, float] = {}
    per_partition: dict[int, float] = {}
    for (model, part), seconds in work.items():
        per_model[model] = per_model.get(model, 0.0) + seconds
        per_partition[part] = per_partition.get(part, 0.0) + seconds
    worst_model = max(per_model.values(), default=0.0)
    worst_worker = max(per_partition.values(), default=0.0) / placement.replicas
    return max(worst_model, worst_worker)
