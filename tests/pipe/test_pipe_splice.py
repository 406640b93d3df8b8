"""The local store's splice path: objects moved file -> FIFO in the kernel, with every
behaviour of the user-space path (order, shuffle, sharding, epochs, early close, a killed
reader, stop, a missing object) and the same bytes."""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import put
from tests.pipe.conftest import CountingStore, read_fifo, wait_fifo
from tests.pipe.test_pipe_server import channel, objects, serve
from trainport.host import splice as splice_module
from trainport.host.channels import ChannelObject
from trainport.host.pipe import PipeChannelServer, PipeOptions, epoch_items
from trainport.host.recordio_frame import recordio_record


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "store")


def expected(server: PipeChannelServer, made: dict[str, bytes], epoch: int, **kw: object) -> bytes:
    items = epoch_items(server.items, server.channel, epoch, **kw)  # type: ignore[arg-type]
    return b"".join(made[o.key] for o in items if isinstance(o, ChannelObject))


def test_shuffled_sharded_epochs_are_spliced_byte_exact(
    tmp_path: Path, store: CountingStore
) -> None:
    made = objects(tmp_path, 11, size=700_000)  # 7.7 MiB: several pipe fills per epoch
    ch = channel(shuffle_seed=5, distribution="ShardedByS3Key")
    data_dir = tmp_path / "data"
    server = serve(store, ch, data_dir, host_index=1, host_count=2)
    try:
        seen = []
        for epoch in range(3):
            got = read_fifo(data_dir / f"train_{epoch}")
            want = expected(server, made, epoch, host_index=1, host_count=2)
            assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest()
            seen.append(got)
        assert len(set(seen)) == 3  # the shuffle differs per epoch
    finally:
        server.close()
    # Nothing went through the store's read calls: the files were spliced.
    assert sum(store.reads.values()) == 0
    assert not list(data_dir.iterdir())


def test_splice_and_user_space_paths_give_the_same_bytes(
    tmp_path: Path, store: CountingStore
) -> None:
    made = objects(tmp_path, 6, size=300_000)
    put(tmp_path, "data", "train/empty", b"")  # an empty object in the middle of the order
    made["train/empty"] = b""
    ch = channel(shuffle_seed=11)
    spliced = serve(store, ch, tmp_path / "a")
    copied = serve(store, ch, tmp_path / "b", opts=PipeOptions(splice=False, part_size=100_000))
    try:
        for epoch in range(2):
            a = read_fifo(tmp_path / "a" / f"train_{epoch}")
            b = read_fifo(tmp_path / "b" / f"train_{epoch}")
            assert a == b == expected(spliced, made, epoch)
    finally:
        spliced.close()
        copied.close()
    assert sum(store.reads.values()) > 0  # only the user-space server read through the store


def test_per_worker_series_are_spliced(tmp_path: Path, store: CountingStore) -> None:
    made = objects(tmp_path, 7, size=200_000)
    ch = channel(shuffle_seed=2)
    data_dir = tmp_path / "data"
    server = serve(store, ch, data_dir, workers=3)
    try:
        for epoch in range(2):
            got = [read_fifo(data_dir / f"train_w{w}_{epoch}") for w in range(3)]
            assert got == [expected(server, made, epoch, worker=w, workers=3) for w in range(3)]
    finally:
        server.close()
    assert sum(store.reads.values()) == 0


_PARTIAL_READER = r"""
import os, sys, time
path = sys.argv[1]
while not os.path.exists(path):
    time.sleep(0.005)
fd = os.open(path, os.O_RDONLY)
print(len(os.read(fd, 4096)), flush=True)
time.sleep(600)
"""


def test_killed_reader_ends_only_that_epoch(tmp_path: Path, store: CountingStore) -> None:
    made = objects(tmp_path, 3, size=4 << 20)  # 12 MiB: the writer blocks in splice
    data_dir = tmp_path / "data"
    errors: list[str] = []
    server = serve(store, channel(), data_dir, on_error=errors.append)
    try:
        reader = subprocess.Popen(
            [sys.executable, "-c", _PARTIAL_READER, str(data_dir / "train_0")],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None and reader.stdout.readline().strip() == "4096"
        time.sleep(0.2)  # the writer is now blocked with a full pipe
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=10)
        assert read_fifo(data_dir / "train_1") == expected(server, made, 1)
    finally:
        server.close()
    assert errors == []


