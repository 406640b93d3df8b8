"""The tuning job's next step, decided from its record and its children as they are now.

"Decide, then do": :func:`decide` is a pure function of the spec, the record, a view of
every child and the time; the driver (:mod:`trainport.tuning.driver`) applies the
:class:`Plan` it returns. Holding ``MaxParallelTrainingJobs`` exactly comes down to this:
every child that is planned, running or stopping holds a slot, and each step launches as
many children as there are free slots and budget left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainport.tuning.records import Child, ChildState, TuningRecord, TuningStatus
from trainport.tuning.spec import Objective, TuningSpec
from trainport.tuning.stopping import (
    Progress,
    hyperband_pauses,
    hyperband_promotions,
    hyperband_stops,
    median_stops,
)

__all__ = [
    "PLANNED",
    "ChildView",
    "Plan",
    "best_child",
    "converged",
    "decide",
    "not_improving",
    "superseded",
]

PLANNED = "Planned"  # a child whose training job is not created yet
_ACTIVE = (PLANNED, "InProgress", "Stopping")
# Failed children, none succeeded, before the tuning job gives up on its definition.
_FAILURES_TO_GIVE_UP = 3
# ConvergenceDetected: the best objective moved by at most this share of itself over the
# last children that ended (SageMaker calls 1% or less "no significant improvement").
CONVERGENCE_TOLERANCE = 0.01


@dataclass(frozen=True)
class ChildView:
    """A child as a decision sees it: its job's status and its objective's points."""

    child: Child
    status: str
    points: tuple[tuple[float, float], ...]
    start_time: float | None = None
    end_time: float | None = None
    failure_reason: str | None = None

    @property
    def active(self) -> bool:
        return self.status in _ACTIVE

    @property
    def objective(self) -> float | None:
        """The final objective value: the last one it reported, once it has ended."""
        return self.points[-1][1] if self.points and not self.active else None

    @property
    def objective_status(self) -> str:
        if self.active:
            return "Pending"
        return "Succeeded" if self.points else "Failed"


@dataclass(frozen=True)
class Plan:
    launch: int = 0
    stop: tuple[tuple[str, str], ...] = ()  # (child, why: "early", "pause" or "tuning")
    promote: tuple[str, ...] = ()  # paused children to continue from their checkpoint
    paused_at: tuple[tuple[str, int], ...] = ()  # the rung each child paused now is at
    ending: str | None = None
    finish: tuple[str, str | None] | None = None  # (status, FailureReason)


def superseded(views: Sequence[ChildView]) -> set[str]:
    """The paused children that a continuation took over: their trial's result is the
    continuation's, so they are not candidates for the best."""
    return {v.child.continues for v in views if v.child.continues is not None}


def best_child(views: Sequence[ChildView], objective: Objective) -> ChildView | None:
    """The child with the best final objective; the earlier one on a tie. A paused child
    that was continued does not count (its continuation carries its trial on)."""
    best: tuple[float, ChildView] | None = None
    gone = superseded(views)
    for v in views:
        if v.child.name in gone:
            continue
        value = v.objective
        if value is not None and (best is None or objective.better(value, best[0])):
            best = (value, v)
    return best[1] if best is not None else None


def not_improving(views: Sequence[ChildView], objective: Objective) -> int:
    """How many children in a row, in the order they ended, did not improve on the best."""
    ended = _ended_in_order(views)
    best: float | None = None
    streak = 0
    for value in (v.objective for v in ended):
        if value is None:
            continue
        if best is None or objective.better(value, best):
            best, streak = value, 0
        else:
            streak += 1
    return streak


def _ended_in_order(views: Sequence[ChildView]) -> list[ChildView]:
    gone = superseded(views)
    return sorted(
        (v for v in views if v.objective is not None and v.child.name not in gone),
        key=lambda v: (v.end_time or 0, v.child.index),
    )


