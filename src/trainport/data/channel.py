"""Where a channel's bytes come from: a Pipe FIFO series, a directory of files, or S3.

Two shapes of source, because they differ in what a reader may do:

- :class:`ListedChannel` (:class:`FileChannel`, and :class:`~trainport.data.s3.S3Channel`):
  a fixed list of objects, any of which any reader can open at any byte offset. Sharding
  deals objects or records; a checkpoint stores (object, offset) and resumes by seeking.
- :class:`PipeChannel`: FIFOs ``<dir>/<channel>_<epoch>`` that a producer creates one at a
  time (epoch ``k+1`` only once epoch ``k`` was consumed or closed), each readable once by
  one process. Optionally ``P`` per-worker series ``<dir>/<channel>_w<k>_<epoch>``, each a
  disjoint shard (see :mod:`trainport.data.sharding` for who reads which).

Both produce plain byte streams; :mod:`trainport.data.dataset` parses records out of them.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import io
import logging
import os
import re
import stat
import termios
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainport.data.errors import ChannelWaitTimeout, DataError

__all__ = [
    "PIPE_WORKERS_ENV",
    "ChannelObject",
    "FileChannel",
    "ListedChannel",
    "ObjectStream",
    "PipeChannel",
]

logger = logging.getLogger(__name__)

#: Environment variable through which the platform says how many per-worker FIFO series each
#: Pipe channel has (0 or unset: the single series ``<channel>_<epoch>``).
PIPE_WORKERS_ENV = "TRAINPORT_PIPE_WORKERS"

# Linux fcntl command to resize a pipe's buffer; Python exposes it only from 3.10 on Linux.
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PIPE_BUFFER = 1 << 20


class _FifoFile(io.FileIO):
    """A FIFO opened for reading whose ``read(n)`` asks the kernel for no more than the pipe
    holds (FIONREAD) when that is less than ``n``.

    Why: ``read(n)`` allocates ``n`` bytes and, when a pipe returns fewer, shrinks the
    object; for 1 MiB reads that is a realloc of a large block on nearly every read (a FIFO
    often holds a little less than its 1 MiB buffer). Measured with 64 KiB TFRecords, this
    alone made a Pipe channel read at 0.44x the speed of the same files on disk; asking for
    what is there made it 0.9x (benchmarks/pipe_tfrecord_reader.py).
    """

    def read(self, size: int | None = -1, /) -> bytes:
        if size is not None and size > 0:
            avail = array.array("i", [0])
            try:
                fcntl.ioctl(self.fileno(), termios.FIONREAD, avail, True)
            except OSError:  # not a pipe after all: read as asked
                avail[0] = 0
            if 0 < avail[0] < size:
                size = avail[0]
        data = super().read(size)
        return b"" if data is None else data


class ObjectStream(Protocol):
    """An open object: readable like a raw file, closed when the reader is done with it."""

    def read(self, size: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ChannelObject:
    """One object of a listed channel: its key relative to the channel root, and its size."""

    name: str
    size: int


class ListedChannel(ABC):
    """A channel whose objects can be listed up front and opened at any offset."""

    @abstractmethod
    def describe(self, obj: ChannelObject | None = None) -> str:
        """The channel (or one of its objects) as a path or URI, for messages."""

    @abstractmethod
    def list_objects(self) -> list[ChannelObject]:
        """Every object of the channel, sorted by name."""

    @abstractmethod
    def open_object(self, obj: ChannelObject, offset: int = 0) -> ObjectStream:
        """Open ``obj`` for reading from byte ``offset``."""


class FileChannel(ListedChannel):
    """A directory (searched recursively) or a single file: File and FastFile mode channels."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def describe(self, obj: ChannelObject | None = None) -> str:
        return (
            str(self.root / obj.name) if obj is not None and self.root.is_dir() else str(self.root)
        )

    def list_objects(self) -> list[ChannelObject]:
        if self.root.is_file():
            return [ChannelObject(self.root.name, self.root.stat().st_size)]
        if not self.root.is_dir():
            raise DataError(f"channel path {self.root} is neither a directory nor a file")
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            for filename in files:
                path = Path(dirpath) / filename
                found.append(
                    ChannelObject(path.relative_to(self.root).as_posix(), path.stat().st_size)
                )
        return sorted(found, key=lambda o: o.name)

    def open_object(self, obj: ChannelObject, offset: int = 0) -> ObjectStream:
        path = self.root / obj.name if self.root.is_dir() else self.root
        try:
            raw = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the dataset
        except OSError as exc:
            raise DataError(f"cannot open {path}: {exc}") from exc
        if offset:
            raw.seek(offset)
        return raw


