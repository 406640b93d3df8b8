"""ChannelDataset on Pipe channels: real FIFOs fed by a producer thread, epoch by epoch."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.utils.data

from tests.data.support import FifoProducer, make_records, wait_exists
from trainport.data import (
    ChannelDataset,
    ChannelWaitTimeout,
    DataError,
    PipeChannel,
    ReaderSlot,
    encode_recordio,
    encode_tfrecord,
)

Start = Callable[..., FifoProducer]


def epoch_records(tag: str, count: int = 50) -> Callable[[int], list[bytes]]:
    return lambda epoch: make_records(f"{tag}-e{epoch}", count)


def tfrecords(records: list[bytes]) -> bytes:
    return b"".join(encode_tfrecord(r) for r in records)


def test_epochs_in_order_with_wait_for_late_fifo(tmp_path: Path, fifo_producers: Start) -> None:
    records = epoch_records("a")
    producer = fifo_producers(tmp_path, "train", lambda e: tfrecords(records(e)), 3, 0.3)
    ds = ChannelDataset(PipeChannel("train", tmp_path, wait_timeout=20), slot=ReaderSlot())
    for epoch in range(3):
        assert ds.epoch == epoch
        assert list(ds) == records(epoch)
    producer.join(timeout=5)
    assert producer.done == [0, 1, 2] and producer.broken == []


def test_recordio_on_a_pipe(tmp_path: Path, fifo_producers: Start) -> None:
    records = [b"x" * 3, b"\x0a\x23\xd7\xce" * 2, b""]
    fifo_producers(tmp_path, "rio", lambda e: b"".join(encode_recordio(r) for r in records), 1)
    ds = ChannelDataset(PipeChannel("rio", tmp_path, wait_timeout=20), record_format="recordio")
    assert list(ds) == records


def test_early_close_ends_the_epoch_cleanly(tmp_path: Path, fifo_producers: Start) -> None:
    def big(epoch: int) -> list[bytes]:  # 6 MiB: more than the pipe and read buffers hold
        return [bytes([epoch, i % 256]) * 1024 for i in range(3000)]

    producer = fifo_producers(tmp_path, "train", lambda e: tfrecords(big(e)), 2)
    ds = ChannelDataset(PipeChannel("train", tmp_path, wait_timeout=20), slot=ReaderSlot())
    iterator = iter(ds)
    assert [next(iterator) for _ in range(3)] == big(0)[:3]
    iterator.close()
    assert ds.epoch == 1
    assert list(ds) == big(1)
    producer.join(timeout=5)
    assert producer.broken == [0] and producer.done == [1]


def test_wait_gives_up_after_timeout(tmp_path: Path) -> None:
    ds = ChannelDataset(PipeChannel("none", tmp_path, wait_timeout=0.2))
    with pytest.raises(ChannelWaitTimeout, match="none_0"):
        list(ds)


def test_regular_file_where_fifo_expected(tmp_path: Path) -> None:
    (tmp_path / "train_0").write_bytes(b"")
    with pytest.raises(DataError, match="not a FIFO"):
        list(ChannelDataset(PipeChannel("train", tmp_path, pipes=0, wait_timeout=1)))


def test_object_format_is_refused_on_pipes(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="concatenation"):
        ChannelDataset(PipeChannel("train", tmp_path), record_format="object")


def test_per_worker_pipes_two_ranks_read_disjoint_series(
    tmp_path: Path, fifo_producers: Start
) -> None:
    shard = {k: epoch_records(f"w{k}", 40) for k in range(2)}
    for k in range(2):
        fifo_producers(tmp_path, f"train_w{k}", lambda e, k=k: tfrecords(shard[k](e)), 2)
    results: dict[int, list[list[bytes]]] = {}

    def rank(r: int) -> None:
        slot = ReaderSlot(rank=r, world_size=2, local_rank=r, local_world_size=2)
        ds = ChannelDataset(PipeChannel("train", tmp_path, wait_timeout=20), slot=slot)
        results[r] = [list(ds) for _ in range(2)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for r in range(2):
        assert results[r] == [shard[r](0), shard[r](1)]


def test_one_reader_consumes_every_series_when_alone(tmp_path: Path, fifo_producers: Start) -> None:
    shard = {k: epoch_records(f"w{k}", 10) for k in range(3)}
    for k in range(3):
        fifo_producers(tmp_path, f"ch_w{k}", lambda e, k=k: tfrecords(shard[k](e)), 2)
    ds = ChannelDataset(PipeChannel("ch", tmp_path, pipes=3, wait_timeout=20), slot=ReaderSlot())
    for epoch in range(2):
        assert list(ds) == shard[0](epoch) + shard[1](epoch) + shard[2](epoch)


def test_early_close_also_releases_series_not_yet_reached(
    tmp_path: Path, fifo_producers: Start
) -> None:
    shard = {k: epoch_records(f"w{k}", 10) for k in range(2)}
    for k in range(2):
        fifo_producers(tmp_path, f"ch_w{k}", lambda e, k=k: tfrecords(shard[k](e)), 2)
    ds = ChannelDataset(PipeChannel("ch", tmp_path, pipes=2, wait_timeout=20), slot=ReaderSlot())
    iterator = iter(ds)
    next(iterator)
    iterator.close()
    # Both series moved on to epoch 1, so this does not hang on series 1's epoch 0.
    assert list(ds) == shard[0](1) + shard[1](1)


def test_dataloader_workers_each_read_their_own_pipe(tmp_path: Path, fifo_producers: Start) -> None:
    shard = {k: epoch_records(f"w{k}", 30) for k in range(2)}
    for k in range(2):
        fifo_producers(tmp_path, f"train_w{k}", lambda e, k=k: tfrecords(shard[k](e)), 1)
    ds = ChannelDataset(PipeChannel("train", tmp_path, pipes=2, wait_timeout=20))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = list(loader)
    assert sorted(got) == sorted(shard[0](0) + shard[1](0))
    assert len(got) == len(set(got))


def test_dataloader_workers_share_one_fifo_without_deadlock(
    tmp_path: Path, fifo_producers: Start
) -> None:
    records = epoch_records("solo", 60)
    fifo_producers(tmp_path, "train", lambda e: tfrecords(records(e)), 1)
    # As in SageMaker, epoch 0's FIFO exists before the training code builds its dataset.
    wait_exists(tmp_path / "train_0")
    ds = ChannelDataset(PipeChannel("train", tmp_path, wait_timeout=20))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert list(loader) == records(0)  # worker 0 reads it all, worker 1 nothing


def test_resume_after_restart_replays_and_skips(tmp_path: Path, fifo_producers: Start) -> None:
    records = epoch_records("r", 30)
    first = tmp_path / "first"
    first.mkdir()
    fifo_producers(first, "train", lambda e: tfrecords(records(e)), 2)
    ds = ChannelDataset(PipeChannel("train", first, wait_timeout=20), slot=ReaderSlot())
    assert list(ds) == records(0)
    iterator = iter(ds)
    seen = [next(iterator) for _ in range(12)]
    state = ds.state_dict()
    assert state["epoch"] == 1 and state["records"] == 12
    iterator.close()

    # The restarted job: FIFOs begin at <channel>_0 again, replaying the epoch being read.
    second = tmp_path / "second"
    second.mkdir()
    fifo_producers(second, "train", lambda e: tfrecords(records(e + 1)), 1)
    resumed = ChannelDataset(PipeChannel("train", second, wait_timeout=20), slot=ReaderSlot())
    resumed.load_state_dict(state)
    assert resumed.epoch == 1
    assert seen + list(resumed) == records(1)


def test_fifo_reads_ask_for_what_the_pipe_holds(tmp_path: Path) -> None:
    # read(n) is capped at what the pipe holds (no shrinking of a large buffer), yet a read
    # of less than that, a blocking read on an empty pipe and read() to EOF behave as usual.
    path = tmp_path / "train_0"
    os.mkfifo(path)
    channel = PipeChannel("train", tmp_path, wait_timeout=20)
    writer_ready = threading.Event()
    release = threading.Event()

    def write() -> None:
        with open(path, "wb", buffering=0) as f:
            f.write(b"a" * 3000)
            writer_ready.set()
            release.wait(10)
            f.write(b"b" * 5000)

    thread = threading.Thread(target=write)
    thread.start()
    with channel.open_fifo(path) as raw:  # type: ignore[attr-defined]
        writer_ready.wait(10)
        assert raw.read(100) == b"a" * 100
        assert raw.read(1 << 20) == b"a" * 2900
        release.set()
        assert raw.read() == b"b" * 5000
        assert raw.read(10) == b""
    thread.join(10)