def convergence_window(max_jobs: int) -> int:
    """How many children that ended last ConvergenceDetected looks at: a tenth of
    MaxNumberOfTrainingJobs, at least 3."""
    return max(3, -(-max_jobs // 10))


def converged(views: Sequence[ChildView], objective: Objective, max_jobs: int) -> bool:
    """``ConvergenceDetected``: with ``k`` = :func:`convergence_window`, at least ``2k``
    children have ended with an objective, and the last ``k`` of them (in the order they
    ended) improved the best objective by at most 1% of the best before them."""
    k = convergence_window(max_jobs)
    values = [v.objective for v in _ended_in_order(views) if v.objective is not None]
    if len(values) < 2 * k:
        return False
    before, after = values[:-k], values
    best_before = min(before) if objective.minimize else max(before)
    best_now = min(after) if objective.minimize else max(after)
    gain = abs(best_now - best_before)
    return gain <= CONVERGENCE_TOLERANCE * max(abs(best_before), 1e-12)


def _ending(
    spec: TuningSpec, record: TuningRecord, views: Sequence[ChildView], now: float
) -> str | None:
    """Why the tuning job ends before its budget is spent, if it does."""
    best = best_child(views, spec.objective)
    reached = best.objective if best is not None else None
    if (
        spec.target is not None
        and reached is not None
        and not spec.objective.better(spec.target, reached)
    ):
        return "target"
    if (
        spec.not_improving is not None
        and not_improving(views, spec.objective) >= spec.not_improving
    ):
        return "not-improving"
    if spec.max_runtime is not None and now - record.creation_time >= spec.max_runtime:
        return "runtime"
    if spec.complete_on_convergence and converged(views, spec.objective, spec.max_jobs):
        return "convergence"
    failed = [v for v in views if v.status == "Failed"]
    if len(failed) >= _FAILURES_TO_GIVE_UP and best is None:
        return "failures"  # the definition itself is broken, most likely: spend no more
    return None


def _finish(views: Sequence[ChildView], spec: TuningSpec) -> tuple[str, str | None]:
    if best_child(views, spec.objective) is not None:
        return TuningStatus.COMPLETED.value, None
    failed = [v for v in views if v.failure_reason]
    why = f" The first failure: {failed[0].failure_reason}" if failed else ""
    return (
        TuningStatus.FAILED.value,
        f"No training job reported the objective metric {spec.objective.metric!r}: "
        f"{sum(v.status == 'Failed' for v in views)} of {len(views)} failed.{why}",
    )


def _resumes(spec: TuningSpec, view: ChildView) -> bool:
    """Whether ``view``'s trial pauses and resumes at rungs: Hyperband, and its definition
    keeps checkpoints."""
    if spec.strategy != "Hyperband":
        return False
    name = view.child.definition
    return next((d for d in spec.definitions if d.name == name), spec.definitions[0]).resumes


def _trials(views: Sequence[ChildView]) -> list[Progress]:
    """Each trial as its latest child: the points of all its children, one after another."""
    by_name = {v.child.name: v for v in views}
    gone = superseded(views)
    out = []
    for v in views:
        if v.child.name in gone or (v.status == PLANNED and v.child.continues is None):
            continue
        chain = [v]
        while chain[0].child.continues is not None and chain[0].child.continues in by_name:
            chain.insert(0, by_name[chain[0].child.continues])
        points = tuple(p for c in chain for p in c.points)
        out.append(
            Progress(
                v.child.name,
                chain[0].child.index,
                points,
                v.status == "InProgress" and v.child.stop_reason is None,
                before=len(points) - len(v.points),
                paused=v.child.stop_reason == "pause" and v.status == "Stopped",
                paused_at=v.child.paused_at,
            )
        )
    return out


def _early_stops(
    spec: TuningSpec, views: Sequence[ChildView]
) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
    """The children to stop now, each with why ("early" or "pause"); and the rung each
    child paused is paused at."""
    if spec.strategy == "Hyperband":
        resuming = {v.child.name for v in views if _resumes(spec, v)}
        trials = _trials(views)
        pauses, stops = hyperband_pauses(
            [t for t in trials if t.name in resuming],
            spec.min_resource,
            spec.max_resource,
            spec.objective,
            stop_at_max=spec.stop_at_max_resource,
        )
        stops += hyperband_stops(
            [t for t in trials if t.name not in resuming],
            spec.min_resource,
            spec.max_resource,
            spec.objective,
            stop_at_max=spec.stop_at_max_resource,
        )
        return [(n, "pause") for n, _ in pauses] + [(n, "early") for n in stops], pauses
    progress = [
        Progress(
            v.child.name,
            v.child.index,
            v.points,
            v.status == "InProgress" and v.child.stop_reason is None,
        )
        for v in views
        if v.status != PLANNED
    ]
    if spec.early_stopping:
        return [(n, "early") for n in median_stops(progress, spec.objective)], []
    return [], []


def _promotions(
    spec: TuningSpec, record: TuningRecord, views: Sequence[ChildView], free: int
) -> list[str]:
    if spec.strategy != "Hyperband" or free <= 0:
        return []
    last_call = record.trials >= spec.max_jobs and not any(v.active for v in views)
    promoted = hyperband_promotions(
        _trials(views), spec.min_resource, spec.max_resource, spec.objective, last_call=last_call
    )
    return promoted[:free]


def decide(spec: TuningSpec, record: TuningRecord, views: Sequence[ChildView], now: float) -> Plan:
    """What to do now: children to launch and to stop, and whether the tuning job ends."""
    views = [v for v in views if v.child.state != ChildState.CANCELLED.value]
    active = [v for v in views if v.active]
    stoppable = [
        (v.child.name, "tuning")
        for v in active
        if v.status == "InProgress" and v.child.stop_reason is None
    ]
    if record.status == TuningStatus.STOPPING.value:
        done = (TuningStatus.STOPPED.value, None) if not active else None
        return Plan(stop=tuple(stoppable), finish=done)
    ending = record.ending or _ending(spec, record, views, now)
    if ending is not None:
        return Plan(
            stop=tuple(stoppable), ending=ending, finish=None if active else _finish(views, spec)
        )
    free = spec.max_parallel - len(active)
    promote = _promotions(spec, record, views, free)
    if record.trials >= spec.max_jobs and not active and not promote:
        return Plan(finish=_finish(views, spec))
    # Continuations are the same trials resumed: they hold slots, not budget.
    launch = max(0, min(free - len(promote), spec.max_jobs - record.trials))
    stops, paused_at = _early_stops(spec, views)
    return Plan(
        launch=launch, stop=tuple(stops), promote=tuple(promote), paused_at=tuple(paused_at)
    )
