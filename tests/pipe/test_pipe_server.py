"""The Pipe-mode channel server on real FIFOs: byte-exact epochs, early close, shuffle,
sharding, per-worker series, gzip, RecordIO wrapping and augmented manifests."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import put
from tests.pipe.conftest import CountingStore, read_fifo, wait_fifo
from trainport.data import channel as data_channel
from trainport.data import recordio
from trainport.errors import ValidationError
from trainport.host.channels import ChannelObject, resolve_augmented_manifest
from trainport.host.pipe import PipeChannelServer, PipeOptions, epoch_items, serve_channel
from trainport.host.recordio_frame import recordio_record
from trainport.spec import ChannelSpec


def channel(name: str = "train", uri: str = "s3://data/train/", **kw: object) -> ChannelSpec:
    base: dict[str, object] = {
        "name": name,
        "s3_data_type": "S3Prefix",
        "s3_uri": uri,
        "distribution": "FullyReplicated",
        "input_mode": "Pipe",
    }
    base.update(kw)
    return ChannelSpec(**base)  # type: ignore[arg-type]


def objects(home: Path, n: int, size: int = 1000, prefix: str = "train") -> dict[str, bytes]:
    made = {}
    for i in range(n):
        data = os.urandom(size + i)
        put(home, "data", f"{prefix}/obj{i:03d}", data)
        made[f"{prefix}/obj{i:03d}"] = data
    return made


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "store")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path


def serve(store: CountingStore, ch: ChannelSpec, data_dir: Path, **kw: object) -> PipeChannelServer:
    return serve_channel(store, ch, data_dir, **kw)  # type: ignore[arg-type]


def test_epochs_are_the_objects_concatenated_in_order(home: Path, store: CountingStore) -> None:
    made = objects(home, 5, size=300_000)
    data_dir = home / "data"
    # Small parts so one object is fetched in several ranged reads, in parallel.
    server = serve(store, channel(), data_dir, opts=PipeOptions(part_size=64 << 10, fetchers=4))
    try:
        expected = b"".join(made[k] for k in sorted(made))
        for epoch in range(4):
            got = read_fifo(data_dir / f"train_{epoch}")
            assert hashlib.sha256(got).digest() == hashlib.sha256(expected).digest()
    finally:
        server.close()
    assert not list(data_dir.iterdir())  # every FIFO removed on close


def test_next_epoch_appears_only_after_the_current_one(home: Path, store: CountingStore) -> None:
    objects(home, 2)
    data_dir = home / "data"
    server = serve(store, channel(), data_dir)
    try:
        assert (data_dir / "train_0").exists()
        assert not (data_dir / "train_1").exists()
        read_fifo(data_dir / "train_0")
        wait_fifo(data_dir / "train_1")
        assert not (data_dir / "train_2").exists()
    finally:
        server.close()


def test_early_close_ends_the_epoch_cleanly(home: Path, store: CountingStore) -> None:
    made = objects(home, 4, size=3 << 20)  # 12 MiB: more than the pipe holds
    expected = b"".join(made[k] for k in sorted(made))
    data_dir = home / "data"
    errors: list[str] = []
    server = serve(store, channel(), data_dir, on_error=errors.append)
    try:
        assert read_fifo(data_dir / "train_0", limit=100) == expected[:100]
        # The reader closed with most of the epoch unread: EPIPE ends epoch 0 only.
        assert read_fifo(data_dir / "train_1") == expected
        assert read_fifo(data_dir / "train_2", limit=0) == b""
        assert read_fifo(data_dir / "train_3") == expected
    finally:
        server.close()
    assert errors == []


def test_many_channels_are_independent(home: Path, store: CountingStore) -> None:
    data_dir = home / "data"
    servers, expected = [], {}
    for c in range(25):  # beyond SageMaker's 20-channel limit
        made = objects(home, 2, size=100, prefix=f"ch{c}")
        expected[c] = b"".join(made[k] for k in sorted(made))
        servers.append(serve(store, channel(f"ch{c}", f"s3://data/ch{c}/"), data_dir))
    try:
        # Read channels out of order, some more epochs than others.
        for c in reversed(range(25)):
            for epoch in range(1 + c % 3):
                assert read_fifo(data_dir / f"ch{c}_{epoch}") == expected[c]
    finally:
        for s in servers:
            s.close()


def objs(n: int) -> list[ChannelObject]:
    return [ChannelObject("b", f"p/{i:04d}", f"{i:04d}", 1) for i in range(n)]


def test_shuffle_is_deterministic_and_differs_per_epoch() -> None:
    items = objs(100)
    ch = channel(shuffle_seed=42)
    e0 = epoch_items(items, ch, 0)
    assert e0 == epoch_items(list(reversed(items)), ch, 0)  # hosts and reruns agree
    assert e0 != epoch_items(items, ch, 1)
    assert sorted(o.key for o in e0) == [o.key for o in items]
    assert epoch_items(items, channel(), 3) == items  # no ShuffleConfig: listing order


@pytest.mark.parametrize("hosts", [1, 2, 3])
@pytest.mark.parametrize("workers", [None, 2, 3])
def test_sharding_is_disjoint_balanced_and_changes_when_shuffled(
    hosts: int, workers: int | None
) -> None:
    items = objs(101)
    ch = channel(shuffle_seed=7, distribution="ShardedByS3Key")
    for epoch in range(3):
        shares = [
            epoch_items(items, ch, epoch, host_index=h, host_count=hosts, worker=w, workers=workers)
            for h in range(hosts)
            for w in (range(workers) if workers else [None])
        ]
        keys = [o.key for s in shares for o in s]
        assert sorted(keys) == [o.key for o in items] and len(set(keys)) == len(keys)
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    if hosts * (workers or 1) > 1:
        mine = {"host_count": hosts, "workers": workers, "worker": 0 if workers else None}
        first = {o.key for o in epoch_items(items, ch, 0, **mine)}  # type: ignore[arg-type]
        second = {o.key for o in epoch_items(items, ch, 1, **mine)}  # type: ignore[arg-type]
        assert first != second


_WORKER = r"""
import hashlib, os, sys, time
data_dir, channel, worker, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for epoch in range(epochs):
    path = os.path.join(data_dir, f"{channel}_w{worker}_{epoch}")
    while not os.path.exists(path):
        time.sleep(0.005)
    with open(path, "rb") as f:
        data = f.read()
    print(epoch, data.hex(), flush=True)
