"""Moving stored files into a Pipe-mode FIFO in the kernel.

Where the store keeps an object as a plain file on this machine (the embedded store does),
Pipe mode need not read it into Python's memory and write it out again: ``splice(2)`` from
the file into the FIFO hands the page-cache pages to the pipe, so the only copy left is the
reader's own ``read()``. This is what makes a FIFO fed from the local store run at the
pipe's speed rather than at the speed of two user-space copies and a thread handoff.

- :func:`splice_file` moves one object (its listed size, or less if the file is shorter,
  as a ranged read of a shorter file would give) and falls back to ``read``/``write`` on a
  filesystem that cannot splice (some FUSE and network filesystems return EINVAL).
- :func:`advise_ahead` asks the kernel to start reading the first files of an epoch, so a
  cold page cache fills while the FIFO waits for its reader (as the read-ahead fetches do
  for a remote store). Not per object while streaming: on a warm cache that cost about a
  fifth of the throughput, and the kernel's own read-ahead follows a sequential splice.

A reader that closes the FIFO early makes ``splice`` fail with EPIPE, as ``write`` does;
the caller (the series' writer thread, with SIGPIPE blocked) ends the epoch on it.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from trainport.errors import StoreError

__all__ = ["advise_ahead", "splice_file"]

log = logging.getLogger(__name__)

# One call moves at most what the pipe has room for (1 MiB with the enlarged buffer); asking
# for more costs nothing and saves calls where the reader drains faster than we refill.
_SPLICE_CHUNK = 16 << 20
# errno values meaning "this file cannot be spliced", not "this transfer failed".
_CANNOT_SPLICE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}
_FALLBACK_BLOCK = 1 << 20


def _open(path: Path, label: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise StoreError(f"{label} does not exist (no file {path})") from exc
    except IsADirectoryError as exc:
        raise StoreError(f"{label} is a folder ({path}), not an object") from exc


def splice_file(fifo: int, path: Path, size: int, label: str) -> int:
    """Send up to ``size`` bytes of the file ``path`` into the pipe ``fifo``; returns the
    bytes sent. ``label`` names the object in errors. EPIPE is raised as
    :class:`BrokenPipeError`, as from ``os.write``."""
    src = _open(path, label)
    sent = 0
    try:
        while sent < size:
            try:
                # No flags: SPLICE_F_MOVE is a no-op since Linux 2.6.21 and SPLICE_F_MORE a
                # hint for sockets; neither changed the measured rate.
                n = os.splice(src, fifo, min(size - sent, _SPLICE_CHUNK))
            except OSError as exc:
                if exc.errno not in _CANNOT_SPLICE:
                    raise
                log.debug("%s: splice refused (%s); copying through memory", path, exc)
                return sent + _copy(src, fifo, sent, size - sent)
            if n == 0:  # the file is shorter than listed
                break
            sent += n
        return sent
    finally:
        os.close(src)


def _copy(src: int, fifo: int, offset: int, count: int) -> int:
    done = 0
    while done < count:
        block = os.pread(src, min(_FALLBACK_BLOCK, count - done), offset + done)
        if not block:
            break
        view = memoryview(block)
        while view:
            view = view[os.write(fifo, view) :]
        done += len(block)
    return done


def advise_ahead(paths: list[Path]) -> None:
    """Start reading ``paths`` into the page cache in the background (best effort)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # the splice itself reports a missing object
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
