"""The tuning job record: what trainport knows about one hyperparameter tuning job.

Lifecycle (HyperParameterTuningJobStatus)::

    InProgress -> Completed   (every child launched has ended, or a completion criterion
                               was met and the children still running were stopped)
    InProgress -> Failed      (every child failed, or none could be created)
    InProgress -> Stopping -> Stopped   (StopHyperParameterTuningJob: every child stopped)

A child is recorded (``planned``) before its training job is created, and marked
``created`` once it is: a driver that restarts creates the planned children whose job does
not exist yet and adopts the others, so no child ever runs twice. Once a child's job has
ended, what the tuning job needs of it is copied here (``ended``), so reads of a finished
tuning job never open its children's records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Child", "ChildEnd", "ChildState", "TuningRecord", "TuningStatus"]


class TuningStatus(StrEnum):
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"

    @property
    def terminal(self) -> bool:
        return self in (TuningStatus.COMPLETED, TuningStatus.FAILED, TuningStatus.STOPPED)


class ChildState(StrEnum):
    PLANNED = "planned"  # recorded; its training job may not exist yet
    CREATED = "created"  # its training job exists
    REFUSED = "refused"  # its training job could not be created (counts as failed)
    CANCELLED = "cancelled"  # planned, then the tuning job stopped before it was created


@dataclass(frozen=True)
class ChildEnd:
    """A child's training job once it has ended."""

    status: str
    # The objective metric's points, (timestamp, value) one per epoch: what later
    # children's early-stopping decisions compare against.
    points: tuple[tuple[float, float], ...]
    start_time: float | None
    end_time: float | None
    failure_reason: str | None = None

    @property
    def objective(self) -> float | None:
        return self.points[-1][1] if self.points else None


@dataclass(frozen=True)
class Child:
    index: int
    name: str
    definition: str | None
    tuned: dict[str, str]
    state: str
    creation_time: float
    # Why the tuning job stopped it, if it did: "early" (Hyperband, the median rule),
    # "pause" (Hyperband paused it at a rung, its checkpoint kept, to resume it if it is
    # promoted) or "tuning" (the tuning job was stopped or met a completion criterion).
    stop_reason: str | None = None
    ended: ChildEnd | None = None
    refusal: str | None = None
    # The paused child this one continues (same values, same checkpoint folder); None
    # for a trial's first child.
    continues: str | None = None
    # The rung a paused child was paused at.
    paused_at: int | None = None


@dataclass(frozen=True)
class TuningRecord:
    name: str
    arn: str
    request: dict[str, Any]
    creation_time: float
    seed: int
    status: str = TuningStatus.IN_PROGRESS.value
    last_modified_time: float = 0.0
    end_time: float | None = None
    failure_reason: str | None = None
    children: tuple[Child, ...] = ()
    # Why the tuning job is ending before its budget is spent: "target", "not-improving",
    # "runtime", "failures"; None while it goes on.
    ending: str | None = None
    # When ``TuningJobCompletionCriteria.ConvergenceDetected`` ended it.
    convergence_time: float | None = None
    # The process driving it (the identity ``jobs.liveness`` gives): a driver adopts a
    # tuning job only when this one is gone.
    driver: tuple[int, int, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TuningRecord:
        doc = dict(doc)
        children = []
        for c in doc.get("children", ()):
            c = dict(c)
            if c.get("ended") is not None:
                end = dict(c["ended"])
                end["points"] = tuple((t, v) for t, v in end.get("points", ()))
                c["ended"] = ChildEnd(**end)
            children.append(Child(**c))
        doc["children"] = tuple(children)
        if doc.get("driver") is not None:
            doc["driver"] = tuple(doc["driver"])
        return cls(**doc)

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def first_of_trial(self, name: str) -> Child:
        """The first child of the trial ``name`` belongs to (itself, unless it continues
        a paused one)."""
        child = self.child(name)
        while child.continues is not None:
            child = self.child(child.continues)
        return child

    @property
    def trials(self) -> int:
        """How many trials (configurations) were started: continuations are not new ones."""
        return sum(c.continues is None for c in self.children)

    def with_child(self, name: str, **changes: Any) -> TuningRecord:
        children = tuple(
            dataclasses.replace(c, **changes) if c.name == name else c for c in self.children
        )
        return dataclasses.replace(self, children=children)
