"""Three ways to average one flat gradient bucket over the ranks of a process group.

Each function replaces ``flat`` (a contiguous 1-D tensor) by its mean over all ranks, in
place, issues its collectives synchronously from the calling thread, and returns the bytes
this rank sent and received. With ``n`` elements of ``e`` bytes on ``N`` ranks:

=============  =====================================================  =====================
algorithm      how                                                    bytes each way, rank
=============  =====================================================  =====================
``ring``       ``all_reduce`` (gloo and NCCL both run a ring:          2(N-1)/N * n*e
               reduce-scatter then all-gather around the ranks)
``balanced``   SageMaker's balanced fusion buffer: split into N       2(N-1) * ceil(n/N)*e
               equal shards (zero-padded), ``all_to_all_single`` so
               rank i holds every rank's shard i, sum locally,
               ``all_gather`` the N reduced shards
``naive``      a parameter server on rank 0: everyone sends the       rank 0: (N-1) * n*e;
               whole bucket to rank 0, which sums and sends the       others: n*e
               mean back (two uneven ``all_to_all_single`` calls)
=============  =====================================================  =====================

Like DDP's own reduction, each divides by N *before* summing, so that fp16/bf16 gradients
cannot overflow in the sum and the ring variant matches DDP bit for bit.

``balanced`` deliberately avoids gloo's ``reduce_scatter``: measured on torch 2.13 it writes
2(N-1)/N * n*e per rank on its own, so reduce-scatter + all-gather would move 1.5x the
bytes of the all-to-all form. Every rank serves exactly one shard, so the load is the same
on every rank, which is the point of the balanced buffer; the naive server concentrates
(N-1)x the traffic on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import torch
import torch.distributed as dist

from trainport.distributed.trace import ByteCount

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Scratch",
    "balanced_average",
    "naive_average",
    "ring_average",
]

Group = dist.ProcessGroup | None

# Largest slice of a bucket reduced by one pair of collectives (see _in_pieces).
PIECE_BYTES = 4 * 2**20


class Scratch:
    """Reusable staging tensors, one per (role, size, dtype, device).

    Fresh multi-megabyte tensors cost page faults on every bucket; the communication thread
    reuses these instead. Not thread-safe: one per thread that reduces.
    """

    def __init__(self) -> None:
        self._tensors: dict[tuple[str, int, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, role: str, like: torch.Tensor, numel: int) -> torch.Tensor:
        key = (role, numel, like.dtype, like.device)
        tensor = self._tensors.get(key)
        if tensor is None:
            tensor = self._tensors[key] = like.new_empty(numel)
        return tensor


Reduce = Callable[[torch.Tensor, Group, Scratch | None], ByteCount]


class Algorithm(StrEnum):
    """Names of the reductions, as accepted by the hook and the benchmarks."""

    RING = "ring"
    BALANCED = "balanced"
    NAIVE = "naive"


def _all_gather(output: torch.Tensor, shard: torch.Tensor, group: Group) -> None:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecated the old
    # name; older torch (SageMaker's images) only has the old one.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, shard, group=group)


def ring_average(
    flat: torch.Tensor, group: Group = None, scratch: Scratch | None = None
) -> ByteCount:
    """Average with the backend's ring all-reduce."""
    world = dist.get_world_size(group)
    if world == 1:
        return ByteCount()
    flat.div_(world)
    dist.all_reduce(flat, group=group)
    chunk = -(-flat.numel() // world) * flat.element_size()
    wire = 2 * (world - 1) * chunk
    return ByteCount(sent=wire, received=wire, collectives=1)


def _in_pieces(
    piece: Callable[[torch.Tensor, Group, Scratch, int], ByteCount],
    flat: torch.Tensor,
    group: Group,
    scratch: Scratch | None,
) -> ByteCount:
    world = dist.get_world_size(group)
    if world == 1:
        return ByteCount()
    scratch = Scratch() if scratch is None else scratch
    flat.div_(world)
    # gloo's all-to-all slows down sharply once messages pass a few MB on a busy host
    # (64 MB on 3 ranks took 14x a ring all-reduce); pieces of PIECE_BYTES keep it linear.
    step = max(world, PIECE_BYTES // flat.element_size())
    total = ByteCount()
    for part in flat.split(step):
        count = piece(part, group, scratch, world)
        total = ByteCount(
            total.sent + count.sent,
            total.received + count.received,
            total.collectives + count.collectives,
        )
    return total


def balanced_average(
    flat: torch.Tensor, group: Group = None, scratch: Scratch | None = None
) -> ByteCount:
    """Average by the balanced sharded reduction: shard i is reduced by rank i."""
    return _in_pieces(_balanced_piece, flat, group, scratch)


def naive_average(
    flat: torch.Tensor, group: Group = None, scratch: Scratch | None = None
) -> ByteCount:
    """Average on a parameter server at rank 0 (the baseline the balanced buffer fixes)."""
    return _in_pieces(_naive_piece, flat, group, scratch)


def _balanced_piece(flat: torch.Tensor, group: Group, scratch: Scratch, world: int) -> ByteCount:
    n = flat.numel()
    shard = -(-n // world)
    if shard * world == n:
        padded = flat
    else:
        # Pad to N equal shards so every rank reduces (and sends) the same number of bytes.
        padded = scratch.get("padded", flat, shard * world)
        padded[:n].copy_(flat)
        padded[n:].zero_()
    received = scratch.get("received", flat, shard * world)
    dist.all_to_all_single(received, padded, group=group)
    # Row j holds rank j's copy of this rank's shard; summing rows in rank order makes the
    # result independent of which rank computes it.
    reduced = received.view(world, shard).sum(dim=0)
    # The local shards are no longer needed, so the reduced ones land straight in place.
    _all_gather(padded, reduced, group)
    if padded is not flat:
        flat.copy_(padded[:n])
    wire = 2 * (world - 1) * shard * flat.element_size()
    return ByteCount(sent=wire, received=wire, collectives=2)


def _naive_piece(flat: torch.Tensor, group: Group, scratch: Scratch, world: int) -> ByteCount:
    rank = dist.get_rank(group)
    n = flat.numel()
    nbytes = n * flat.element_size()
    empty = flat.new_empty(0)
    if rank == 0:
        # Gather: rank 0 receives every rank's whole bucket (its own arrives by local copy).
        stacked = scratch.get("stacked", flat, world * n)
        dist.all_to_all_single(stacked, flat, [n] * world, [n] + [0] * (world - 1), group=group)
        flat.copy_(stacked.view(world, n).sum(dim=0))
        # Scatter the mean back: one full copy to every other rank.
        outgoing = flat.repeat(world - 1)
        dist.all_to_all_single(empty, outgoing, [0] * world, [0] + [n] * (world - 1), group=group)
        wire = (world - 1) * nbytes
        return ByteCount(sent=wire, received=wire, collectives=2)
    dist.all_to_all_single(empty, flat, [0] * world, [n] + [0] * (world - 1), group=group)
    dist.all_to_all_single(flat, empty, [n] + [0] * (world - 1), [0] * world, group=group)
    return ByteCount(sent=nbytes, received=nbytes, collectives=2)


ALGORITHMS: dict[Algorithm, Reduce] = {
    Algorithm.RING: ring_average,
    Algorithm.BALANCED: balanced_average,
    Algorithm.NAIVE: naive_average,
}
