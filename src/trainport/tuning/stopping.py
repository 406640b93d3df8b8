"""Stopping children early: Hyperband's rungs (asynchronous successive halving) and the
median rule of ``TrainingJobEarlyStoppingType: Auto``.

Both read a child's objective metric as it reports it once per epoch (the points the
definition's MetricDefinitions find in its log), and both are pure: they take every
child's points with their timestamps and return the names to stop. Nothing is kept
between calls; a decision depends only on points already recorded, so a restarted
driver decides the same.

**Hyperband (ASHA).** Rungs sit at ``MinResource * eta**k`` epochs below MaxResource. A
child that reaches a rung goes on only if its value there is within the best ``1/eta`` of
the values that the children before it (by the time they reached that rung) had there; a
child first at a rung always goes on. This is asynchronous successive halving: no child
waits for a rung to fill, so ``MaxParallelTrainingJobs`` stays busy, and the strongest
child is never stopped, so it trains to MaxResource.

**Hyperband with checkpoints (pause and promote).** When the children keep checkpoints,
a trial (a configuration, trained by one child and then by the continuations that resume
its checkpoint) that reaches a rung goes on only if it is already among the best
``1/eta`` of every trial that reached that rung (``rank < n // eta``); otherwise it is
paused: its child is stopped, its checkpoint kept. A paused trial is promoted (continued
by a new child) once it ranks within the best ``n // eta`` at its rung as more trials
arrive; promotions take free slots before new trials do, highest rung first. When no new
trial is left to start and nothing runs, the best paused trial of the highest rung is
promoted, so the strongest trial always trains to MaxResource. This is ASHA as its
paper has it; without checkpoints a promotion would retrain from the first epoch, so the
rule above (run on, or stop) is used instead.

**Median rule.** After epoch ``k`` a child is stopped when its value is worse than the
median, over the children started before it that reached epoch ``k``, of their running
averages up to epoch ``k``; it needs :data:`MEDIAN_MIN_PEERS` such children to judge.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainport.tuning.spec import Objective

__all__ = [
    "ETA",
    "MEDIAN_MIN_PEERS",
    "Progress",
    "hyperband_pauses",
    "hyperband_promotions",
    "hyperband_stops",
    "median_stops",
    "rungs",
]

ETA = 3  # Hyperband's reduction factor: one child in three goes on from each rung
MEDIAN_MIN_PEERS = 3


@dataclass(frozen=True)
class Progress:
    """One child's objective so far: ``points`` are (timestamp, value), one per epoch."""

    name: str
    index: int
    points: tuple[tuple[float, float], ...]
    running: bool
    # With checkpoints: how many of ``points`` the trial's earlier (paused) children
    # trained, and whether its latest child was paused and not yet continued.
    before: int = 0
    paused: bool = False
    paused_at: int | None = None  # the rung it was paused at


def rungs(min_resource: int, max_resource: int, eta: int = ETA) -> list[int]:
    """The epochs at which Hyperband judges a child: below MaxResource, where it ends."""
    out = []
    r = max(1, min_resource)
    while r < max_resource:
        out.append(r)
        r *= eta
    return out


def _quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _cut_at_rung(
    child: Progress, rung: int, peers: Sequence[Progress], objective: Objective
) -> bool:
    stamp, value = child.points[rung - 1]
    earlier = [
        p.points[rung - 1][1]
        for p in peers
        if p.name != child.name
        and len(p.points) >= rung
        and (p.points[rung - 1][0], p.index) < (stamp, child.index)
    ]
    if not earlier:
        return False
    # The value the best 1/eta of the earlier children reached: worse than it, stop.
    if objective.minimize:
        return value > _quantile(earlier, 1 / ETA)
    return value < _quantile(earlier, 1 - 1 / ETA)


def hyperband_stops(
    children: Sequence[Progress],
    min_resource: int,
    max_resource: int,
    objective: Objective,
    *,
    stop_at_max: bool = False,
) -> list[str]:
    """The running children Hyperband stops now. ``stop_at_max``: a child that has had
    MaxResource epochs is stopped too (its own epochs go further than the budget)."""
    levels = rungs(min_resource, max_resource)
    out = []
    for child in children:
        if not child.running:
            continue
        reached = [r for r in levels if len(child.points) >= r]
        if any(_cut_at_rung(child, r, children, objective) for r in reached) or (
            stop_at_max and len(child.points) >= max_resource
        ):
            out.append(child.name)
    return out


