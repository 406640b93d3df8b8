"""The record formats a channel can hold, chosen by name from a plain registry.

``tfrecord`` and ``recordio`` are framed formats: one stream (a FIFO epoch, a file, an
object) holds many records. ``object`` makes each whole file or object one record, which is
what image folders and one-sample-per-object datasets want; it cannot apply to a Pipe FIFO,
where object boundaries are lost in the concatenation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from trainport.data.errors import DataError
from trainport.data.framing import ByteStream, CorruptionPolicy
from trainport.data.recordio import iter_recordio
from trainport.data.tfrecord import iter_tfrecords

__all__ = ["RECORD_FORMATS", "RecordParser", "iter_objects", "parser_for"]

RecordParser = Callable[[ByteStream, CorruptionPolicy], Iterator[bytes]]


def iter_objects(stream: ByteStream, policy: CorruptionPolicy) -> Iterator[bytes]:
    """Yield the whole stream as one record; an empty object yields nothing."""
    if stream.offset > 0:
        # A checkpoint taken after this object was yielded resumes at its end.
        return
    size = stream.ensure(1 << 62)
    if size == 0:
        return
    data = stream.buf[stream.pos :]
    stream.advance(size)
    yield data


RECORD_FORMATS: dict[str, RecordParser] = {
    "tfrecord": iter_tfrecords,
    "recordio": iter_recordio,
    "object": iter_objects,
}


def parser_for(record_format: str) -> RecordParser:
    """The parser registered under ``record_format`` (case-insensitive)."""
    try:
        return RECORD_FORMATS[record_format.lower()]
    except KeyError:
        raise DataError(
            f"unknown record_format {record_format!r}; choose one of {sorted(RECORD_FORMATS)}"
        ) from None
