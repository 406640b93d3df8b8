"""Which reader gets which data: pure functions, so every reader computes the same answer.

A *reader* is one (rank, DataLoader worker) pair (:class:`~trainport.data.topology.ReaderSlot`).
Every record of an epoch goes to exactly one reader:

File and ``s3://`` channels (a list of objects every reader can open):

- ``object`` sharding: the epoch's object order (sorted keys, or a shuffle that is a pure
  function of seed and epoch) is dealt round-robin, reader ``s`` of ``S`` taking positions
  ``s, s+S, ...``. Cheap (each object is read once), balanced by object count.
- ``record`` sharding: every reader walks all objects in the same order and keeps records
  whose running index ``i`` has ``i % S == s``. Balanced by record count even with fewer
  objects than readers, at the price of every reader reading everything.
- ``auto`` (default): ``object`` when there are at least as many objects as readers.

Pipe channels (FIFOs on the host, each readable by one process only). A FIFO cannot be
shared: two processes opening one split its bytes arbitrarily, or one blocks forever (the
deadlock of two ranks sharing one channel). So FIFO *series* are assigned whole to readers
on the same host:

- one series ``<channel>_<epoch>``: read by local rank 0, DataLoader worker 0 only; every
  other reader of that host gets nothing (and is told so in the log). Exactly-once, no
  deadlock, but no parallel reading: use per-worker pipes for more.
- per-worker pipes, ``P`` series ``<channel>_w<k>_<epoch>`` with disjoint shards produced by
  the platform: series ``k`` belongs to local rank ``k % L`` (``L`` processes on the host), and
  that rank's ``j``-th series (``j = k // L``) to DataLoader worker ``j % N``. With
  ``P = L`` each rank reads its own series in worker 0; with ``P = L * N`` every worker
  has its own. Across hosts, disjointness is the platform's ShardedByS3Key.
"""

from __future__ import annotations

import random
from enum import StrEnum

from trainport.data.errors import DataError
from trainport.data.topology import ReaderSlot

__all__ = [
    "ShardBy",
    "epoch_order",
    "keeps_record",
    "objects_for_reader",
    "pipe_series_for",
    "resolve_shard_by",
]


class ShardBy(StrEnum):
    """How a listed channel's records are dealt to readers (see the module docstring)."""

    AUTO = "auto"
    OBJECT = "object"
    RECORD = "record"


def resolve_shard_by(shard_by: ShardBy | str, num_objects: int, num_shards: int) -> ShardBy:
    """Turn ``auto`` into a concrete policy for this many objects and readers."""
    try:
        policy = ShardBy(shard_by)
    except ValueError:
        raise DataError(
            f"unknown shard_by {shard_by!r}; choose one of {[m.value for m in ShardBy]}"
        ) from None
    if policy is ShardBy.AUTO:
        return ShardBy.OBJECT if num_objects >= num_shards else ShardBy.RECORD
    return policy


def epoch_order(num_objects: int, epoch: int, seed: int | None) -> list[int]:
    """Object positions in reading order: sorted, or shuffled from (seed, epoch).

    The shuffle is identical on every reader and rerun (it seeds its own generator from a
    string, which ``random`` hashes stably) and different every epoch.
    """
    order = list(range(num_objects))
    if seed is not None:
        random.Random(f"trainport.data:{seed}:{epoch}").shuffle(order)
    return order


def objects_for_reader(order: list[int], shard: int, num_shards: int) -> list[int]:
    """The positions reader ``shard`` of ``num_shards`` reads under object sharding."""
    return order[shard::num_shards]


def keeps_record(index: int, shard: int, num_shards: int) -> bool:
    """Whether reader ``shard`` keeps the epoch's record ``index`` under record sharding."""
    return index % num_shards == shard


def pipe_series_for(slot: ReaderSlot, num_series: int) -> list[int | None]:
    """The FIFO series this reader consumes, in order; ``None`` is the one shared series.

    ``num_series == 0`` means the channel has the single series ``<channel>_<epoch>``.
    """
    if num_series < 0:
        raise DataError(f"number of per-worker pipes must be >= 0, got {num_series}")
    if num_series == 0:
        return [None] if slot.local_rank == 0 and slot.worker == 0 else []
    local = slot.local_world_size
    mine: list[int | None] = []
    for k in range(num_series):
        if k % local == slot.local_rank and (k // local) % slot.num_workers == slot.worker:
            mine.append(k)
    return mine
