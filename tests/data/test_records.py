"""TFRecord and RecordIO codecs: the golden vectors of docs/contract.md, round trips, corruption."""

from __future__ import annotations

import io
import struct

import pytest

from trainport.data import (
    ByteStream,
    CorruptionPolicy,
    CorruptRecordError,
    RecordIOWriter,
    TFRecordWriter,
    crc32c,
    encode_recordio,
    encode_tfrecord,
    iter_recordio,
    iter_tfrecords,
    masked_crc32c,
)
from trainport.data.recordio import MAGIC

MAGIC_BYTES = struct.pack("<I", MAGIC)


def stream(data: bytes, chunk: int = 1 << 20) -> ByteStream:
    return ByteStream(io.BytesIO(data), source="test.bin", chunk_size=chunk)


def test_crc32c_golden() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    c = 0xE3069283
    assert masked_crc32c(b"123456789") == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % (
        1 << 32
    )


def test_tfrecord_golden() -> None:
    assert encode_tfrecord(b"").hex() == "000000000000000029039807d8ea82a2"
    assert encode_tfrecord(b"hello").hex() == "0500000000000000eab2043e68656c6c6fbb1f1c19"


def test_recordio_golden() -> None:
    assert encode_recordio(b"hello").hex() == "0a23d7ce0500000068656c6c6f000000"


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_tfrecord_round_trip_any_chunking(chunk: int) -> None:
    records = [b"", b"a", b"hello", bytes(range(256)) * 40, b"x" * 100_000]
    out = io.BytesIO()
    writer = TFRecordWriter(out)
    for r in records:
        writer.write(r)
    assert writer.records == len(records) and writer.bytes_written == len(out.getvalue())
    assert list(iter_tfrecords(stream(out.getvalue(), chunk))) == records


def test_recordio_splits_at_aligned_magic_and_rejoins() -> None:
    data = b"abcd" + MAGIC_BYTES + b"efgh" + MAGIC_BYTES + b"xyz"
    encoded = encode_recordio(data)
    parts = []
    pos = 0
    while pos < len(encoded):
        magic, lrec = struct.unpack_from("<II", encoded, pos)
        assert magic == MAGIC
        length = lrec & ((1 << 29) - 1)
        parts.append((lrec >> 29, encoded[pos + 8 : pos + 8 + length]))
        pos += 8 + length + (-length % 4)
    assert parts == [(1, b"abcd"), (2, b"efgh"), (3, b"xyz")]
    # No aligned magic is left anywhere but in the part headers.
    aligned = [i for i in range(0, len(encoded), 4) if encoded[i : i + 4] == MAGIC_BYTES]
    assert aligned == [0, 12, 24]
    assert list(iter_recordio(stream(encoded))) == [data]


@pytest.mark.parametrize(
    "data",
    [
        MAGIC_BYTES,  # the whole record is the magic: two empty parts
        MAGIC_BYTES * 3,
        b"ab" + MAGIC_BYTES + b"cd",  # unaligned magic stays inside one part
        b"1234" + MAGIC_BYTES,  # magic at the very end: an empty last part
        b"",
        b"\x00" * 13,
    ],
)
def test_recordio_round_trip_edge_cases(data: bytes) -> None:
    out = io.BytesIO()
    RecordIOWriter(out).write(data)
    RecordIOWriter(out).write(b"next")
    assert len(out.getvalue()) % 4 == 0
    assert list(iter_recordio(stream(out.getvalue(), chunk=5))) == [data, b"next"]


def test_unaligned_magic_is_not_split() -> None:
    data = b"ab" + MAGIC_BYTES + b"cd"
    assert encode_recordio(data)[4:8] == struct.pack("<I", len(data))


def _three_tfrecords() -> tuple[bytes, list[int]]:
    records = [b"first", b"second", b"third"]
    encoded = [encode_tfrecord(r) for r in records]
    offsets = [0, len(encoded[0]), len(encoded[0]) + len(encoded[1])]
    return b"".join(encoded), offsets