"""


def test_per_worker_series_with_two_reader_processes(home: Path, store: CountingStore) -> None:
    made = {}
    for i in range(9):
        made[f"train/obj{i:03d}"] = f"<{i}>".encode()
        put(home, "data", f"train/obj{i:03d}", made[f"train/obj{i:03d}"])
    data_dir = home / "data"
    ch = channel(shuffle_seed=3)
    server = serve(store, ch, data_dir, workers=2)
    try:
        assert not (data_dir / "train_0").exists()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(data_dir), "train", str(w), "3"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for w in range(2)
        ]
        outs = [p.communicate(timeout=60)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs)
    finally:
        server.close()
    items = server.items
    for epoch in range(3):
        got = [bytes.fromhex(out.splitlines()[epoch].split()[1]) for out in outs]
        for w in range(2):
            want = epoch_items(items, ch, epoch, worker=w, workers=2)
            assert got[w] == b"".join(made[o.key] for o in want)  # type: ignore[union-attr]
        assert sorted(got[0].split(b">")[:-1] + got[1].split(b">")[:-1]) == sorted(
            v[:-1] for v in made.values()
        )


def test_gzip_objects_arrive_decompressed(home: Path, store: CountingStore) -> None:
    plain = [os.urandom(200_000), b"", b"x" * 5_000_000]
    for i, data in enumerate(plain):
        put(home, "data", f"gz/{i}.gz", gzip.compress(data))
    # Concatenated gzip members are one object too (as `cat a.gz b.gz` makes).
    put(home, "data", "gz/3.gz", gzip.compress(b"first") + gzip.compress(b"second"))
    data_dir = home / "data"
    ch = channel("gz", "s3://data/gz/", compression="Gzip")
    server = serve(store, ch, data_dir, opts=PipeOptions(part_size=100_000))
    try:
        assert read_fifo(data_dir / "gz_0") == b"".join(plain) + b"firstsecond"
    finally:
        server.close()


def test_corrupt_gzip_fails_the_channel_naming_the_object(home: Path, store: CountingStore) -> None:
    put(home, "data", "gz/bad.gz", b"this is not gzip")
    data_dir = home / "data"
    errors: list[str] = []
    gz = channel("gz", "s3://data/gz/", compression="Gzip")
    server = serve(store, gz, data_dir, on_error=errors.append)
    try:
        read_fifo(data_dir / "gz_0")
    finally:
        server.close()
    assert len(errors) == 1 and "s3://data/gz/bad.gz" in errors[0] and "gzip" in errors[0]


def test_recordio_golden_vector_and_wrapping(home: Path, store: CountingStore) -> None:
    assert recordio_record(b"hello").hex() == "0a23d7ce0500000068656c6c6f000000"
    magic = bytes.fromhex("0a23d7ce")
    assert recordio_record(b"abcd" + magic + b"xy") == (
        magic
        + (1 << 29 | 4).to_bytes(4, "little")
        + b"abcd"
        + magic
        + (3 << 29 | 2).to_bytes(4, "little")
        + b"xy\x00\x00"
    )
    put(home, "data", "rio/a", b"hello")
    put(home, "data", "rio/b", b"")
    put(home, "data", "rio/c", b"abcd" + magic + b"xy")
    data_dir = home / "data"
    server = serve(store, channel("rio", "s3://data/rio/", record_wrapper="RecordIO"), data_dir)
    try:
        got = read_fifo(data_dir / "rio_0")
    finally:
        server.close()
    assert got == recordio_record(b"hello") + recordio_record(b"") + recordio_record(
        b"abcd" + magic + b"xy"
    )


def test_recordio_matches_the_training_side_reader(home: Path, store: CountingStore) -> None:
    assert recordio_record(b"hello") == recordio.encode_recordio(b"hello")


def manifest(home: Path, lines: list[dict[str, object]]) -> None:
    put(home, "data", "aug/manifest.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")


def test_augmented_manifest_attributes_and_refs(home: Path, store: CountingStore) -> None:
    put(home, "data", "img/1.jpg", b"\xff\xd8image-one")
    put(home, "data", "img/2.jpg", b"\xff\xd8image-two")
    manifest(
        home,
        [
            {"source-ref": "s3://data/img/1.jpg", "is-a-cat": 1, "other": "ignored"},
            {"is-a-cat": 0, "source-ref": "s3://data/img/2.jpg"},
        ],
    )
    data_dir = home / "data"
    ch = channel(
        "aug",
        "s3://data/aug/manifest.jsonl",
        s3_data_type="AugmentedManifestFile",
        attribute_names=("source-ref", "is-a-cat"),
        record_wrapper="RecordIO",
    )
    server = serve(store, ch, data_dir)
    try:
        got = read_fifo(data_dir / "aug_0")
    finally:
        server.close()
    assert got == b"".join(
        recordio_record(x) for x in [b"\xff\xd8image-one", b"1", b"\xff\xd8image-two", b"0"]
    )


def test_augmented_manifest_line_missing_an_attribute_is_named(
    home: Path, store: CountingStore
) -> None:
    manifest(home, [{"source-ref": "s3://data/img/1.jpg", "label": 1}, {"source-ref": "s3://x/y"}])
    ch = channel(
        "aug",
        "s3://data/aug/manifest.jsonl",
        s3_data_type="AugmentedManifestFile",
        attribute_names=("source-ref", "label"),
    )
    with pytest.raises(ValidationError, match=r"line 2 lacks attribute\(s\) 'label'"):
        resolve_augmented_manifest(store, ch)
    manifest(home, [{"source-ref": 3, "label": 1}])
    with pytest.raises(ValidationError, match="line 1: attribute 'source-ref' must be an S3 URI"):
        resolve_augmented_manifest(store, ch)


def test_trainport_data_pipe_channel_reads_the_fifos(home: Path, store: CountingStore) -> None:
    made = objects(home, 3, size=50_000)
    data_dir = home / "data"
    server = serve(store, channel(), data_dir, workers=2)
    try:
        reader = data_channel.PipeChannel("train", data_dir, wait_timeout=30)
        assert reader.num_series(0) == 2
        for epoch in range(2):
            got = []
            for w in range(2):
                with reader.open_fifo(reader.fifo_path(epoch, w)) as f:
                    got.append(f.read())
            want = [
                b"".join(
                    made[o.key]
                    for o in epoch_items(server.items, server.channel, epoch, worker=w, workers=2)
                )  # type: ignore[union-attr]
                for w in range(2)
            ]
            assert got == want
    finally:
        server.close()
