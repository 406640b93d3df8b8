"""The host agent's own words for what happens to its host: a phase entered, news within
it, the end, and a metric point read from its log.

They ride in the agent's events (:mod:`trainport.host.events`) from any placement, local
or on a Ray node. The job's status machine (:mod:`trainport.jobs.status`) takes them as
its inputs beside the job's own (a stop request); the supervisor decides which of a
host's words reach the job (a slower host's earlier phase does not take the job back).
Nothing here knows of jobs, records or their statuses.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Finished", "MetricPoint", "Phase", "Progress"]


@dataclass(frozen=True)
class Phase:
    """The host agent entered a phase (a SecondaryStatus of InProgress)."""

    secondary: str  # Downloading | Training | Uploading
    message: str


@dataclass(frozen=True)
class Progress:
    """News within the current phase (download progress): only the status message changes."""

    message: str


@dataclass(frozen=True)
class Finished:
    """The host's processes are gone; ``exit_code`` is None when training never started."""

    exit_code: int | None
    failure_reason: str | None = None


@dataclass(frozen=True)
class MetricPoint:
    """One value of a metric the host's log showed (a MetricDefinitions match)."""

    name: str
    value: float
    timestamp: float
