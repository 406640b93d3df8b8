"""Pipe mode from an S3 endpoint (moto's server mode over real HTTP), and the store's lean
ranged reads (presigned URL, bare GET) it relies on: byte-exact, clipped at the object's
end, and answered by the SDK's own call where the lean GET cannot answer."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from tests.pipe.conftest import read_fifo
from tests.pipe.test_pipe_server import channel
from trainport.errors import StoreError
from trainport.host.channels import ChannelObject
from trainport.host.pipe import PipeOptions, epoch_items, serve_channel
from trainport.store.s3 import S3Store

BUCKET = "pipe-s3"


@pytest.fixture
def store(s3_home: Path, moto_endpoint: str) -> S3Store:
    made = S3Store(endpoint_url=moto_endpoint, region="us-east-1", max_connections=12)
    made.client.create_bucket(Bucket=BUCKET)
    return made


def put_objects(store: S3Store, prefix: str, sizes: list[int]) -> dict[str, bytes]:
    made = {}
    for i, size in enumerate(sizes):
        key = f"{prefix}/obj{i:03d}"
        made[key] = os.urandom(size)
        store.put_bytes(BUCKET, key, made[key])
    return made


def test_ranged_reads_are_byte_exact_and_clipped_at_the_end(store: S3Store) -> None:
    data = put_objects(store, "ranges", [300_000])["ranges/obj000"]
    for start, end in [(0, 300_000), (0, 1), (1234, 99_999), (299_999, 300_000), (0, 1 << 20)]:
        assert store.read_range(BUCKET, "ranges/obj000", start, end) == data[start:end]
    assert store.read_range(BUCKET, "ranges/obj000", 10, 10) == b""
    assert (BUCKET, "ranges/obj000") in store._urls  # the lean path answered, URL reused


def test_a_refused_presigned_get_falls_back_to_the_sdk_and_is_re_signed(store: S3Store) -> None:
    made = put_objects(store, "stale", [50_000, 10])
    data = made["stale/obj000"]
    # A cached URL the server refuses (here: it names an object since deleted, so 404; an
    # expired or revoked signature gives 403 the same way): the SDK's call answers instead.
    wrong = store._url(BUCKET, "stale/obj001")
    store.delete(BUCKET, "stale/obj001")
    store._urls[(BUCKET, "stale/obj000")] = (wrong, 1e18)
    assert store.read_range(BUCKET, "stale/obj000", 100, 40_000) == data[100:40_000]
    assert (BUCKET, "stale/obj000") not in store._urls  # dropped: signed afresh next time
    assert store.read_range(BUCKET, "stale/obj000", 0, 50_000) == data
    assert store._urls[(BUCKET, "stale/obj000")][0] != wrong


def test_a_missing_object_is_a_store_error_naming_it(store: S3Store) -> None:
    with pytest.raises(StoreError, match="s3://pipe-s3/nothing/here"):
        store.read_range(BUCKET, "nothing/here", 0, 10)


def test_pipe_epochs_from_s3_are_byte_exact(store: S3Store, tmp_path: Path) -> None:
    made = put_objects(store, "train", [1 << 20, 0, 777_777, 2_500_000, 5])
    ch = channel(uri=f"s3://{BUCKET}/train/", shuffle_seed=9)
    data_dir = tmp_path / "data"
    # Parts smaller than the objects: one object arrives in several parallel ranged GETs.
    server = serve_channel(store, ch, data_dir, opts=PipeOptions(part_size=300_000, fetchers=6))
    try:
        for epoch in range(3):
            items = epoch_items(server.items, ch, epoch)
            want = b"".join(made[o.key] for o in items if isinstance(o, ChannelObject))
            got = read_fifo(data_dir / f"train_{epoch}")
            assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest()
    finally:
        server.close()


def test_pipe_from_s3_names_an_object_deleted_after_listing(store: S3Store, tmp_path: Path) -> None:
    put_objects(store, "gone", [1000, 1000])
    data_dir = tmp_path / "data"
    errors: list[str] = []
    listed = store.list_objects

    def list_then_delete(bucket: str, prefix: str) -> Any:
        # The object goes right after the listing names it, before anything can fetch it:
        # the test decides the order, not the read-ahead's timing.
        found = listed(bucket, prefix)
        store.delete(BUCKET, "gone/obj001")
        return found

    store.list_objects = list_then_delete  # type: ignore[method-assign]
    server = serve_channel(
        store, channel(uri=f"s3://{BUCKET}/gone/"), data_dir, on_error=errors.append
    )
    try:
        read_fifo(data_dir / "train_0")
    finally:
        server.close()
    assert len(errors) == 1 and "gone/obj001" in errors[0], errors


def test_a_short_or_shifted_range_is_not_taken_for_the_answer() -> None:
    from trainport.store.s3 import _whole_range

    assert _whole_range("bytes 10-19/100", 10, 20, b"x" * 10)
    assert _whole_range("bytes 90-99/100", 90, 200, b"x" * 10)  # clipped at the object's end
    assert not _whole_range("bytes 10-19/100", 10, 20, b"x" * 9)  # body cut short
    assert not _whole_range("bytes 10-14/100", 10, 20, b"x" * 5)  # less than asked, not at end
    assert not _whole_range("bytes 0-9/100", 10, 20, b"x" * 10)  # another range
    assert not _whole_range("", 0, 10, b"x" * 10)
