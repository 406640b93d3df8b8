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

``balanced`` runs through a :class:`BalancedStream`, which leaves each all-gather in flight
while the next slice's all-to-all runs; buckets are cut into slices of at most
``PIECE_BYTES`` (see :func:`pieces`).

Like DDP's own reduction, each divides by N *before* summing, so that fp16/bf16 gradients
cannot overflow in the sum and the ring variant matches DDP bit for bit.

``balanced`` deliberately avoids gloo's ``reduce_scatter``: measured on torch 2.13 it writes
2(N-1)/N * n*e per rank on its own, so reduce-scatter + all-gather would move 1.5x the
bytes of the all-to-all form. Every rank serves exactly one shard, so the load is the same
on every rank, which is the point of the balanced buffer; the naive server concentrates
(N-1)x the traffic on rank 0.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist

from trainport.distributed.trace import ByteCount

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BalancedStream",
    "Scratch",
    "balanced_average",
    "naive_average",
    "ring_average",
]

Group = dist.ProcessGroup | None

# Largest slice of a bucket reduced by one pair of collectives (see pieces()).
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


def _all_gather(output: torch.Tensor, shard: torch.Tensor, group: Group) -> dist.Work:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecated the old
    # name; older torch (SageMaker's images) only has the old one.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    work: dist.Work = gather(output, shard, group=group, async_op=True)
    return work


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
    total = ByteCount()
    for part in pieces(flat, world):
        total = _add(total, piece(part, group, scratch, world))
    return total


def balanced_average(
    flat: torch.Tensor, group: Group = None, scratch: Scratch | None = None
) -> ByteCount:
    """Average by the balanced sharded reduction: shard i is reduced by rank i."""
    stream = BalancedStream(group, scratch)
    total = ByteCount()
    for piece in pieces(flat, stream.world):
        total = _add(total, stream.push(piece))
    stream.flush()
    return total


def naive_average(
    flat: torch.Tensor, group: Group = None, scratch: Scratch | None = None
) -> ByteCount:
    """Average on a parameter server at rank 0 (the baseline the balanced buffer fixes)."""
    return _in_pieces(_naive_piece, flat, group, scratch)


Done = Callable[[BaseException | None], None]


@dataclass
class _Gather:
    """An all-gather in flight and what to do once it lands."""

    work: dist.Work
    padded: torch.Tensor
    flat: torch.Tensor
    reduced: torch.Tensor  # the gather's input: kept alive until it completes
    done: Done | None


class BalancedStream:
    """The balanced reduction of a sequence of tensors, pipelined.

    :meth:`push` divides a tensor by N, exchanges its shards (``all_to_all_single``, waited
    for), sums this rank's shard and *starts* the ``all_gather``, so one tensor's all-gather
    runs while the next one's all-to-all does: the gaps between the all-gather's dependent
    ring steps are filled with other traffic. At most ``depth`` all-gathers are in flight.
    Collectives are issued in push order, identical on every rank, whatever the timing;
    ``done`` callbacks run in push order on the pushing thread, from a later :meth:`push`
    or from :meth:`flush`.
    """

    def __init__(self, group: Group = None, scratch: Scratch | None = None, depth: int = 2):
        self.group = group
        self.world = dist.get_world_size(group)
        self.scratch = Scratch() if scratch is None else scratch
        self.depth = depth
        self._pending: deque[_Gather] = deque()
        self._slot = 0

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def push(self, flat: torch.Tensor, done: Done | None = None) -> ByteCount:
        """Start averaging ``flat`` in place; ``done(None)`` once it holds the mean."""
        world = self.world
        if world == 1:
            if done is not None:
                done(None)
            return ByteCount()
        while len(self._pending) >= self.depth:
            self._finish(self._pending.popleft())
        flat.div_(world)
        n = flat.numel()
        shard = -(-n // world)
        if shard * world == n:
            padded = flat
        else:
            # Pad to N equal shards so every rank reduces (and sends) the same number of
            # bytes. A padded buffer stays busy until its all-gather lands, and at most
            # depth - 1 others are in flight now, so depth buffers in rotation suffice.
            padded = self.scratch.get(f"padded{self._slot}", flat, shard * world)
            self._slot = (self._slot + 1) % self.depth
            padded[:n].copy_(flat)
            padded[n:].zero_()
        # Free again as soon as the sum below has copied this rank's shard out.
        received = self.scratch.get("received", flat, shard * world)
        dist.all_to_all_single(received, padded, group=self.group)
        # Row j holds rank j's copy of this rank's shard; summing rows in rank order makes
        # the result independent of which rank computes it.
        reduced = received.view(world, shard).sum(dim=0)
        # The local shards are no longer needed, so the reduced ones land straight in place.
        work = _all_gather(padded, reduced, self.group)
        self._pending.append(_Gather(work, padded, flat, reduced, done))
        wire = 2 * (world - 1) * shard * flat.element_size()
        return ByteCount(sent=wire, received=wire, collectives=2)

    def _finish(self, gather: _Gather) -> None:
        try:
            gather.work.wait()
        except Exception as exc:
            # Already out of the queue, so fail() would not reach it: report it here.
            if gather.done is not None:
                gather.done(exc)
            raise
        if gather.padded is not gather.flat:
            gather.flat.copy_(gather.padded[: gather.flat.numel()])
        if gather.done is not None:
            gather.done(None)

    def flush(self) -> None:
        """Wait for every all-gather in flight and run their callbacks."""
        while self._pending:
            self._finish(self._pending.popleft())

    def fail(self, error: BaseException) -> None:
        """Give up on everything in flight, passing ``error`` to each callback."""
        pending, self._pending = self._pending, deque()
        for gather in pending:
            if gather.done is not None:
                gather.done(error)


def pieces(flat: torch.Tensor, world: int) -> tuple[torch.Tensor, ...]:
    """``flat`` in consecutive views of at most PIECE_BYTES (but at least N elements).

    gloo's all-to-all slows down sharply once messages pass a few MB on a busy host (64 MB
    on 3 ranks took 14x a ring all-reduce); pieces of a few MB keep it linear.
    """
    step = max(world, PIECE_BYTES // flat.element_size())
    return flat.split(step)


def _add(a: ByteCount, b: ByteCount) -> ByteCount:
    return ByteCount(a.sent + b.sent, a.received + b.received, a.collectives + b.collectives)


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
