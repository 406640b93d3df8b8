"""Job statuses and the pure function that moves a record between them.

Lifecycle (TrainingJobStatus / SecondaryStatus)::

    InProgress/Starting -> InProgress/Downloading -> InProgress/Training -> InProgress/Uploading
        -> Completed/Completed        (exit code 0)
        -> Failed/Failed              (non-zero exit, or trainport could not run the job)
    any InProgress -> Stopping/Stopping [-> Stopping/Uploading] -> Stopped/Stopped
                                                                (StopTrainingJob)
    any InProgress -> Stopping/Stopping [-> Stopping/Uploading] -> Stopped/MaxRuntimeExceeded
                                                                (MaxRuntimeInSeconds)

Every change of SecondaryStatus appends a transition and closes the previous one's EndTime.
Once a stop is requested the job ends Stopped whatever the exit code, as SageMaker does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from trainport.host.phases import Finished, Phase, Progress
from trainport.jobs.records import JobRecord, Transition

__all__ = [
    "Event",
    "Finished",
    "Phase",
    "Progress",
    "Status",
    "StopRequested",
    "advance",
]


class Status(StrEnum):
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"

    @property
    def terminal(self) -> bool:
        return self in (Status.COMPLETED, Status.FAILED, Status.STOPPED)


@dataclass(frozen=True)
class StopRequested:
    reason: str  # "user" | "max_runtime"
    message: str


#: What moves a job: a host's words (:mod:`trainport.host.phases`), or a stop asked of the
#: job.
Event = Phase | Progress | StopRequested | Finished


#: SageMaker's limit on FailureReason.
REASON_LIMIT = 1024


def cut_reason(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` within ``limit`` characters, keeping its start and its end.

    A failure file often holds a traceback whose last lines are the real cause: cutting
    only the tail off would drop exactly that.
    """
    if len(text) <= limit:
        return text
    gap = "\n...\n"
    head = limit // 4
    return text[:head] + gap + text[len(text) - (limit - head - len(gap)) :]


# How far a job's hosts have come; one host's later phase never takes the job back.
_PHASE_ORDER = {"Pending": 0, "Starting": 0, "Downloading": 1, "Training": 2, "Uploading": 3}


def goes_back(current: str, phase: str) -> bool:
    """Whether a host reporting ``phase`` would move a job that is at ``current`` back
    (a slower host still Downloading while the others train): the job's
    SecondaryStatusTransitions only go forward, as SageMaker's do."""
    if current not in _PHASE_ORDER or phase not in _PHASE_ORDER:
        return False
    return _PHASE_ORDER[phase] < _PHASE_ORDER[current]


def _with_secondary(record: JobRecord, secondary: str, message: str, now: float) -> JobRecord:
    transitions = list(record.transitions)
    if transitions and transitions[-1].status == secondary:
        return dataclasses.replace(record, status_message=message, last_modified_time=now)
    if transitions and transitions[-1].end_time is None:
        transitions[-1] = dataclasses.replace(transitions[-1], end_time=now)
    transitions.append(Transition(secondary, now, None, message))
    return dataclasses.replace(
        record,
        secondary_status=secondary,
        transitions=tuple(transitions),
        status_message=message,
        last_modified_time=now,
    )


def advance(record: JobRecord, event: Event, now: float) -> JobRecord:
    """Return the record after ``event``; events that no longer apply leave it unchanged."""
    status = Status(record.status)
    if status.terminal:
        return record
    if isinstance(event, Progress):
        if status is Status.STOPPING:
            return record
        transitions = list(record.transitions)
        if transitions and transitions[-1].end_time is None:
            transitions[-1] = dataclasses.replace(transitions[-1], message=event.message)
        return dataclasses.replace(
            record,
            status_message=event.message,
            transitions=tuple(transitions),
            last_modified_time=now,
        )
    if isinstance(event, Phase):
        if status is Status.STOPPING:
            # A stopped job still uploads what it saved, and says so as SageMaker does
            # (the job stays Stopping); no other phase begins after a stop.
            if event.secondary != "Uploading":
                return record
            return _with_secondary(record, event.secondary, event.message, now)
        new = _with_secondary(record, event.secondary, event.message, now)
        if event.secondary == "Training" and record.training_start_time is None:
            new = dataclasses.replace(new, training_start_time=now)
        return new
    if isinstance(event, StopRequested):
        if status is Status.STOPPING:
            return record
        new = _with_secondary(record, "Stopping", event.message, now)
        return dataclasses.replace(new, status=Status.STOPPING.value, stop_reason=event.reason)
    # Finished
    if status is Status.STOPPING:
        secondary = "MaxRuntimeExceeded" if record.stop_reason == "max_runtime" else "Stopped"
        message = (
            "Training job stopped: MaxRuntimeInSeconds was exceeded"
            if secondary == "MaxRuntimeExceeded"
            else "Training job stopped on request"
        )
        final, end_status = secondary, Status.STOPPED
        reason = None
    elif event.exit_code == 0:
        final, end_status, message, reason = (
            "Completed",
            Status.COMPLETED,
            "Training job completed",
            None,
        )
    else:
        final, end_status = "Failed", Status.FAILED
        reason = cut_reason(
            event.failure_reason or f"AlgorithmError: , exit code: {event.exit_code}"
        )
        message = "Training job failed"
    new = _with_secondary(record, final, message, now)
    # The final status is a point in time: its transition opens and closes at once.
    transitions = list(new.transitions)
    transitions[-1] = dataclasses.replace(transitions[-1], end_time=now)
    start = record.training_start_time or now
    return dataclasses.replace(
        new,
        status=end_status.value,
        transitions=tuple(transitions),
        failure_reason=reason,
        training_end_time=now,
        training_start_time=start,
    )
