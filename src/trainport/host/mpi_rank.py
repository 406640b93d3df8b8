"""One rank of a Python MPI program: ``python -m trainport.host.mpi_rank SCRIPT ARGS...``.

It runs the script exactly as ``python -m mpi4py`` does (an uncaught exception or a non-zero
exit aborts the whole run, as the sagemaker-training toolkit arranges), and before the rank
ends with an error it leaves a note of which rank failed and how, in its host's own folder
(``TRAINPORT_MPI_RANKS``). mpirun's report usually names the rank; but when a daemon dies
while the run is torn down, mpirun reports only that daemon (seen: "unable to reliably start
one or more daemons", exit 139, after a rank's MPI_Abort), and the note is what still says
which rank failed on which host. Standard library and mpi4py only: every rank starts it.
"""

from __future__ import annotations

import json
import os
import sys
import time

ENV_RANKS = "TRAINPORT_MPI_RANKS"
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def exit_status(code: object) -> int:
    """The process status ``sys.exit(code)`` gives, as the interpreter works it out."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # a message: printed, and the status is 1


def note_failure(code: int, error: str | None) -> None:
    """Write this rank's note; never lets a failure to write hide the rank's own error."""
    folder = os.environ.get(ENV_RANKS)
    rank = next((os.environ[v] for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()), None)
    if not folder or rank is None:
        return
    note = {"rank": int(rank), "code": code, "error": (error or "")[:500], "time": time.time()}
    try:
        fd = os.open(
            os.path.join(folder, f"rank-{rank}.json"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
        )
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(note, f)
    except OSError:
        pass


def main() -> None:
    from mpi4py import run  # the rank's interpreter has mpi4py: the job chose MPI

    try:
        run.main()
    except SystemExit as exc:
        if status := exit_status(exc.code):
            note_failure(status, None if isinstance(exc.code, int) else str(exc.code))
        raise
    except BaseException as exc:
        note_failure(1, f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    sys.argv[0] = "mpi_rank"
    main()
