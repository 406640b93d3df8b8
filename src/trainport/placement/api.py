"""The placement contract: a job's host agents, started together, reporting as one stream.

Lifecycle of a :class:`HostGroup`::

    created -> start() -> events() ... (until every host has reported HostEnded) -> close()

``terminate`` may come at any time after ``start``; a host that has not started training
yet never does. Each host reports exactly one :class:`~trainport.host.events.HostEnded`,
last, whatever happens to it (an agent bug, a node that died): the supervisor relies on it
to end the job.

A group also guarantees where the job's record-side files are once a host has ended: each
host's log at ``<job dir>/logs/<host>.log`` on the supervisor's machine, and its model and
output folders reachable through :meth:`HostGroup.artifact_folders` for the merged upload.
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from pathlib import Path

from trainport.errors import TrainportError
from trainport.host.events import HostEvent

__all__ = ["HostGroup", "PlacementError", "take_events"]


class PlacementError(TrainportError):
    """The job's hosts cannot be placed (no cluster, not enough capacity, a node unfit)."""


class HostGroup(ABC):
    """The running host agents of one job."""

    hosts: tuple[str, ...]

    @abstractmethod
    def start(self) -> None:
        """Start every host's agent; raises :class:`PlacementError` if they cannot be."""

    @abstractmethod
    def events(self, timeout: float) -> list[HostEvent]:
        """What the hosts reported since the last call, in order per host; waits up to
        ``timeout`` seconds for the first event, and returns [] if none came."""

    @abstractmethod
    def terminate(self, host: str, grace: float) -> None:
        """SIGTERM ``host``'s training process group, SIGKILL it ``grace`` seconds later."""

    @abstractmethod
    def artifact_folders(self) -> list[tuple[str, Path, Path]]:
        """(host, model folder, output data folder) of every host, on this machine."""

    @abstractmethod
    def close(self) -> None:
        """Release what the group holds; the hosts have all ended."""


def take_events(events: queue.SimpleQueue[HostEvent], timeout: float) -> list[HostEvent]:
    """What :meth:`HostGroup.events` gives from a group's own queue: every event there now,
    waiting up to ``timeout`` s for the first."""
    got: list[HostEvent] = []
    try:
        got.append(events.get(timeout=timeout))
        while True:
            got.append(events.get_nowait())
    except queue.Empty:
        pass
    return got
