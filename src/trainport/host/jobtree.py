"""Reading a job's tree without following the links its job made.

Whatever the platform reads or copies out of a host's ``/opt/ml`` tree (the failure file,
checkpoints, the model and output folders) may have been replaced by the job with a
symbolic link to a host file, which the platform, outside the sandbox and often as root,
would otherwise follow. Every path here is opened one component at a time with
``O_NOFOLLOW``, from ``/``: trainport's own folders are real paths (``TRAINPORT_HOME`` is
resolved when settings are read), so a link anywhere on the way was made by a job.

What is opened is then used through its descriptor (``/proc/self/fd/N`` names the opened
object itself), so a link swapped in after the check changes nothing. Links *inside* a
folder that is archived stay links in the archive, as they always were: nothing follows
them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["fd_path", "open_folder", "open_nofollow", "read_text"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_nofollow(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path`` opened with ``flags``; ``OSError`` (ELOOP, ENOTDIR) if any
    component is a symbolic link. The last component is opened non-blocking, so a FIFO
    put where a file was expected cannot hang the caller."""
    parts = Path(os.path.abspath(path)).parts
    fd = os.open("/", _DIR)
    try:
        for part in parts[1:-1]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        last = parts[-1] if len(parts) > 1 else "."
        return os.open(last, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def fd_path(fd: int) -> Path:
    """A path that names the open object ``fd`` itself, whatever its name is now."""
    return Path(f"/proc/self/fd/{fd}")


@contextlib.contextmanager
def open_folder(path: Path) -> Iterator[Path | None]:
    """``path`` as a folder reached without links, named by its descriptor; None if it is
    missing, a link, or not a folder."""
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield None
        return
    try:
        yield fd_path(fd)
    finally:
        os.close(fd)


def read_text(path: Path, limit: int) -> str | None:
    """The first ``limit`` characters of the regular file ``path``; None if it is missing,
    reached through a link, or not a regular file."""
    try:
        fd = open_nofollow(path)
    except OSError:
        return None
    with open(fd, "rb", closefd=True) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read(limit * 4).decode("utf-8", errors="replace")[:limit]
