"""Runners place a host's training process: plainly, or in a sandbox at the real ``/opt/ml``.

:mod:`~trainport.runners.api` holds the contract; :func:`~trainport.runners.registry.select_runner`
picks one by name
("auto" means the sandbox where this machine can make one, else plain processes).
"""

from __future__ import annotations

from trainport.runners.api import HostProcess, Placement, Runner
from trainport.runners.registry import select_runner

__all__ = ["HostProcess", "Placement", "Runner", "select_runner"]
