"""MXNet RecordIO framing for Pipe channels with ``RecordWrapperType: RecordIO``.

The platform wraps each object (or augmented-manifest attribute) as one record, framed as
SageMaker frames it: ``u32le magic | u32le (cflag << 29 | length) | data | pad to 4``.
Where the magic word sits at a 4-aligned offset of the data, the record is split there and
those four bytes dropped (cflag 1 first, 2 middle, 3 last part; 0 a record in one piece), so
a reader that resynchronises on aligned magic words never mistakes data for a header; readers
put the magic back between parts.

This is the platform's own copy of the framing: ``trainport.data.recordio`` frames records
the same way, but importing anything of ``trainport.data`` imports its package, which loads
PyTorch (about 2 s) into every supervisor that serves a Pipe channel. This one also returns
the parts as buffers to write without copying the payload. Both are tested against the
same golden vector.
"""

from __future__ import annotations

import struct

__all__ = ["MAGIC", "MAX_PART", "frame_record", "recordio_record"]

MAGIC = 0xCED7230A
MAX_PART = (1 << 29) - 1
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_HEADER = struct.Struct("<II")
_PAD = (b"", b"\x00\x00\x00", b"\x00\x00", b"\x00")


def _aligned_magic(raw: bytes) -> list[int]:
    found = []
    at = raw.find(_MAGIC_BYTES)
    while at != -1:
        if at % 4 == 0:
            found.append(at)
            at = raw.find(_MAGIC_BYTES, at + 4)
        else:
            at = raw.find(_MAGIC_BYTES, at + 1)
    return found


def _header(cflag: int, length: int, what: str) -> bytes:
    if length > MAX_PART:
        raise ValueError(
            f"{what}: a RecordIO part holds at most {MAX_PART} bytes; this one has {length}"
        )
    return _HEADER.pack(MAGIC, (cflag << 29) | length)


def frame_record(data: bytes, *, what: str = "record") -> list[bytes | memoryview]:
    """One record as a list of buffers to write in order (no copy of the payload).

    ``what`` names the object or attribute in the error raised for a part too long.
    """
    view = memoryview(data)
    splits = _aligned_magic(data)
    pieces: list[bytes | memoryview] = []
    begin = 0
    for at in splits:
        pieces += [_header(1 if begin == 0 else 2, at - begin, what), view[begin:at]]
        begin = at + 4
    last = len(data) - begin
    pieces += [_header(3 if splits else 0, last, what), view[begin:], _PAD[len(data) % 4]]
    return pieces


def recordio_record(data: bytes) -> bytes:
    """One record's bytes, joined (for tests and small records)."""
    return b"".join(frame_record(data))
