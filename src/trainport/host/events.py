"""What a host agent reports upward: plain data, so it crosses a process or machine boundary.

A host agent never touches the job's record. Everything the supervisor learns about a
host arrives as one of these events, in the order the agent produced them:

    StatusChanged*  (Downloading, progress, Training, Uploading)
    TrainingStarted (once the training process group exists)
    LogLines*       (each line of the host's log, timestamped)
    MetricsFound*   (points matched by the job's MetricDefinitions)
    ResourcesSampled* (CPU and memory of the training processes, see host.resources)
    HostEnded       (always last, exactly once)

Every field is a frozen dataclass of strings, numbers and tuples, so an event pickles as it
is (a Ray actor's return value, a queue between threads) and means the same on either side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trainport.host.phases import Finished, MetricPoint, Phase, Progress
from trainport.host.resources import ResourcesSampled

__all__ = [
    "HostEnded",
    "HostEvent",
    "LogLines",
    "MetricsFound",
    "ResourcesSampled",
    "StatusChanged",
    "TrainingStarted",
    "append_log_lines",
]


@dataclass(frozen=True)
class StatusChanged:
    """The host entered a phase, or has news within it."""

    host: str
    change: Phase | Progress


@dataclass(frozen=True)
class TrainingStarted:
    """The host's training process group exists (its id on the host's machine)."""

    host: str
    pgid: int


@dataclass(frozen=True)
class LogLines:
    """Lines of ``host``'s log, each (unix time, text without its newline).

    ``host`` is the log the lines belong to, which under MPI may be another host than the
    one reporting (a rank's output is routed to its own host's log).
    """

    host: str
    lines: tuple[tuple[float, str], ...]


def append_log_lines(path: Path, lines: Iterable[tuple[float, str]]) -> None:
    """Add ``lines`` to a host's log in the job's folder, each as "time<TAB>text", the form
    JobService.logs reads back."""
    with open(path, "a", encoding="utf-8") as log_file:
        log_file.writelines(f"{t:.3f}\t{text}\n" for t, text in lines)


@dataclass(frozen=True)
class MetricsFound:
    host: str
    points: tuple[MetricPoint, ...]


@dataclass(frozen=True)
class HostEnded:
    """The host is done: its processes are gone and its outcome is final."""

    host: str
    finished: Finished
    # Where the host uploaded the job's model archive, when it uploads its own (one host).
    model_uri: str | None = None


HostEvent = StatusChanged | TrainingStarted | LogLines | MetricsFound | ResourcesSampled | HostEnded
