"""Placement: where a job's host agents run (this machine, or the nodes of a Ray cluster).

The supervisor starts a job's hosts through one interface, :class:`HostGroup`, and learns
everything about them from its event stream (:mod:`trainport.host.events`). What contains
each host's training process (process, sandbox, container) is the runner's business, on
whichever machine the agent runs.
"""

from __future__ import annotations

from trainport.placement.api import HostGroup, PlacementError
from trainport.placement.local import LocalHosts

__all__ = ["HostGroup", "LocalHosts", "PlacementError"]
