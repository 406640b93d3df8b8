"""TFRecord framing: a reader, a writer and a one-record encoder.

Each record is ``uint64 length (LE) | uint32 masked_crc32c(length) | data |
uint32 masked_crc32c(data)``. Both checksums are always verified: the length checksum first,
because a wrong length would make the reader misparse everything after it.

Recovery from corruption: a record whose *data* checksum fails has a trustworthy length, so
the reader steps over it; a record whose *length* checksum fails gives no length, so the
reader scans forward byte by byte for the next 12 bytes that form a valid header.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

from trainport.data.crc import MASK_DELTA, crc_function, masked_crc32c
from trainport.data.errors import CorruptRecordError
from trainport.data.framing import ByteStream, CorruptionPolicy

__all__ = ["TFRecordWriter", "encode_tfrecord", "iter_tfrecords"]

FORMAT = "TFRecord"
_HEADER = struct.Struct("<QI")
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
# Records at least this large are read straight into their own bytes object.
_LARGE = 1 << 18


def encode_tfrecord(data: bytes | bytearray | memoryview) -> bytes:
    """The bytes of one TFRecord holding ``data``."""
    length = _LENGTH.pack(len(data))
    return b"".join(
        (
            length,
            _CRC.pack(masked_crc32c(length)),
            bytes(data),
            _CRC.pack(masked_crc32c(data)),
        )
    )


class TFRecordWriter:
    """Writes TFRecords to a binary stream (which the caller opens and closes)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.records = 0
        self.bytes_written = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Append one record; return the number of bytes written."""
        encoded = encode_tfrecord(data)
        self._stream.write(encoded)
        self.records += 1
        self.bytes_written += len(encoded)
        return len(encoded)


def _valid_header(buf: bytes, pos: int) -> bool:
    (crc,) = _CRC.unpack_from(buf, pos + 8)
    return masked_crc32c(buf[pos : pos + 8]) == crc


def _resync(stream: ByteStream) -> bool:
    """Advance to the next offset holding a valid header; False if the stream ends first."""
    stream.advance(1)
    while stream.ensure(12) >= 12:
        if _valid_header(stream.buf, stream.pos):
            return True
        stream.advance(1)
    stream.advance(len(stream.buf) - stream.pos)
    return False


def iter_tfrecords(stream: ByteStream, policy: CorruptionPolicy | None = None) -> Iterator[bytes]:
    """Yield the data of each TFRecord in ``stream``.

    ``stream.offset`` is the end of the record just yielded when the consumer receives it,
    which is what a checkpoint stores to resume after that record.
    """
    policy = policy or CorruptionPolicy()
    # This loop is the hot path of every TFRecord channel: names are bound locally and the
    # CRC mask is inlined, because a function call per check costs as much as the check.
    crc = crc_function()
    unpack_header = _HEADER.unpack_from
    unpack_crc = _CRC.unpack_from
    source = stream.source
    length_crcs: dict[int, int] = {}
    while True:
        buf, pos = stream.buf, stream.pos
        if len(buf) - pos < 12:
            avail = stream.ensure(12)
            if avail == 0:
                return
            if avail < 12:
                policy.handle(
                    CorruptRecordError(
                        FORMAT, source, stream.offset, f"truncated header ({avail} of 12 bytes)"
                    )
                )
                stream.advance(avail)
                return
            buf, pos = stream.buf, stream.pos
        length, length_crc = unpack_header(buf, pos)
        # The length checksum depends on the length alone, and datasets repeat lengths, so
        # known lengths skip the CRC call: the comparison below is the same check.
        expected = length_crcs.get(length)
        if expected is None:
            c = crc(buf[pos : pos + 8])
            expected = (((c >> 15) | (c << 17)) + MASK_DELTA) & 0xFFFFFFFF
            if expected == length_crc:
                if len(length_crcs) > 4096:
                    length_crcs.clear()
                length_crcs[length] = expected
        if expected != length_crc:
            policy.handle(
                CorruptRecordError(FORMAT, source, stream.offset, "length checksum mismatch")
            )
            if not _resync(stream):
                return
            continue
        end = pos + 12 + length
        if end + 4 <= len(buf):
            data = buf[pos + 12 : end]
            (data_crc,) = unpack_crc(buf, end)
            stream.pos = end + 4
        else:
            start = stream.offset
            stream.advance(12)
            data = stream.take(length)
            # While records are large, the buffer holds only the 16 bytes between two
            # records' data (this one's data checksum, the next header), fetched in one
            # read, so each record's data goes straight from the source into its own bytes
            # (see ByteStream.take): two reads per record and no copy but the kernel's.
            stream.read_hint = 16 if length >= _LARGE else stream.chunk
            if stream.ensure(4) < 4:
                policy.handle(
                    CorruptRecordError(
                        FORMAT,
                        source,
                        start,
                        f"truncated record: header says {length} data bytes, the stream ends first",
                    )
                )
                return
            (data_crc,) = unpack_crc(stream.buf, stream.pos)
            stream.pos += 4
        c = crc(data)
        if (((c >> 15) | (c << 17)) + MASK_DELTA) & 0xFFFFFFFF != data_crc:
            policy.handle(
                CorruptRecordError(
                    FORMAT, source, stream.offset - 16 - length, "data checksum mismatch"
                )
            )
            continue
        yield data
