"""Mid-epoch resume with DataLoader worker processes: ``ChannelDataset``'s state saved and
restored through torchdata's ``StatefulDataLoader`` (which checkpoints each worker's copy of
the dataset), every record seen exactly once across the save and the restore."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import require_module
from tests.data.support import FifoProducer, make_records, write_records
from trainport.data import ChannelDataset, FileChannel, PipeChannel, encode_tfrecord

stateful_dataloader = require_module("torchdata.stateful_dataloader")
StatefulDataLoader = stateful_dataloader.StatefulDataLoader

# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

WORKERS = 2
BATCH = 4


def collate(batch: list[bytes]) -> list[bytes]:
    return batch


def loader(dataset: ChannelDataset, state: dict[str, Any] | None = None) -> Any:
    made = StatefulDataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=WORKERS,
        collate_fn=collate,
        multiprocessing_context="fork",
    )
    if state is not None:
        made.load_state_dict(state)
    return made


def checkpoint(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a job would keep it: through torch.save and back."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored: dict[str, Any] = torch.load(buffer, weights_only=False)
    return restored


def run_in_two_parts(make: Any, stop_after: int) -> tuple[list[bytes], list[bytes]]:
    """Read ``stop_after`` batches with one loader, save, and read the rest with a fresh
    loader (fresh dataset, fresh workers) restored from the saved state."""
    first = loader(make(0))
    before: list[bytes] = []
    iterator = iter(first)
    for _ in range(stop_after):
        before += next(iterator)
    state = checkpoint(first.state_dict())
    del iterator, first  # the first job's workers end here
    after: list[bytes] = []
    for batch in loader(make(1), state):
        after += batch
    return before, after


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, list[bytes]]:
    root = tmp_path / "train"
    everything: list[bytes] = []
    for i in range(6):
        records = make_records(f"f{i}", 17 + 5 * i)
        write_records(root / f"part-{i}.tfrecord", records)
        everything += records
    return root, everything


@pytest.mark.parametrize("shard_by", ["object", "record"])
@pytest.mark.parametrize("stop_after", [1, 9, 23])
def test_listed_channel_resumes_exactly_once_with_workers(
    files: tuple[Path, list[bytes]], shard_by: str, stop_after: int
) -> None:
    root, everything = files

    def make(_job: int) -> ChannelDataset:
        return ChannelDataset(FileChannel(root), shard_by=shard_by, shuffle_seed=11)

    before, after = run_in_two_parts(make, stop_after)
    assert len(before) == stop_after * BATCH
    assert Counter(before + after) == Counter(everything)  # none lost, none twice


def test_listed_channel_resume_then_next_epoch_is_whole(files: tuple[Path, list[bytes]]) -> None:
    root, everything = files
    dataset = ChannelDataset(FileChannel(root), shuffle_seed=5)
    first = loader(dataset)
    iterator = iter(first)
    seen = next(iterator) + next(iterator)
    state = checkpoint(first.state_dict())
    del iterator, first
    resumed = loader(ChannelDataset(FileChannel(root), shuffle_seed=5), state)
    rest = [r for batch in resumed for r in batch]
    assert Counter(seen + rest) == Counter(everything)
    # The same loader's next epoch starts from the beginning of epoch 1, not mid-epoch.
    next_epoch = [r for batch in resumed for r in batch]
    assert Counter(next_epoch) == Counter(everything)


def per_worker_producers(directory: Path, records: list[list[bytes]]) -> list[FifoProducer]:
    """The host agent's per-worker series ``train_w<k>_<epoch>``, one epoch each."""
    directory.mkdir()
    producers = []
    for k, mine in enumerate(records):
        payload = b"".join(encode_tfrecord(r) for r in mine)
        producer = FifoProducer(directory, f"train_w{k}", lambda _e, p=payload: p, 1)
        producer.start()
        producers.append(producer)
    return producers


@pytest.mark.parametrize("stop_after", [1, 6])
def test_pipe_channel_resumes_exactly_once_with_workers(tmp_path: Path, stop_after: int) -> None:
    # Worker k reads series k. A restarted job's FIFOs replay the epoch from its start; each
    # worker's dataset discards the records its checkpoint says it had handed out.
    records = [make_records(f"w{k}", 40 + 7 * k) for k in range(WORKERS)]
    everything = [r for mine in records for r in mine]
    started: list[FifoProducer] = []

    def make(job: int) -> ChannelDataset:
        directory = tmp_path / f"job{job}"
        started.extend(per_worker_producers(directory, records))
        return ChannelDataset(PipeChannel("train", directory, pipes=WORKERS, wait_timeout=30))

    try:
        before, after = run_in_two_parts(make, stop_after)
    finally:
        for producer in started:
            producer.stop()
    assert len(before) == stop_after * BATCH
    assert Counter(before + after) == Counter(everything)
