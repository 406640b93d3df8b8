"""A failed training command's FailureReason, as SageMaker would give it.

SageMaker's reason is ``AlgorithmError: <the failure file>, exit code: <N>``. Who writes the
failure file depends on what ran:

- script mode: the framework container's training toolkit, which writes (unless the script
  left one of its own) an ``ExecuteUserScriptError`` naming the script's exit code, the
  last error it printed and the command (:func:`script_failure`);
- an image or entrypoint of the user's own: the user's code, or nobody, and then trainport
  gives the last lines the command printed (:func:`output_failure`), which say more than
  SageMaker's empty reason.

Both are pure functions of the exit code and the output lines; the agent reads the lines
from the host's log.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

__all__ = ["last_exception", "output_failure", "script_failure"]

# Lines the host agent adds to the job's log itself: not the job's output.
_OWN_PREFIX = "[trainport]"
_TRACEBACK = "Traceback (most recent call last):"
# "ValueError: bad shard", "torch.distributed.DistBackendError", "KeyboardInterrupt".
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(:( .*)?)?$")
# What launchers raise when a child they started failed: the child's error says why.
_LAUNCHER_ERRORS = ("ChildFailedError",)
# How many of the last lines stand for a command that printed no traceback.
TAIL_LINES = 5


def _job_lines(lines: Sequence[str]) -> list[str]:
    return [line.rstrip() for line in lines if not line.startswith(_OWN_PREFIX)]


def last_exception(lines: Sequence[str]) -> str | None:
    """The exception line of the last Python traceback in ``lines`` (``ValueError: bad
    shard 7``), or None where there is none. In a chain of exceptions that is the one
    raised last, the one that ended the program; a launcher's own report that a child
    failed (torchrun's ChildFailedError) gives way to the child's error before it."""
    own = _job_lines(lines)
    starts = [i for i, line in enumerate(own) if line.endswith(_TRACEBACK)]
    for start in reversed(starts):
        found = _exception_after(own, start)
        if found and not any(name in found for name in _LAUNCHER_ERRORS):
            return found
    return None


def _exception_after(own: Sequence[str], start: int) -> str | None:
    # A prefix before "Traceback" (an MPI rank's tag, a logger's stamp) is before each line.
    first = own[start]
    prefix = first[: len(first) - len(_TRACEBACK)]
    for line in own[start + 1 :]:
        body = line[len(prefix) :] if line.startswith(prefix) else line
        if not body or body[0].isspace() or body.startswith("^"):
            continue  # the stack: "  File ...", source lines, carets
        if _EXCEPTION.match(body):
            return body
        if body.endswith(_TRACEBACK):
            return None  # the next traceback began without an exception line
    return None


def script_failure(code: int, command: Sequence[str], lines: Sequence[str]) -> str:
    """The toolkit's ``ExecuteUserScriptError`` for a script that exited with ``code``:
    the last exception it raised (else its last line of output) and the command line."""
    message = last_exception(lines)
    if message is None:
        tail = [line for line in _job_lines(lines) if line.strip()]
        message = tail[-1].strip() if tail else ""
    said = " ".join(shlex.quote(part) for part in command)
    return (
        f'AlgorithmError: ExecuteUserScriptError:\nExitCode {code}\nErrorMessage "{message}"\n'
        f'Command "{said}", exit code: {code}'
    )


def output_failure(code: int, lines: Sequence[str]) -> str:
    """The reason of a command of the user's own that left no failure file: its last lines
    of output, or SageMaker's empty reason where it printed nothing."""
    tail = "\n".join([line for line in _job_lines(lines) if line.strip()][-TAIL_LINES:])
    return f"AlgorithmError: {tail}, exit code: {code}"