def test_tfrecord_corrupt_data_raises_with_source_and_offset() -> None:
    data, offsets = _three_tfrecords()
    damaged = bytearray(data)
    damaged[offsets[1] + 12] ^= 0xFF  # first data byte of the second record
    reader = iter_tfrecords(stream(bytes(damaged)))
    assert next(reader) == b"first"
    with pytest.raises(CorruptRecordError) as info:
        next(reader)
    assert info.value.offset == offsets[1]
    assert info.value.source == "test.bin"
    assert "test.bin" in str(info.value) and str(offsets[1]) in str(info.value)


def test_tfrecord_corrupt_records_skipped_up_to_budget() -> None:
    data, offsets = _three_tfrecords()
    damaged = bytearray(data)
    damaged[offsets[1] + 12] ^= 0xFF  # data checksum: length still trusted
    policy = CorruptionPolicy(max_corrupt=1)
    assert list(iter_tfrecords(stream(bytes(damaged)), policy)) == [b"first", b"third"]
    assert policy.skipped == 1
    # A second corruption exceeds the budget of one.
    damaged[offsets[2] + 12] ^= 0xFF
    with pytest.raises(CorruptRecordError) as info:
        list(iter_tfrecords(stream(bytes(damaged)), CorruptionPolicy(max_corrupt=1)))
    assert info.value.offset == offsets[2]


def test_tfrecord_bad_length_resyncs_on_next_header() -> None:
    data, offsets = _three_tfrecords()
    damaged = bytearray(data)
    damaged[offsets[1]] ^= 0x01  # the length itself: its checksum no longer matches
    policy = CorruptionPolicy(max_corrupt=5)
    assert list(iter_tfrecords(stream(bytes(damaged), chunk=3), policy)) == [b"first", b"third"]
    assert policy.skipped == 1


def test_tfrecord_truncated() -> None:
    data, _ = _three_tfrecords()
    with pytest.raises(CorruptRecordError) as info:
        list(iter_tfrecords(stream(data[:-3])))
    assert "truncated" in info.value.reason
    policy = CorruptionPolicy(1)
    assert list(iter_tfrecords(stream(data[:-3]), policy)) == [b"first", b"second"]


def test_recordio_bad_magic_raises_then_resyncs_when_allowed() -> None:
    records = [b"one", b"two" * 5, b"three"]
    encoded = [encode_recordio(r) for r in records]
    data = bytearray(b"".join(encoded))
    second = len(encoded[0])
    data[second] ^= 0xFF
    with pytest.raises(CorruptRecordError) as info:
        list(iter_recordio(stream(bytes(data))))
    assert info.value.offset == second and "magic" in info.value.reason
    policy = CorruptionPolicy(max_corrupt=3)
    assert list(iter_recordio(stream(bytes(data)), policy)) == [b"one", b"three"]


def test_recordio_orphan_middle_part_is_corrupt() -> None:
    body = b"abcd"
    orphan = struct.pack("<II", MAGIC, (2 << 29) | len(body)) + body
    data = orphan + encode_recordio(b"ok")
    with pytest.raises(CorruptRecordError, match="no first part"):
        list(iter_recordio(stream(data)))
    assert list(iter_recordio(stream(data), CorruptionPolicy(1))) == [b"ok"]


def test_recordio_multipart_cut_short() -> None:
    encoded = encode_recordio(b"abcd" + MAGIC_BYTES + b"efgh")
    first_part_only = encoded[:12]
    with pytest.raises(CorruptRecordError, match="multi-part") as info:
        list(iter_recordio(stream(first_part_only)))
    assert info.value.offset == 0


def test_offset_after_each_record_allows_resume() -> None:
    records = [b"r%d" % i for i in range(10)]
    data = b"".join(encode_tfrecord(r) for r in records)
    s = stream(data)
    reader = iter_tfrecords(s)
    for _ in range(4):
        next(reader)
    resume_at = s.offset
    rest = ByteStream(io.BytesIO(data[resume_at:]), source="x", start=resume_at)
    assert list(iter_tfrecords(rest)) == records[4:]
