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

``balanced`` runs through a :class:`BalancedStream`, which keeps several slices' all-to-alls
and all-gathers in flight at once; buckets are cut into near-equal slices of about
``PIECE_BYTES`` (see :func:`pieces`). On gloo both halves are point-to-point messages
with every receive posted first (the same bytes; see :func:`default_transport`), on NCCL
they are ``all_to_all_single`` and ``all_gather_into_tensor``.

Like DDP's own reduction, each divides by N *before* summing, so that fp16/bf16 gradients
cannot overflow in the sum and the ring variant matches DDP bit for bit.

``balanced`` deliberately avoids gloo's ``reduce_scatter``: measured on torch 2.13 it writes
2(N-1)/N * n*e per rank on its own, so reduce-scatter + all-gather would move 1.5x the
bytes of the all-to-all form. Every rank serves exactly one shard, so the load is the same
on every rank, which is the point of the balanced buffer; the naive server concentrates
(N-1)x the traffic on rank 0.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import torch
import torch.distributed as dist

from trainport.distributed.process_group import device_backend
from trainport.distributed.trace import ByteCount

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BalancedStream",
    "Scratch",
    "Transport",
    "balanced_average",
    "naive_average",
    "ring_average",
    "ring_bytes",
]

Group = dist.ProcessGroup | None

# Largest slice of a bucket reduced by one pair of collectives, and how short tensors are
# cut (see pieces()).
PIECE_BYTES = 1 * 2**20
MIN_PIECES = 4
MIN_SHARD_BYTES = 128 * 2**10


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
    # Within each host, then balanced across hosts (see hierarchy.py; the hook only).
    HIERARCHICAL = "hierarchical"


class Transport(StrEnum):
    """How a slice's shards travel (both halves of ``balanced``)."""

    P2P = "p2p"  # point-to-point sends and receives, every receive posted first
    COLLECTIVES = "collectives"  # all_to_all_single, then all_gather_into_tensor


def default_transport(group: Group, device_type: str = "cpu") -> Transport:
    """``p2p`` where gloo carries ``device_type`` tensors, ``collectives`` elsewhere (NCCL).

    gloo's TCP transport writes a message only once the peer has announced the matching
    receive, and the announcement travels on the same ordered stream as data. Its
    all-to-all posts each send before the receive from the same peer, so the two
    directions of a pair take turns, and its all-gather is a ring of N-1 dependent steps,
    each such a rendezvous. Posting every receive of a slice first, the all-gather's too,
    sends all announcements ahead of the data, so both directions of every pair flow at
    once and each half is a single round. The bytes are the same: (N-1) x shard each way
    per half. Measured on 4 namespace hosts at 100 Mbit/s, one reduction of 4 MiB: gloo's
    ring all-reduce 533 ms (the link's limit is 503), all-to-all + all-to-all 916 ms,
    point-to-point 558 ms. NCCL's all-to-all is itself grouped point-to-point and its
    all-gather a pipelined ring, so the collectives are kept there.
    """
    return Transport.P2P if carrier(group, device_type) == "gloo" else Transport.COLLECTIVES


def carrier(group: Group, device_type: str) -> str:
    """The backend of ``group`` that carries ``device_type`` tensors (see device maps)."""
    return device_backend(str(dist.get_backend(group)), device_type)


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
    return ring_bytes(flat, world)


def ring_bytes(flat: torch.Tensor, world: int) -> ByteCount:
    """What a ring all-reduce of ``flat`` over ``world`` ranks moves for each rank."""
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
        total += piece(part, group, scratch, world)
    return total


def balanced_average(
    flat: torch.Tensor,
    group: Group = None,
    scratch: Scratch | None = None,
    transport: Transport | str | None = None,
) -> ByteCount:
    """Average by the balanced sharded reduction: shard i is reduced by rank i."""
    stream = BalancedStream(group, scratch, transport=transport)
    total = ByteCount()
    try:
        for piece in pieces(flat, stream.world):
            total += stream.push(piece)
        stream.flush()
    finally:
        stream.close()
    return total


def naive_average(
    flat: torch.Tensor, group: Group = None, scratch: Scratch | None = None
) -> ByteCount:
    """Average on a parameter server at rank 0 (the baseline the balanced buffer fixes)."""
    return _in_pieces(_naive_piece, flat, group, scratch)