class PipeChannel:
    """The FIFO series of one Pipe-mode channel.

    ``pipes`` is the number of per-worker series; ``None`` means: take it from the
    ``TRAINPORT_PIPE_WORKERS`` environment variable when set, else look at which FIFOs the
    first epoch has (the producer creates all of epoch 0's before the training code starts).
    The wait for a FIFO backs off exponentially from ``poll_initial`` to ``poll_max``
    seconds and gives up after ``wait_timeout`` seconds (``None``: never).
    """

    def __init__(
        self,
        channel: str,
        directory: str | os.PathLike[str] = "/opt/ml/input/data",
        *,
        pipes: int | None = None,
        wait_timeout: float | None = None,
        poll_initial: float = 0.005,
        poll_max: float = 1.0,
    ) -> None:
        if not channel or "/" in channel:
            raise DataError(f"invalid channel name {channel!r}")
        self.channel = channel
        self.directory = Path(directory)
        self.wait_timeout = wait_timeout
        self.poll_initial = poll_initial
        self.poll_max = poll_max
        self._pipes = pipes
        if pipes is None and not os.environ.get(PIPE_WORKERS_ENV):
            # Epoch 0's FIFOs exist before training code starts, so looking now (in the
            # process that builds the dataset) settles the layout before DataLoader workers
            # fork, and they need not race each other for it.
            self._pipes = self._probe_series()

    def describe(self) -> str:
        return f"Pipe channel {self.channel!r} in {self.directory}"

    def fifo_path(self, epoch: int, series: int | None = None) -> Path:
        name = f"{self.channel}_{epoch}" if series is None else f"{self.channel}_w{series}_{epoch}"
        return self.directory / name

    def num_series(self, epoch: int) -> int:
        """How many per-worker series the channel has (0: one shared series)."""
        if self._pipes is None:
            raw = os.environ.get(PIPE_WORKERS_ENV, "")
            if raw:
                try:
                    self._pipes = int(raw)
                except ValueError:
                    raise DataError(f"{PIPE_WORKERS_ENV}={raw!r} is not an integer") from None
            else:
                self._pipes = self._detect(epoch)
        return self._pipes

    def _probe_series(self) -> int | None:
        """0 if a shared FIFO of any epoch exists, P if per-worker ones do, else None.

        Any epoch counts, not only the one about to be read: another reader of the shared
        series may already have consumed (and the producer removed) the epoch's FIFO.
        """
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return None
        shared = re.compile(rf"{re.escape(self.channel)}_\d+")
        per_worker = re.compile(rf"{re.escape(self.channel)}_w(\d+)_\d+")
        series = set()
        for name in names:
            if shared.fullmatch(name):
                return 0
            if m := per_worker.fullmatch(name):
                series.add(int(m.group(1)))
        return max(series) + 1 if series else None

    def _detect(self, epoch: int) -> int:
        found = self._wait(self._probe_series, f"{self.fifo_path(epoch)} (or per-worker FIFOs)")
        if found:
            logger.info("%s has %d per-worker FIFO series", self.describe(), found)
        return found

    def _wait(self, probe: Callable[[], int | None], what: str) -> int:
        delay = self.poll_initial
        began = time.monotonic()
        told = False
        while True:
            found = probe()
            if found is not None:
                return found
            waited = time.monotonic() - began
            if self.wait_timeout is not None and waited >= self.wait_timeout:
                raise ChannelWaitTimeout(
                    f"{what} did not appear within {self.wait_timeout:g} s; is the producer of "
                    f"{self.describe()} running?"
                )
            if not told and waited > 10:
                logger.info("still waiting for %s after %.0f s", what, waited)
                told = True
            time.sleep(delay)
            delay = min(delay * 2, self.poll_max)

    def wait_for(self, path: Path) -> None:
        """Block (with backoff) until ``path`` exists as a FIFO."""

        def probe() -> int | None:
            try:
                mode = path.stat().st_mode
            except FileNotFoundError:
                return None
            if not stat.S_ISFIFO(mode):
                raise DataError(f"{path} exists but is not a FIFO; is the channel in Pipe mode?")
            return 1

        self._wait(probe, str(path))

    def open_fifo(self, path: Path) -> ObjectStream:
        """Wait for ``path``, then open it for reading (which blocks until its writer opens)."""
        self.wait_for(path)
        try:
            raw = _FifoFile(path, "rb")
        except OSError as exc:
            raise DataError(f"cannot open FIFO {path}: {exc}") from exc
        # A larger pipe buffer means fewer context switches between producer and reader;
        # above /proc/sys/fs/pipe-max-size (unprivileged users) the default stays.
        with contextlib.suppress(OSError):
            fcntl.fcntl(raw.fileno(), _F_SETPIPE_SZ, _PIPE_BUFFER)
        return raw