def _reached(trial: Progress) -> int:
    """The epochs a trial counts with at rungs: a paused trial only up to the rung it was
    paused at (epochs it trained before the pause took effect are not a promotion)."""
    if trial.paused and trial.paused_at is not None:
        return min(len(trial.points), trial.paused_at)
    return len(trial.points)


def _rank_at(child: Progress, rung: int, peers: Sequence[Progress], objective: Objective) -> int:
    """How many of ``peers`` at ``rung`` did strictly better than ``child`` there."""
    value = child.points[rung - 1][1]
    return sum(
        1
        for p in peers
        if p.name != child.name
        and _reached(p) >= rung
        and objective.better(p.points[rung - 1][1], value)
    )


def _at_rung(child: Progress, rung: int, peers: Sequence[Progress]) -> int:
    """How many trials are at ``rung``, ``child`` counted."""
    return 1 + sum(1 for p in peers if p.name != child.name and _reached(p) >= rung)


def _goes_on_at_arrival(
    child: Progress, rung: int, peers: Sequence[Progress], objective: Objective
) -> bool:
    """Whether a trial reaching ``rung`` ranks, among the trials that reached it before
    it and itself, within the best ``n // eta``: ASHA would promote it at once."""
    stamp = (child.points[rung - 1][0], child.index)
    earlier = [
        p
        for p in peers
        if p.name != child.name and _reached(p) >= rung and (p.points[rung - 1][0], p.index) < stamp
    ]
    return _rank_at(child, rung, earlier, objective) < (len(earlier) + 1) // ETA


def hyperband_pauses(
    trials: Sequence[Progress],
    min_resource: int,
    max_resource: int,
    objective: Objective,
    *,
    stop_at_max: bool = False,
) -> tuple[list[tuple[str, int]], list[str]]:
    """With checkpoints: the running trials to pause now, each with the rung it is paused
    at (one its latest child reached, where it is not good enough to go on), and those to
    stop (``stop_at_max``: they have had MaxResource epochs). Each decision reads only
    points recorded before it, so a restarted driver decides the same."""
    levels = rungs(min_resource, max_resource)
    pauses, stops = [], []
    for trial in trials:
        if not trial.running:
            continue
        if stop_at_max and len(trial.points) >= max_resource:
            stops.append(trial.name)
            continue
        # Only rungs this child reached: those below were judged before it was started.
        for rung in (r for r in levels if trial.before < r <= len(trial.points)):
            if not _goes_on_at_arrival(trial, rung, trials, objective):
                pauses.append((trial.name, rung))
                break
    return pauses, stops


def hyperband_promotions(
    trials: Sequence[Progress],
    min_resource: int,
    max_resource: int,
    objective: Objective,
    *,
    last_call: bool = False,
) -> list[str]:
    """The paused trials to continue, in the order to continue them (highest rung first,
    then the best there). A trial whose child trained past its rung before the pause took
    effect must rank within the best ``n // eta`` at those rungs too, since its
    continuation starts above them. ``last_call``: no new trial is left to start and none
    runs; the best paused trial of the highest rung is promoted even where its rung has
    fewer than ``eta`` trials."""
    ranked: list[tuple[int, int, str]] = []  # (-rung, rank, name)
    best_left: tuple[int, int, str] | None = None
    for trial in trials:
        rung = trial.paused_at
        if not trial.paused or rung is None or len(trial.points) >= max_resource:
            continue
        rank = _rank_at(trial, rung, trials, objective)
        key = (-rung, rank, trial.name)
        past = [r for r in rungs(min_resource, max_resource) if rung <= r <= len(trial.points)]
        if all(
            _rank_at(trial, r, trials, objective) < _at_rung(trial, r, trials) // ETA for r in past
        ):
            ranked.append(key)
        elif rank == 0 and (best_left is None or key < best_left):
            best_left = key
    if not ranked and last_call and best_left is not None:
        return [best_left[2]]
    return [name for _, _, name in sorted(ranked)]


def median_stops(children: Sequence[Progress], objective: Objective) -> list[str]:
    """The running children the median rule stops now."""
    out = []
    for child in children:
        epoch = len(child.points)
        if not child.running or epoch == 0:
            continue
        averages = [
            statistics.fmean(v for _, v in p.points[:epoch])
            for p in children
            if p.index < child.index and len(p.points) >= epoch
        ]
        if len(averages) < MEDIAN_MIN_PEERS:
            continue
        median = statistics.median(averages)
        if objective.better(median, child.points[-1][1]):
            out.append(child.name)
    return out
