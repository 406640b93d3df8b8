"""ChannelDataset on File channels: sharding exactly once, shuffling, resume, corruption."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch.utils.data

from tests.data.support import make_records, write_records
from trainport.data import (
    ChannelDataset,
    CorruptRecordError,
    DataError,
    FileChannel,
    PipeChannel,
    ReaderSlot,
    ThroughputMeter,
)


@pytest.fixture
def channel(tmp_path: Path) -> tuple[Path, list[bytes]]:
    root = tmp_path / "train"
    everything: list[bytes] = []
    for i in range(5):
        records = make_records(f"f{i}", 20 + 3 * i)
        write_records(root / ("sub" if i % 2 else "") / f"part-{i}.tfrecord", records)
        everything += records
    return root, everything


def slots(world: int, workers: int) -> list[ReaderSlot]:
    return [
        ReaderSlot(
            rank=r,
            world_size=world,
            worker=w,
            num_workers=workers,
            local_rank=r,
            local_world_size=world,
        )
        for r in range(world)
        for w in range(workers)
    ]


def test_reads_every_record_in_sorted_file_order(channel: tuple[Path, list[bytes]]) -> None:
    root, everything = channel
    ds = ChannelDataset.from_uri(root, slot=ReaderSlot())
    names = [o.name for o in FileChannel(root).list_objects()]
    assert names == sorted(names)
    assert Counter(ds) == Counter(everything)


@pytest.mark.parametrize("shard_by", ["object", "record", "auto"])
@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 1), (2, 3), (3, 4)])
def test_every_record_goes_to_exactly_one_reader_each_epoch(
    channel: tuple[Path, list[bytes]], shard_by: str, world: int, workers: int
) -> None:
    root, everything = channel
    readers = [
        ChannelDataset.from_uri(root, shard_by=shard_by, shuffle_seed=7, slot=s)
        for s in slots(world, workers)
    ]
    orders = []
    for _epoch in range(2):
        got: list[bytes] = []
        for ds in readers:
            got += list(ds)
        assert Counter(got) == Counter(everything)  # exactly once: no loss, no duplicate
        orders.append(got)
    assert orders[0] != orders[1]  # shuffled differently each epoch


def test_shuffle_is_a_function_of_seed_and_epoch(channel: tuple[Path, list[bytes]]) -> None:
    root, _ = channel
    a = ChannelDataset.from_uri(root, shuffle_seed=3, slot=ReaderSlot())
    b = ChannelDataset.from_uri(root, shuffle_seed=3, slot=ReaderSlot())
    b.set_epoch(1)
    first_a, second_a = list(a), list(a)
    assert list(b) == second_a and first_a != second_a


def test_real_dataloader_workers_exactly_once(channel: tuple[Path, list[bytes]]) -> None:
    root, everything = channel
    ds = ChannelDataset.from_uri(root, shard_by="record")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert Counter(loader) == Counter(everything)


def test_rank_from_environment(
    channel: tuple[Path, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, everything = channel
    got: list[bytes] = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        got += list(ChannelDataset.from_uri(root))
    assert Counter(got) == Counter(everything)


@pytest.mark.parametrize("shard_by", ["object", "record"])
def test_resume_mid_epoch_gives_identical_next_records(
    channel: tuple[Path, list[bytes]], shard_by: str
) -> None:
    root, _ = channel
    slot = ReaderSlot(rank=1, world_size=2, local_rank=1, local_world_size=2)

    def make() -> ChannelDataset:
        return ChannelDataset.from_uri(root, shard_by=shard_by, shuffle_seed=1, slot=slot)

    reference = make()
    list(reference)
    expected = list(reference)  # epoch 1, uninterrupted

    ds = make()
    list(ds)
    iterator = iter(ds)
    head = [next(iterator) for _ in range(17)]
    state = json.loads(json.dumps(ds.state_dict()))  # checkpoints survive JSON
    resumed = make()
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
    assert resumed.epoch == 2


def test_resume_with_other_topology_is_refused(channel: tuple[Path, list[bytes]]) -> None:
    root, _ = channel
    state = ChannelDataset.from_uri(root, slot=ReaderSlot()).state_dict()
    other = ChannelDataset.from_uri(root, slot=slots(2, 1)[1])
    with pytest.raises(DataError, match="same number of ranks"):
        other.load_state_dict(state)


def test_corrupt_file_names_path_and_offset(tmp_path: Path) -> None:
    records = make_records("c", 10)
    path = write_records(tmp_path / "ch" / "a.tfrecord", records)
    data = bytearray(path.read_bytes())
    offset = sum(16 + len(r) for r in records[:4])
    data[offset + 13] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as info:
        list(ChannelDataset.from_uri(tmp_path / "ch", slot=ReaderSlot()))
    assert info.value.source == str(path) and info.value.offset == offset
    ds = ChannelDataset.from_uri(tmp_path / "ch", max_corrupt=1, slot=ReaderSlot())
    assert list(ds) == records[:4] + records[5:]
    assert ds.corrupt_skipped == 1


def test_object_format_and_transform(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"img{i}.bin").write_bytes(b"pixels%d" % i)
    ds = ChannelDataset.from_uri(tmp_path, record_format="object", transform=len, slot=ReaderSlot())
    assert list(ds) == [7, 7, 7]


def test_from_channel_follows_inputdataconfig(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "inputdataconfig.json").write_text(
        json.dumps(
            {
                "train": {"TrainingInputMode": "File", "RecordWrapperType": "RecordIO"},
                "eval": {"TrainingInputMode": "Pipe"},
            }
        )
    )
    records = make_records("t", 5)
    write_records(tmp_path / "data" / "train" / "x.rec", records, fmt="recordio")
    train = ChannelDataset.from_channel("train", input_dir=tmp_path, slot=ReaderSlot())
    assert isinstance(train.source, FileChannel) and train.record_format == "recordio"
    assert list(train) == records
    evaluation = ChannelDataset.from_channel("eval", input_dir=tmp_path)
    assert isinstance(evaluation.source, PipeChannel)
    assert evaluation.source.directory == tmp_path / "data"


def test_meter_counts_records_and_bytes(channel: tuple[Path, list[bytes]]) -> None:
    root, everything = channel
    meter = ThroughputMeter()
    list(ChannelDataset.from_uri(root, meter=meter, slot=ReaderSlot()))
    total = meter.total()
    assert total.records == len(everything)
    assert total.bytes == sum(map(len, everything))
    assert total.stalled_seconds >= 0


def test_empty_channel_is_an_error(tmp_path: Path) -> None:
    os.mkdir(tmp_path / "empty")
    with pytest.raises(DataError, match="no objects"):
        list(ChannelDataset.from_uri(tmp_path / "empty"))