Done = Callable[[BaseException | None], None]


@dataclass
class _Exchange:
    """A slice's first half in flight: its shards travelling to the ranks that reduce them."""

    works: list[dist.Work]  # what to wait for before summing (the receives)
    padded: torch.Tensor
    flat: torch.Tensor
    received: torch.Tensor
    shard: int
    done: Done | None
    tag: int = 0
    later: list[dist.Work] = field(default_factory=list)  # sends, the gather's receives
    reported: bool = False


@dataclass
class _Gather:
    """A slice's second half in flight: the reduced shards coming back to every rank."""

    works: list[dist.Work]
    padded: torch.Tensor
    flat: torch.Tensor
    reduced: torch.Tensor  # the gather's input: kept alive until it completes
    done: Done | None
    landed: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    reported: bool = False


class BalancedStream:
    """The balanced reduction of a sequence of tensors, pipelined.

    :meth:`push` divides a tensor by N and *starts* its exchange (the all-to-all that
    brings shard i to rank i); up to ``ahead`` exchanges are left in flight. The oldest one
    is then completed (waited for, this rank's shard summed) and its gather started (every
    rank's reduced shard to every rank), with up to ``depth`` gathers in flight.
    :meth:`settle` completes every exchange in flight (starting their gathers);
    :meth:`flush` also waits for every gather to land. ``transport`` (see
    :func:`default_transport`) is point-to-point on gloo, collectives on NCCL.

    Why several exchanges in flight: on gloo's collectives the two directions of a pair
    take turns within one all-to-all (see :func:`default_transport`; one 16 MB
    all-to-all on 2 ranks used 0.49 of a 1000 Mbit/s link); with several slices at once the
    announcements for later slices are queued while earlier data flows. Point-to-point
    posts every receive first and does not depend on that, but slices still bound staging
    memory and let one slice's gather overlap the next one's exchange.

    Operations are issued in an order that depends only on the sequence of push, settle
    and flush calls, identical on every rank whatever the timing; point-to-point messages
    carry a tag from a counter that advances the same way on every rank. A gather of CPU
    tensors lands on a landing thread, so this thread never blocks on one while it could
    start the next slice; CUDA tensors are finished on this thread (by :meth:`wait` or
    when more than ``depth`` are in flight), on its stream. Each ``done`` callback runs
    exactly once: as the slice lands (slices may land out of order on NCCL) or with the
    error when an operation fails.
    """

    def __init__(
        self,
        group: Group = None,
        scratch: Scratch | None = None,
        depth: int = 8,
        ahead: int = 32,
        transport: Transport | str | None = None,
    ):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.scratch = Scratch() if scratch is None else scratch
        self.depth = max(1, depth)
        self.ahead = max(0, ahead)
        # Chosen by the first tensor's device unless given: a device-mapped group carries
        # CPU tensors on gloo and CUDA tensors on NCCL.
        self._transport = None if transport is None else Transport(transport)
        self._peers = [_global_rank(group, j) for j in range(self.world)]
        self._tag = 0
        self._report_lock = threading.Lock()
        self._exchanging: deque[_Exchange] = deque()
        self._pending: deque[_Gather] = deque()
        self._received_slot = 0
        self._padded_slot = 0
        self._reduced_slot = 0
        self._landing: queue.SimpleQueue[_Gather | None] | None = None

    def push(self, flat: torch.Tensor, done: Done | None = None) -> ByteCount:
        """Start averaging ``flat`` in place; ``done(None)`` once it holds the mean."""
        world = self.world
        if world == 1:
            if done is not None:
                done(None)
            return ByteCount()
        flat.div_(world)
        n = flat.numel()
        shard = -(-n // world)
        if shard * world == n:
            padded = flat
        else:
            # Pad to N equal shards so every rank reduces (and sends) the same number of
            # bytes. A padded buffer stays busy until its gather lands: at most
            # ahead + depth others are alive now, so that many + 1 buffers in rotation.
            padded = self._staging("padded", self._padded_slot, flat, shard * world)
            self._padded_slot = (self._padded_slot + 1) % (self.ahead + self.depth + 1)
            padded[:n].copy_(flat)
            padded[n:].zero_()
        # Free again once this exchange has been summed; at most `ahead` others are
        # unsummed now.
        received = self._staging("received", self._received_slot, flat, shard * world)
        self._received_slot = (self._received_slot + 1) % (self.ahead + 1)
        if self._transport is None:
            self._transport = default_transport(self.group, flat.device.type)
        if self._transport is Transport.P2P:
            exchange = self._exchange_p2p(padded, flat, received, shard, done)
        else:
            work = dist.all_to_all_single(received, padded, group=self.group, async_op=True)
            assert work is not None
            exchange = _Exchange([work], padded, flat, received, shard, done)
        self._exchanging.append(exchange)
        while len(self._exchanging) > self.ahead:
            self._gather(self._exchanging.popleft())
        wire = 2 * (world - 1) * shard * flat.element_size()
        return ByteCount(sent=wire, received=wire, collectives=2)

    def _exchange_p2p(
        self,
        padded: torch.Tensor,
        flat: torch.Tensor,
        received: torch.Tensor,
        shard: int,
        done: Done | None,
    ) -> _Exchange:
        tag = self._tag
        self._tag = (self._tag + 2) % _TAGS
        rows = received.view(self.world, shard)
        chunks = padded.view(self.world, shard)
        others = [j for j in range(self.world) if j != self.rank]
        # Every receive first, the gather's too: their announcements then go out ahead of
        # any data. The gather's land in `padded` over chunks this rank is still sending,
        # which is safe: rank j sends its reduced chunk j only after it has received all
        # of this rank's chunk j.
        receives = [self._recv(rows[j], j, tag) for j in others]
        later = [self._recv(chunks[j], j, tag + 1) for j in others]
        rows[self.rank].copy_(chunks[self.rank])
        later += [self._send(chunks[j], j, tag) for j in others]
        return _Exchange(receives, padded, flat, received, shard, done, tag, later)

    def _recv(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work:
        work = dist.irecv(tensor, src=self._peers[peer], group=self.group, tag=tag)
        assert work is not None
        return work

    def _send(self, tensor: torch.Tensor, peer: int, tag: int) -> dist.Work:
        work = dist.isend(tensor, dst=self._peers[peer], group=self.group, tag=tag)
        assert work is not None
        return work

    def _staging(self, role: str, slot: int, like: torch.Tensor, numel: int) -> torch.Tensor:
        # One buffer per slot whatever the slice size (a slice is at most PIECE_BYTES but
        # the last one of a bucket is shorter), so staging stays bounded by the slot count.
        size = max(numel, PIECE_BYTES // like.element_size() + self.world)
        return self.scratch.get(f"{role}{slot}", like, size)[:numel]

    def _gather(self, exchange: _Exchange) -> None:
        """Wait for an exchange, sum this rank's shard, start its gather."""
        try:
            for work in exchange.works:
                work.wait()
        except Exception as exc:
            self._report(exchange, exc)
            raise
        while self._pending and self._pending[0].landed.is_set():
            self._finish(self._pending.popleft())
        while len(self._pending) >= self.depth:
            self._finish(self._pending.popleft())
        # Row j holds rank j's copy of this rank's shard; summing rows in rank order makes
        # the result independent of which rank computes it.
        rows = exchange.received.view(self.world, exchange.shard)
        if self._transport is Transport.P2P:
            # Alive until the sends complete; at most `depth` other gathers are in flight.
            reduced = self._staging("reduced", self._reduced_slot, exchange.flat, exchange.shard)
            self._reduced_slot = (self._reduced_slot + 1) % (self.depth + 1)
            torch.sum(rows, dim=0, out=reduced)
            chunks = exchange.padded.view(self.world, exchange.shard)
            chunks[self.rank].copy_(reduced)
            others = [j for j in range(self.world) if j != self.rank]
            sends = [self._send(reduced, j, exchange.tag + 1) for j in others]
            works = exchange.later + sends
        else:
            reduced = rows.sum(dim=0)
            # The local shards are no longer needed, so the reduced ones land in place.
            works = [_all_gather(exchange.padded, reduced, self.group)]
        gather = _Gather(works, exchange.padded, exchange.flat, reduced, exchange.done)
        self._pending.append(gather)
        if not exchange.flat.is_cuda:
            self._land_later(gather)

    def _land_later(self, gather: _Gather) -> None:
        if self._landing is None:
            self._landing = queue.SimpleQueue()
            threading.Thread(
                target=self._land_each,
                args=(self._landing,),
                name="trainport-landing",
                daemon=True,
            ).start()
        self._landing.put(gather)

    def _land_each(self, landing: queue.SimpleQueue[_Gather | None]) -> None:
        # Gathers land in about the order they started, so one thread waiting in that
        # order finishes each soon after it lands.
        while (gather := landing.get()) is not None:
            self._land(gather)

    def _land(self, gather: _Gather) -> None:
        try:
            for work in gather.works:
                work.wait()
            if gather.padded is not gather.flat:
                gather.flat.copy_(gather.padded[: gather.flat.numel()])
        except Exception as exc:
            gather.error = exc
        self._report(gather, gather.error)
        gather.landed.set()

    def _report(self, item: _Exchange | _Gather, error: BaseException | None) -> None:
        """Run ``item``'s callback, once, whichever of landing or fail() gets there."""
        with self._report_lock:
            if item.reported:
                return
            item.reported = True
        if item.done is not None:
            item.done(error)

    def _finish(self, gather: _Gather) -> None:
        """Wait until ``gather`` has landed (and reported); raise its error, if any."""
        if gather.flat.is_cuda:
            self._land(gather)
        else:
            gather.landed.wait()
        if gather.error is not None:
            raise gather.error

    def settle(self) -> None:
        """Complete every exchange in flight, starting its gather."""
        while self._exchanging:
            self._gather(self._exchanging.popleft())

    def wait(self) -> None:
        """Wait for every gather in flight to land (issues nothing)."""
        while self._pending:
            self._finish(self._pending.popleft())

    def flush(self) -> None:
        """Complete everything in flight: :meth:`settle`, then :meth:`wait`."""
        self.settle()
        self.wait()

    def fail(self, error: BaseException) -> None:
        """Give up on everything in flight, passing ``error`` to each callback."""
        exchanging, self._exchanging = self._exchanging, deque()
        pending, self._pending = self._pending, deque()
        # Push order: every gather in flight is older than every exchange.
        items: list[_Exchange | _Gather] = [*pending, *exchanging]
        for item in items:
            self._report(item, error)

    def close(self) -> None:
        """Stop the landing thread (after :meth:`flush`)."""
        if self._landing is not None:
            self._landing.put(None)
            self._landing = None


# Point-to-point tags: two per slice, from a counter that wraps well below gloo's limit
# (a non-negative int32) and far above the number of slices ever in flight.
_TAGS = 2**30


def _global_rank(group: Group, rank: int) -> int:
    """The default group's rank of ``group``'s ``rank`` (point-to-point takes those)."""
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


def pieces(flat: torch.Tensor, world: int) -> tuple[torch.Tensor, ...]:
    """``flat`` in consecutive views of near-equal size (they differ by at most one element).

    A slice holds at most max(PIECE_BYTES, 2N x MIN_SHARD_BYTES) and at least
    N x MIN_SHARD_BYTES (a tensor below that floor is one slice). Slices bound the
    staging memory and let :class:`BalancedStream` keep several in flight, so one slice's
    gather overlaps the next one's exchange (and, on collectives, both directions of a
    gloo link stay busy); a tensor of a few slices is still cut in MIN_PIECES when its
    shards stay at least MIN_SHARD_BYTES, below which per-message latency dominates (64 KiB
    shards made the end-to-end benchmark slower). Equal slices, because every slice costs
    a round of messages whatever its size: cutting a 513 KiB bucket as 512 KiB + 1 KiB
    doubled its latency. Measured on 1000 Mbit/s namespace hosts with collectives: 1 MiB
    slices beat 2 and 4 MiB; one unsliced 64 MB all-to-all on 3 loopback ranks had taken
    14x a ring all-reduce.
    """
    n = flat.numel()
    size = flat.element_size()
    least = world * max(1, MIN_SHARD_BYTES // size)
    # At least twice the floor, so that equal slices can always respect both bounds.
    most = max(2 * least, PIECE_BYTES // size)
    count = max(1, -(-n // most), min(MIN_PIECES, n // least))
    return tuple(flat.tensor_split(count))


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
