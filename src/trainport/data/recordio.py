"""MXNet RecordIO framing: a reader, a writer and a one-record encoder.

Each part is ``u32le magic 0xced7230a | u32le (cflag << 29 | length) | data | zero pad to 4``.
The magic must never appear at a 4-aligned offset inside a part, because readers recover
from damage by scanning aligned words for it. So a writer splits a record wherever the magic
sits at a 4-aligned offset of the data, dropping those four bytes: cflag 1 is the first part,
2 a middle one, 3 the last, 0 a record in one piece. A reader joins the parts with the magic
put back between them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

from trainport.data.errors import CorruptRecordError
from trainport.data.framing import ByteStream, CorruptionPolicy

__all__ = ["MAGIC", "RecordIOWriter", "encode_recordio", "iter_recordio"]

FORMAT = "RecordIO"
MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_HEADER = struct.Struct("<II")
_MAX_LENGTH = (1 << 29) - 1
_LENGTH_MASK = _MAX_LENGTH


def _aligned_magic_positions(data: bytes) -> list[int]:
    found = []
    at = data.find(_MAGIC_BYTES)
    while at != -1:
        if at % 4 == 0:
            found.append(at)
            at = data.find(_MAGIC_BYTES, at + 4)
        else:
            at = data.find(_MAGIC_BYTES, at + 1)
    return found


def _part(cflag: int, chunk: bytes) -> bytes:
    if len(chunk) > _MAX_LENGTH:
        raise ValueError(f"a RecordIO part holds at most {_MAX_LENGTH} bytes, got {len(chunk)}")
    pad = -len(chunk) % 4
    return _HEADER.pack(MAGIC, (cflag << 29) | len(chunk)) + chunk + b"\x00" * pad


def encode_recordio(data: bytes | bytearray | memoryview) -> bytes:
    """The bytes of one RecordIO record (one or more parts) holding ``data``."""
    data = bytes(data)
    splits = _aligned_magic_positions(data)
    if not splits:
        return _part(0, data)
    parts = []
    begin = 0
    for at in splits:
        parts.append(_part(1 if begin == 0 else 2, data[begin:at]))
        begin = at + 4
    parts.append(_part(3, data[begin:]))
    return b"".join(parts)


class RecordIOWriter:
    """Writes RecordIO records to a binary stream (which the caller opens and closes)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.records = 0
        self.bytes_written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append one record; return the number of bytes written."""
        encoded = encode_recordio(data)
        self._stream.write(encoded)
        self.records += 1
        self.bytes_written += len(encoded)
        return len(encoded)


def _resync(stream: ByteStream) -> bool:
    """Advance to the next 4-aligned magic word; False if the stream ends first.

    Parts are padded to 4 bytes and start at offset 0 of the source, so real headers are
    always 4-aligned and the writer guarantees no aligned magic inside data.
    """
    stream.advance(4 - stream.offset % 4)
    while stream.ensure(4) >= 4:
        if stream.buf[stream.pos : stream.pos + 4] == _MAGIC_BYTES:
            return True
        stream.advance(4)
    stream.advance(len(stream.buf) - stream.pos)
    return False


def iter_recordio(stream: ByteStream, policy: CorruptionPolicy | None = None) -> Iterator[bytes]:
    """Yield each RecordIO record in ``stream``, multi-part records reassembled.

    ``stream.offset`` is the end of the record just yielded when the consumer receives it.
    """
    policy = policy or CorruptionPolicy()
    parts: list[bytes] = []
    first = 0  # offset of the first part of a multi-part record in progress
    while True:
        avail = stream.ensure(8)
        start = stream.offset
        if avail == 0:
            if parts:
                policy.handle(
                    CorruptRecordError(
                        FORMAT, stream.source, first, "stream ends inside a multi-part record"
                    )
                )
            return
        if avail < 8:
            policy.handle(
                CorruptRecordError(
                    FORMAT, stream.source, start, f"truncated header ({avail} of 8 bytes)"
                )
            )
            stream.advance(avail)
            return
        magic, lrec = _HEADER.unpack_from(stream.buf, stream.pos)
        if magic != MAGIC:
            policy.handle(
                CorruptRecordError(FORMAT, stream.source, start, f"bad magic 0x{magic:08x}")
            )
            parts = []
            if not _resync(stream):
                return
            continue
        cflag = lrec >> 29
        length = lrec & _LENGTH_MASK
        total = 8 + length + (-length % 4)
        avail = stream.ensure(total)
        if avail < total:
            policy.handle(
                CorruptRecordError(
                    FORMAT,
                    stream.source,
                    start,
                    f"truncated record: header says {length} data bytes, the stream ends first",
                )
            )
            stream.advance(avail)
            return
        chunk = stream.buf[stream.pos + 8 : stream.pos + 8 + length]
        stream.advance(total)
        if cflag > 3:
            policy.handle(
                CorruptRecordError(FORMAT, stream.source, start, f"invalid cflag {cflag}")
            )
            parts = []
        elif cflag == 0:
            if parts:
                policy.handle(
                    CorruptRecordError(
                        FORMAT, stream.source, first, "multi-part record has no last part"
                    )
                )
                parts = []
            yield chunk
        elif cflag == 1:
            if parts:
                policy.handle(
                    CorruptRecordError(
                        FORMAT, stream.source, first, "multi-part record has no last part"
                    )
                )
            parts = [chunk]
            first = start
        elif not parts:
            policy.handle(
                CorruptRecordError(
                    FORMAT, stream.source, start, f"part with cflag {cflag} has no first part"
                )
            )
        elif cflag == 2:
            parts.append(_MAGIC_BYTES)
            parts.append(chunk)
        else:  # cflag 3
            parts.append(_MAGIC_BYTES)
            parts.append(chunk)
            record = b"".join(parts)
            parts = []
            yield record
