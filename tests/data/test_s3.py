"""ChannelDataset over an s3:// prefix, against moto's server over real HTTP on 127.0.0.1."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest

from tests.data.support import FifoProducer, make_records
from trainport.data import (
    ChannelDataset,
    DataError,
    PipeChannel,
    ReaderSlot,
    S3Channel,
    encode_tfrecord,
)


@pytest.fixture(scope="module")
def endpoint(moto_endpoint: str) -> str:
    """The suite's moto server (tests/conftest.py): one real S3 endpoint over HTTP."""
    return moto_endpoint


@pytest.fixture
def bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[bytes]]]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="data")
    objects = {}
    for i in range(4):
        records = make_records(f"s3-{i}", 15 + i)
        key = f"train/part-{i}.tfrecord"
        s3.put_object(Bucket="data", Key=key, Body=b"".join(encode_tfrecord(r) for r in records))
        objects[key] = records
    s3.put_object(Bucket="data", Key="train/", Body=b"")  # a folder marker: skipped
    s3.put_object(Bucket="data", Key="other/x.tfrecord", Body=encode_tfrecord(b"not mine"))
    yield objects
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="data"):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket="data", Key=item["Key"])
    s3.delete_bucket(Bucket="data")


def test_reads_the_prefix_in_key_order(bucket: dict[str, list[bytes]]) -> None:
    ds = ChannelDataset.from_uri("s3://data/train/", slot=ReaderSlot())
    expected = [r for key in sorted(bucket) for r in bucket[key]]
    assert list(ds) == expected
    assert [o.name for o in S3Channel("s3://data/train/").list_objects()] == [
        f"part-{i}.tfrecord" for i in range(4)
    ]


def test_exactly_once_across_readers(bucket: dict[str, list[bytes]]) -> None:
    everything = [r for records in bucket.values() for r in records]
    for shard_by in ("object", "record"):
        got: list[bytes] = []
        for shard in range(3):
            slot = ReaderSlot(rank=shard, world_size=3, local_rank=shard, local_world_size=3)
            got += list(ChannelDataset.from_uri("s3://data/train", shard_by=shard_by, slot=slot))
        assert Counter(got) == Counter(everything)


def test_resume_reads_by_range_from_the_checkpointed_offset(
    bucket: dict[str, list[bytes]],
) -> None:
    expected = [r for key in sorted(bucket) for r in bucket[key]]
    ds = ChannelDataset.from_uri("s3://data/train/", slot=ReaderSlot())
    iterator = iter(ds)
    head = [next(iterator) for _ in range(20)]  # into the second object
    state = ds.state_dict()
    assert state["object"] == 1 and state["offset"] > 0
    resumed = ChannelDataset.from_uri("s3://data/train/", slot=ReaderSlot())
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected


def test_missing_bucket_is_a_data_error(bucket: dict[str, list[bytes]]) -> None:
    with pytest.raises(DataError, match="s3://nope/x"):
        list(ChannelDataset.from_uri("s3://nope/x"))


def test_same_records_from_s3_files_and_a_pipe(
    bucket: dict[str, list[bytes]], tmp_path: Path, fifo_producers: Callable[..., FifoProducer]
) -> None:
    s3 = boto3.client("s3")
    blobs = {key: s3.get_object(Bucket="data", Key=key)["Body"].read() for key in sorted(bucket)}
    for key, blob in blobs.items():
        (tmp_path / "files").mkdir(exist_ok=True)
        (tmp_path / "files" / key.split("/")[-1]).write_bytes(blob)
    # Pipe mode delivers the concatenation of the objects in key order.
    fifo_producers(tmp_path, "train", lambda e: b"".join(blobs.values()), 1)
    from_s3 = list(ChannelDataset.from_uri("s3://data/train/", slot=ReaderSlot()))
    from_files = list(ChannelDataset.from_uri(tmp_path / "files", slot=ReaderSlot()))
    pipe = PipeChannel("train", tmp_path, wait_timeout=20)
    from_pipe = list(ChannelDataset(pipe, slot=ReaderSlot()))
    assert from_s3 == from_files == from_pipe
    assert len(from_s3) == sum(len(r) for r in bucket.values())
