"""A full disk under a job: telling it, making room, and saying where.

Everything a job writes on this machine (staged channels, its model, logs, the job database)
lives on the filesystem of TRAINPORT_HOME. When that fills, every write fails, the job
database's included: SQLite needs room for its write-ahead log even to read. A job must
still end Failed with a reason that says so, so each host claims a small reserve file
before it stages anything. When the host ends on a full disk it removes what it staged
(copies of stored objects, worth nothing once training is over) and its reserve, which
leaves room to record the outcome and to pack what the job made.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trainport.host import jobtree

__all__ = ["RESERVE_BYTES", "Reserve", "is_full", "make_room"]

log = logging.getLogger(__name__)

#: What each host holds back: enough for the job database to record the end.
RESERVE_BYTES = 1 << 20
# Below this much free space the disk counts as full: less than a SQLite connection needs
# (32 KiB of WAL index and some pages of log).
_FULL_BELOW = 256 << 10


def is_full(path: Path) -> bool:
    """Whether the filesystem holding ``path`` has (next to) no space left."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < _FULL_BELOW


class Reserve:
    """A file of :data:`RESERVE_BYTES` held while a host runs, released when room is needed."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size

    def claim(self) -> None:
        """Write the reserve; raises OSError (ENOSPC) when there is no room even for it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # Written, not fallocated: every filesystem then really holds the blocks.
            os.write(fd, b"\0" * self.size)
        except OSError:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def make_room(data_dir: Path) -> int:
    """Remove the staged channels under ``data_dir`` (not mount points: an unmounted view
    leaves an empty folder); returns how many entries went.

    The folder is the job's: it may have put links there, or a link in its place, to a
    folder of the machine's. It is reached and emptied without following any (see
    :func:`jobtree.remove_at`), so only what lies in the job's own tree goes."""
    try:
        fd = jobtree.open_nofollow(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return 0  # missing, or a link where the folder was
    removed = 0
    try:
        for name in os.listdir(fd):
            if jobtree.remove_at(fd, name):
                removed += 1
    finally:
        os.close(fd)
    log.info("removed %d staged inputs under %s to make room", removed, data_dir)
    return removed
