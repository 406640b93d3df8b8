"""Shared machinery of the framed record formats: a buffered byte stream and a corruption policy.

:class:`ByteStream` turns any object with ``read(n)`` (a FIFO, a file, an S3 response body)
into a buffer that the TFRecord and RecordIO parsers inspect in place with
``struct.unpack_from``: one large read feeds many small records, which is what makes the
parsers fast on 1 KiB records, and the absolute byte offset is always known so errors and
checkpoints can name it.

:class:`CorruptionPolicy` decides what a corrupt record does: raise (the default), or be
logged and skipped while a configured count is not yet used up.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from trainport.data.errors import CorruptRecordError

__all__ = ["ByteStream", "CorruptionPolicy", "Readable"]

logger = logging.getLogger(__name__)

DEFAULT_CHUNK = 1 << 20
# One read asks for at most this much, so "read to the end" does not allocate 2**62 bytes.
_MAX_READ = 1 << 26


class Readable(Protocol):
    """What a record parser needs from its input: ``read(n)``, returning ``b""`` at the end."""

    def read(self, size: int = ..., /) -> bytes: ...


class ByteStream:
    """A read buffer over ``raw`` that tracks the absolute offset of its read position.

    ``buf[pos:]`` holds the bytes not yet consumed; :meth:`ensure` tops the buffer up and
    :meth:`advance` consumes. ``offset`` is where ``buf[pos]`` lies in the source, starting at
    ``start`` (non-zero when a reader resumes from a checkpointed position).
    """

    __slots__ = ("_base", "_eof", "_raw", "buf", "chunk", "pos", "read_hint", "source", "waited")

    def __init__(
        self, raw: Readable, *, source: str, start: int = 0, chunk_size: int = DEFAULT_CHUNK
    ) -> None:
        self._raw = raw
        self.chunk = chunk_size
        #: how much :meth:`ensure` reads at least; a parser lowers it to the header size while
        #: records are large, so their data is read straight into the record by :meth:`take`.
        self.read_hint = chunk_size
        self._base = start
        self._eof = False
        self.buf = b""
        self.pos = 0
        self.source = source
        #: seconds spent blocked in ``raw.read``: the input stall a throughput meter reports.
        self.waited = 0.0

    @property
    def offset(self) -> int:
        return self._base + self.pos

    def ensure(self, n: int) -> int:
        """Make ``n`` unread bytes available if the source has them; return how many are."""
        avail = len(self.buf) - self.pos
        if avail >= n or self._eof:
            return avail
        parts = [self.buf[self.pos :]] if avail else []
        self._base += self.pos
        self.pos = 0
        have = avail
        # Large records are read whole in as few calls as possible; small ones a chunk at a
        # time so one read serves many records. FIFOs and sockets return short reads, so loop.
        while have < n:
            t0 = time.perf_counter()
            data = self._raw.read(max(self.read_hint, min(n - have, _MAX_READ)))
            self.waited += time.perf_counter() - t0
            if not data:
                self._eof = True
                break
            parts.append(data)
            have += len(data)
        self.buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return have

    def advance(self, n: int) -> None:
        self.pos += n

    def take(self, n: int) -> bytes:
        """Consume and return the next ``n`` bytes (fewer only at the end of the source).

        What the buffer lacks is read straight from the source, so a large record costs one
        copy from the kernel rather than a buffer fill and a slice.
        """
        avail = len(self.buf) - self.pos
        if n <= avail:
            data = self.buf[self.pos : self.pos + n]
            self.pos += n
            return data
        parts = [self.buf[self.pos :]] if avail else []
        have = avail
        while have < n and not self._eof:
            t0 = time.perf_counter()
            data = self._raw.read(min(n - have, _MAX_READ))
            self.waited += time.perf_counter() - t0
            if not data:
                self._eof = True
                break
            parts.append(data)
            have += len(data)
        self._base += len(self.buf) + have - avail
        self.buf = b""
        self.pos = 0
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)


class CorruptionPolicy:
    """Raise on a corrupt record, or skip up to ``max_corrupt`` of them (counted over its life).

    One policy is shared by every file a dataset reads in this process, so the budget bounds
    the total damage a job tolerates rather than the damage per file.
    """

    def __init__(self, max_corrupt: int = 0) -> None:
        if max_corrupt < 0:
            raise ValueError(f"max_corrupt must be >= 0, got {max_corrupt}")
        self.max_corrupt = max_corrupt
        self.skipped = 0

    def handle(self, error: CorruptRecordError) -> None:
        """Raise ``error`` unless the skip budget allows one more; then log and count it."""
        if self.skipped >= self.max_corrupt:
            raise error
        self.skipped += 1
        logger.warning(
            "skipping corrupt record (%d of at most %d): %s", self.skipped, self.max_corrupt, error
        )
