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
from trainport.tuning.stopping import Progress, hyperband_stops, median_stops

__all__ = ["PLANNED", "ChildView", "Plan", "best_child", "decide", "not_improving"]

PLANNED = "Planned"  # a child whose training job is not created yet
_ACTIVE = (PLANNED, "InProgress", "Stopping")
# Failed children, none succeeded, before the tuning job gives up on its definition.
_FAILURES_TO_GIVE_UP = 3


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
    stop: tuple[tuple[str, str], ...] = ()  # (child, why: "early" or "tuning")
    ending: str | None = None
    finish: tuple[str, str | None] | None = None  # (status, FailureReason)


def best_child(views: Sequence[ChildView], objective: Objective) -> ChildView | None:
    """The child with the best final objective; the earlier one on a tie."""
    best: tuple[float, ChildView] | None = None
    for v in views:
        value = v.objective
        if value is not None and (best is None or objective.better(value, best[0])):
            best = (value, v)
    return best[1] if best is not None else None


def not_improving(views: Sequence[ChildView], objective: Objective) -> int:
    """How many children in a row, in the order they ended, did not improve on the best."""
    ended = sorted(
        (v for v in views if v.objective is not None),
        key=lambda v: (v.end_time or 0, v.child.index),
    )
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


def _early_stops(spec: TuningSpec, views: Sequence[ChildView]) -> list[str]:
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
    if spec.strategy == "Hyperband":
        return hyperband_stops(
            progress,
            spec.min_resource,
            spec.max_resource,
            spec.objective,
            stop_at_max=spec.stop_at_max_resource,
        )
    if spec.early_stopping:
        return median_stops(progress, spec.objective)
    return []


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
    launched = len(record.children)
    if launched >= spec.max_jobs and not active:
        return Plan(finish=_finish(views, spec))
    launch = max(0, min(spec.max_parallel - len(active), spec.max_jobs - launched))
    return Plan(launch=launch, stop=tuple((n, "early") for n in _early_stops(spec, views)))