def test_stop_while_splicing_ends_after_the_reader_closes(
    tmp_path: Path, store: CountingStore
) -> None:
    objects(tmp_path, 2, size=3 << 20)
    data_dir = tmp_path / "data"
    server = serve(store, channel(), data_dir)
    wait_fifo(data_dir / "train_0")
    with open(data_dir / "train_0", "rb", buffering=0) as f:
        assert len(f.read(100)) == 100
        closer = threading.Thread(target=server.close, kwargs={"timeout": 20})
        closer.start()
        time.sleep(0.2)
    # The reader (the training process) is gone: EPIPE ends the epoch and no other begins.
    closer.join(timeout=20)
    assert not closer.is_alive()
    assert not any(s.thread.is_alive() for s in server.series)
    assert not list(data_dir.iterdir())


def test_object_removed_after_listing_fails_the_channel_naming_it(
    tmp_path: Path, store: CountingStore
) -> None:
    objects(tmp_path, 3, size=1000)
    data_dir = tmp_path / "data"
    errors: list[str] = []
    server = serve(store, channel(), data_dir, on_error=errors.append)
    try:
        os.unlink(tmp_path / "store" / "data" / "train" / "obj001")
        read_fifo(data_dir / "train_0")
    finally:
        server.close()
    assert len(errors) == 1 and "s3://data/train/obj001" in errors[0], errors


def test_a_filesystem_that_refuses_splice_is_copied_instead(
    tmp_path: Path, store: CountingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some filesystems (FUSE, network mounts) answer splice with EINVAL, possibly after the
    # first bytes; the rest of that object goes through read/write, byte-exact.
    made = objects(tmp_path, 3, size=2_500_000)
    real = os.splice
    calls = {"n": 0}

    def refusing(src: int, dst: int, count: int, *args: object, **kw: object) -> int:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(src, dst, min(count, 300_000), *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(splice_module.os, "splice", refusing)
    data_dir = tmp_path / "data"
    server = serve(store, channel(), data_dir)
    try:
        assert read_fifo(data_dir / "train_0") == expected(server, made, 0)
    finally:
        server.close()
    assert calls["n"] >= 3


def test_recordio_and_gzip_objects_on_the_local_store_go_through_user_space(
    tmp_path: Path, store: CountingStore
) -> None:
    # Objects larger than the pipe, with the magic word at aligned offsets: each record is
    # written as header + payload parts in writev calls the pipe takes in pieces.
    magic = bytes.fromhex("0a23d7ce")
    payloads = [
        os.urandom(1 << 20) + magic + os.urandom(3 << 20) + magic + b"tail",
        b"",
        os.urandom(2_000_003),
    ]
    for i, payload in enumerate(payloads):
        put(tmp_path, "data", f"rio/{i}.gz", gzip.compress(payload, compresslevel=1))
    ch = channel("rio", "s3://data/rio/", record_wrapper="RecordIO", compression="Gzip")
    data_dir = tmp_path / "data"
    server = serve(store, ch, data_dir, opts=PipeOptions(part_size=1 << 20))
    try:
        want = b"".join(recordio_record(p) for p in payloads)
        for epoch in range(2):
            assert read_fifo(data_dir / f"rio_{epoch}") == want
    finally:
        server.close()
    assert sum(store.reads.values()) > 0  # read through the store, not spliced


def test_many_tiny_objects_are_spliced_in_order(tmp_path: Path, store: CountingStore) -> None:
    made = {}
    for i in range(1500):
        key = f"tiny/o{i:05d}"
        made[key] = f"<{i}>".encode() * (i % 5)  # some empty
        put(tmp_path, "data", key, made[key])
    ch = channel("tiny", "s3://data/tiny/", shuffle_seed=4)
    data_dir = tmp_path / "data"
    server = serve(store, ch, data_dir)
    try:
        for epoch in range(2):
            assert read_fifo(data_dir / f"tiny_{epoch}") == expected(server, made, epoch)
    finally:
        server.close()
    assert sum(store.reads.values()) == 0
