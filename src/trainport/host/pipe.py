"""Pipe mode: each channel streamed from the object store through a series of FIFOs.

A Pipe channel ``train`` appears in the host's data directory (``/opt/ml/input/data``) as
the FIFO ``train_0``; once the training code has read it to EOF, or closed it early, the
FIFO is removed and ``train_1`` appears, and so on until the training process exits. Nothing
is staged on disk: bytes go from the store through a bounded read-ahead window straight
into the pipe.

Pieces and how they fit:

- :func:`epoch_items` decides (purely) which objects or augmented-manifest lines an epoch
  of one FIFO series carries, and in what order: ShuffleConfig order from
  :func:`~trainport.host.channels.object_order` (a function of seed, epoch and the object
  list), then the host's ShardedByS3Key share, then the worker's share.
- :class:`_ReadAhead` fetches an epoch's pieces (byte ranges of at most ``part_size``) on a
  thread pool, in order, holding at most ``read_ahead`` bytes; it starts while the series
  waits for its reader, so the first read finds data ready.
- :class:`_FifoSeries` is one series' writer thread: mkfifo, wait for the reader, write
  (gunzipping and RecordIO-framing on the way), close, next epoch. A reader that closes
  early gives EPIPE, which ends that epoch and nothing else.
- Where every object of an epoch is a plain file on this machine (the embedded store) and
  nothing transforms the bytes (no Gzip, no RecordIO, no augmented manifest), the series
  skips the read-ahead and splices the files into the FIFO in the kernel
  (:mod:`trainport.host.splice`): the bytes never pass through Python's memory, and the FIFO
  runs at the pipe's own speed. Order, sharding, epochs and early close are the same.
- :class:`PipeChannelServer` holds a channel's series; :func:`serve_channel` resolves a
  channel and starts one. Channels are independent (a series per thread), with no limit on
  how many a job has.

Per-worker pipes (tag ``trainport:pipe-workers`` = P): instead of one series, each channel
gets P series ``<channel>_w<k>_<epoch>`` for k in 0..P-1. In every epoch worker k gets the
k-th, (k+P)-th, ... object of the host's (shuffled, sharded) list: disjoint, together the
whole host share, balanced to within one object. Each local worker process (one per GPU)
reads its own series, so none shares a FIFO with another (the shared-FIFO deadlock cannot
happen). The training process sees ``TRAINPORT_PIPE_WORKERS=P``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import signal
import stat
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from trainport.errors import JobError, TrainportError
from trainport.host import jobtree
from trainport.host.channels import (
    ChannelObject,
    ManifestLine,
    object_order,
    resolve_augmented_manifest,
    resolve_channel,
    shard,
)
from trainport.host.recordio_frame import frame_record
from trainport.host.splice import advise_ahead, splice_file
from trainport.spec import ChannelSpec
from trainport.store.api import ObjectStore, S3Uri

__all__ = [
    "PipeChannelServer",
    "PipeOptions",
    "epoch_items",
    "fifo_name",
    "input_data_config",
    "resolve_items",
    "serve_channel",
]

log = logging.getLogger(__name__)

Item = ChannelObject | ManifestLine
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


@dataclass(frozen=True)
class PipeOptions:
    fetchers: int = 8  # parallel fetches per FIFO series
    part_size: int = 8 << 20  # one fetch reads at most this many bytes of an object
    read_ahead: int = 64 << 20  # bytes fetched but not yet written, per series
    max_pieces: int = 512  # pieces in flight per series (many tiny objects)
    pipe_buffer: int = 1 << 20  # wanted pipe capacity (capped by fs.pipe-max-size)
    splice: bool = True  # splice local files into the FIFO where nothing transforms them


def fifo_name(channel: str, epoch: int, worker: int | None = None) -> str:
    """``<channel>_<epoch>``, or ``<channel>_w<worker>_<epoch>`` for per-worker series."""
    return f"{channel}_{epoch}" if worker is None else f"{channel}_w{worker}_{epoch}"


def input_data_config(
    channels: Sequence[ChannelSpec], workers: int | None
) -> dict[str, dict[str, str]]:
    """``inputdataconfig.json``: every channel's entry and, with per-worker pipes, each Pipe
    channel's worker series under its own name (``train_w0``, ...), so that a reader which
    looks its channel up there (PipeModeDataset) accepts it and reads its FIFOs."""
    config = {c.name: c.input_data_config_entry() for c in channels}
    for channel in channels:
        if channel.input_mode == "Pipe" and workers:
            entry = channel.input_data_config_entry()
            config.update({f"{channel.name}_w{k}": dict(entry) for k in range(workers)})
    return config


def epoch_items(
    items: Sequence[Item],
    channel: ChannelSpec,
    epoch: int,
    *,
    host_index: int = 0,
    host_count: int = 1,
    worker: int | None = None,
    workers: int | None = None,
) -> list[Item]:
    """What one series carries in ``epoch``, in order (a pure function of its arguments)."""
    ordered = object_order(items, channel.shuffle_seed, epoch)
    mine = shard(ordered, channel.distribution, host_index, host_count)
    if worker is not None and workers:
        mine = shard(mine, "ShardedByS3Key", worker, workers)
    return mine


# -- fetching -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    label: str  # names the object or attribute in errors
    fetch: Callable[[], bytes]
    nbytes: int  # expected size (an estimate for -ref objects)
    first: bool  # first piece of its record
    last: bool  # last piece of its record
    inline: bool = False  # a manifest value, never gunzipped


def _empty() -> bytes:
    return b""


def _inline(data: bytes) -> bytes:
    return data


def _pieces(store: ObjectStore, items: Sequence[Item], part: int) -> Iterator[_Piece]:
    for item in items:
        if isinstance(item, ChannelObject):
            label = f"s3://{item.bucket}/{item.key}"
            if item.size == 0:
                yield _Piece(label, _empty, 0, True, True)
                continue
            for start in range(0, item.size, part):
                end = min(start + part, item.size)
                fetch = partial(store.read_range, item.bucket, item.key, start, end)
                yield _Piece(label, fetch, end - start, start == 0, end == item.size)
            continue
        for attribute, value in item.records:
            label = f"{item.manifest} line {item.line_no} attribute {attribute!r}"
            if isinstance(value, S3Uri):
                fetch = partial(store.get_bytes, value.bucket, value.key)
                yield _Piece(f"{label} ({value})", fetch, part, True, True)
            else:
                yield _Piece(label, partial(_inline, value), len(value), True, True, inline=True)


class _ReadAhead:
    """An epoch's pieces fetched in parallel and handed out in order, within a budget."""

    def __init__(self, pieces: Iterator[_Piece], pool: ThreadPoolExecutor, opts: PipeOptions):
        self._pieces = pieces
        self._pool = pool
        self._opts = opts
        self._window: deque[tuple[_Piece, Future[bytes]]] = deque()
        self._inflight = 0
        self._exhausted = False

    def fill(self) -> None:
        while not self._exhausted and (
            not self._window
            or (
                self._inflight < self._opts.read_ahead and len(self._window) < self._opts.max_pieces
            )
        ):
            piece = next(self._pieces, None)
            if piece is None:
                self._exhausted = True
                return
            self._window.append((piece, self._pool.submit(piece.fetch)))
            self._inflight += piece.nbytes

    def __iter__(self) -> Iterator[tuple[_Piece, bytes]]:
        while True:
            self.fill()
            if not self._window:
                return
            piece, future = self._window.popleft()
            data = future.result()
            self._inflight -= piece.nbytes
            yield piece, data

    def cancel(self) -> None:
        for _, future in self._window:
            future.cancel()
        self._window.clear()


