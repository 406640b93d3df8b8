"""The runners by name: the one place that knows every implementation of
:class:`~trainport.runners.api.Runner`, so the contract imports none of them."""

from __future__ import annotations

import logging

from trainport.errors import SandboxError
from trainport.runners.api import PROCESS_RUNNER_WARNING, Runner

__all__ = ["select_runner"]

log = logging.getLogger(__name__)


def select_runner(name: str, *, verified: bool = False) -> Runner:
    """The runner called ``name``; "auto" is the sandbox where it works, else processes.

    ``verified`` skips the sandbox probe for a choice already checked on this machine
    (a job's supervisor runs the runner its submission chose).
    """
    from trainport.runners.process import ProcessRunner
    from trainport.runners.sandbox import SandboxRunner, sandbox_problem

    if name == "process":
        log.warning("%s", PROCESS_RUNNER_WARNING)
        return ProcessRunner()
    if name == "sandbox" and verified:
        return SandboxRunner()
    problem = sandbox_problem()
    if name == "sandbox":
        if problem:
            raise SandboxError(
                f"the sandbox runner cannot work on this machine: {problem}. "
                "Use --runner process (no isolation) or install bubblewrap"
            )
        return SandboxRunner()
    if problem:
        log.warning("sandbox unavailable (%s); %s", problem, PROCESS_RUNNER_WARNING)
        return ProcessRunner()
    return SandboxRunner()