class _Gunzip:
    """Streaming gzip decompression that also reads concatenated gzip members."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._d = zlib.decompressobj(31)
        self._mid_member = False  # bytes of a member seen, its end not yet

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            while data:
                self._mid_member = True
                out = self._d.decompress(data, 8 << 20)
                if out:
                    yield out
                if self._d.eof:
                    data = self._d.unused_data
                    self._d = zlib.decompressobj(31)
                    self._mid_member = False
                else:
                    data = self._d.unconsumed_tail
        except zlib.error as exc:
            raise JobError(f"{self.label} is not valid gzip: {exc}") from exc

    def finish(self) -> None:
        if self._mid_member:
            raise JobError(f"{self.label}: its gzip stream ends early (truncated object?)")


@dataclass(frozen=True)
class _LocalFile:
    label: str
    path: Path
    size: int


def _local_files(
    store: ObjectStore, channel: ChannelSpec, items: Sequence[Item]
) -> list[_LocalFile] | None:
    """The epoch's objects as local files to splice, or None where the bytes must go
    through user space (a remote store, gunzipping, RecordIO framing, manifest values)."""
    if channel.compression == "Gzip" or channel.record_wrapper == "RecordIO":
        return None
    files = []
    for item in items:
        if not isinstance(item, ChannelObject):
            return None
        path = store.local_path(item.bucket, item.key)
        if path is None:
            return None
        files.append(_LocalFile(f"s3://{item.bucket}/{item.key}", path, item.size))
    return files


def _files_within(files: Sequence[_LocalFile], budget: int, most: int = 64) -> list[Path]:
    """The leading files whose sizes fit in ``budget`` bytes (at least one, at most ``most``:
    each costs an open and an fadvise, and a channel of many tiny files must not spend the
    reader's time on them)."""
    chosen: list[Path] = []
    total = 0
    for f in files:
        if chosen and (total + f.size > budget or len(chosen) >= most):
            break
        chosen.append(f.path)
        total += f.size
    return chosen


# -- one FIFO series ------------------------------------------------------------------------


def _pipe_max() -> int:
    try:
        return int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        return 1 << 20


def _enlarge_pipe(fd: int, want: int) -> None:
    for size in (want, min(want, _pipe_max())):
        try:
            fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
            return
        except OSError:
            continue


Buffers = Sequence[bytes | memoryview]
_IOV_MAX = 1024  # buffers per writev (the kernel's UIO_MAXIOV)


def _write_all(fd: int, buffers: Buffers) -> int:
    """Write ``buffers`` in order with as few calls as the pipe allows (writev, so a RecordIO
    header and its payload go in one call without joining them); returns the bytes written."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    total = sum(len(v) for v in views)
    first = 0
    while first < len(views):
        written = os.writev(fd, views[first : first + _IOV_MAX])
        while first < len(views) and written >= len(views[first]):
            written -= len(views[first])
            first += 1
        if written:
            views[first] = views[first][written:]
    return total


class _FifoSeries:
    """One FIFO series ``<name>_0, <name>_1, ...`` and the thread that writes it."""

    def __init__(
        self,
        server: PipeChannelServer,
        worker: int | None,
    ) -> None:
        self.server = server
        self.worker = worker
        self.epoch = 0
        self.thread = threading.Thread(
            target=self._run, name=f"pipe-{server.channel.name}-{worker or 0}", daemon=True
        )
        self._current: Path | None = None

    def path(self, epoch: int) -> Path:
        return self.server.data_dir / fifo_name(self.server.channel.name, epoch, self.worker)

    def make_fifo(self, epoch: int) -> Path:
        # Every FIFO operation goes through the data folder's descriptor, opened before
        # the job started: the job cannot swap a link in for the folder or a FIFO and have
        # the platform write into, or remove, a host file.
        path, folder = self.path(epoch), self.server.folder_fd
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISFIFO(os.stat(path.name, dir_fd=folder, follow_symlinks=False).st_mode):
                os.unlink(path.name, dir_fd=folder)  # a leftover of an earlier run
        os.mkfifo(path.name, 0o644, dir_fd=folder)
        self._current = path
        return path

    def release(self) -> None:
        """Unblock a writer waiting in open() for a reader that will never come."""
        path = self._current
        if path is None:
            return
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW
        try:
            fd = os.open(path.name, flags, dir_fd=self.server.folder_fd)
        except OSError:
            return
        os.close(fd)

    def _run(self) -> None:
        server = self.server
        # A reader that closes early must give EPIPE, never a process-killing SIGPIPE, even
        # where something reset SIGPIPE to its default (libfuse does on unmount): blocked in
        # this thread, the signal stays pending here and write() returns EPIPE.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        pool = ThreadPoolExecutor(server.opts.fetchers, thread_name_prefix="pipe-fetch")
        try:
            while not server.stopping.is_set():
                path = self._current if self._current else self.make_fifo(self.epoch)
                try:
                    self._serve_epoch(path, pool)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path.name, dir_fd=server.folder_fd)
                    self._current = None
                self.epoch += 1
        except TrainportError as exc:
            server.failed(f"{exc}")
        except Exception as exc:  # a bug must not leave the trainer waiting forever
            log.exception("pipe channel %s failed", server.channel.name)
            server.failed(f"{type(exc).__name__}: {exc}")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _serve_epoch(self, path: Path, pool: ThreadPoolExecutor) -> None:
        server, opts = self.server, self.server.opts
        items = epoch_items(
            server.items,
            server.channel,
            self.epoch,
            host_index=server.host_index,
            host_count=server.host_count,
            worker=self.worker,
            workers=server.workers,
        )
        files = _local_files(server.store, server.channel, items) if opts.splice else None
        ahead = _ReadAhead(_pieces(server.store, items, opts.part_size), pool, opts)  # lazy
        if files is None:
            ahead.fill()  # fetch while we wait for the reader
        else:
            advise_ahead(_files_within(files, opts.read_ahead))  # the same, from the disk
        # Blocks until the training code opens the FIFO.
        fd = os.open(path.name, os.O_WRONLY | os.O_NOFOLLOW, dir_fd=server.folder_fd)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise JobError(f"{path.name} is no longer a FIFO: the job replaced it")
        began, sent = time.monotonic(), 0
        try:
            if server.stopping.is_set():
                return
            _enlarge_pipe(fd, opts.pipe_buffer)
            if files is None:
                for buffers in self._stream(ahead):
                    sent += _write_all(fd, buffers)
            else:
                # No fadvise per object here: on a warm page cache it cost a fifth of the
                # throughput (measured); the kernel's own read-ahead follows a splice.
                for local in files:
                    sent += splice_file(fd, local.path, local.size, local.label)
            log.info(
                "channel %s: %s complete, %.1f MiB of %d objects/records in %.2f s%s",
                server.channel.name,
                path.name,
                sent / (1 << 20),
                len(items),
                time.monotonic() - began,
                "" if files is None else " (spliced)",
            )
        except BrokenPipeError:
            log.info(
                "channel %s: reader closed %s early after %.1f MiB; epoch ended",
                server.channel.name,
                path.name,
                sent / (1 << 20),
            )
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
        finally:
            ahead.cancel()
            os.close(fd)

    def _stream(self, ahead: _ReadAhead) -> Iterator[Buffers]:
        """The bytes of an epoch, as large writes: gunzipped and framed as configured."""
        channel = self.server.channel
        gzip = channel.compression == "Gzip"
        recordio = channel.record_wrapper == "RecordIO"
        gunzip: _Gunzip | None = None
        record: list[bytes] = []
        for piece, data in ahead:
            if gzip and not piece.inline:
                if piece.first:
                    gunzip = _Gunzip(piece.label)
                assert gunzip is not None
                out: list[bytes] = list(gunzip.feed(data))
                if piece.last:
                    gunzip.finish()
            else:
                out = [data]
            if not recordio:
                yield out
                continue
            record += out
            if piece.last:
                payload = record[0] if len(record) == 1 else b"".join(record)
                record = []
                try:
                    yield frame_record(payload, what=piece.label)
                except ValueError as exc:
                    raise JobError(str(exc)) from exc


# -- a channel -------------------------------------------------------------------------------


class PipeChannelServer:
    """Every FIFO series of one Pipe-mode channel; :meth:`start` before the training process
    starts (epoch 0's FIFOs exist when it returns), :meth:`close` after it exits."""

    def __init__(
        self,
        store: ObjectStore,
        channel: ChannelSpec,
        items: Sequence[Item],
        data_dir: Path,
        *,
        host_index: int = 0,
        host_count: int = 1,
        workers: int | None = None,
        opts: PipeOptions | None = None,
        on_error: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.store = store
        self.channel = channel
        self.items = list(items)
        self.data_dir = data_dir
        self.host_index = host_index
        self.host_count = host_count
        self.workers = workers
        self.opts = opts or PipeOptions()
        self.on_error = on_error
        self.stopping = threading.Event()
        self.error: str | None = None
        ids: list[int | None] = list(range(workers)) if workers else [None]
        self.series = [_FifoSeries(self, w) for w in ids]
        self.folder_fd = -1

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.folder_fd = jobtree.open_nofollow(self.data_dir, os.O_RDONLY | os.O_DIRECTORY)
        for series in self.series:
            series.make_fifo(0)
        for series in self.series:
            series.thread.start()
        log.info(
            "channel %s: Pipe mode, %d FIFO series, %d objects/lines",
            self.channel.name,
            len(self.series),
            len(self.items),
        )

    def failed(self, message: str) -> None:
        text = f"channel {self.channel.name!r} (Pipe mode): {message}"
        log.error("%s", text)
        if self.error is None:
            self.error = text
            self.on_error(text)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving: no further epochs; FIFOs removed."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for series in self.series:
            while series.thread.is_alive() and time.monotonic() < deadline:
                series.release()
                series.thread.join(0.05)
            if series.thread.is_alive():
                log.warning(
                    "channel %s: a FIFO writer is still blocked (a process outside the job "
                    "holds %s?)",
                    self.channel.name,
                    series.path(series.epoch),
                )
        folder = self.folder_fd
        for series in self.series:
            for epoch in (series.epoch, series.epoch + 1):
                name = series.path(epoch).name
                with contextlib.suppress(OSError):
                    if stat.S_ISFIFO(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=folder)
        if folder >= 0 and not any(series.thread.is_alive() for series in self.series):
            os.close(folder)  # a writer still blocked keeps using it
            self.folder_fd = -1


def resolve_items(store: ObjectStore, channel: ChannelSpec) -> list[Item]:
    if channel.s3_data_type == "AugmentedManifestFile":
        return list(resolve_augmented_manifest(store, channel))
    return list(resolve_channel(store, channel))


def serve_channel(
    store: ObjectStore,
    channel: ChannelSpec,
    data_dir: Path,
    *,
    host_index: int = 0,
    host_count: int = 1,
    workers: int | None = None,
    opts: PipeOptions | None = None,
    on_error: Callable[[str], None] = lambda message: None,
) -> PipeChannelServer:
    """Resolve a Pipe channel (validation errors raise here, before training) and start
    serving its FIFOs."""
    server = PipeChannelServer(
        store,
        channel,
        resolve_items(store, channel),
        data_dir,
        host_index=host_index,
        host_count=host_count,
        workers=workers,
        opts=opts,
        on_error=on_error,
    )
    server.start()
    return server
