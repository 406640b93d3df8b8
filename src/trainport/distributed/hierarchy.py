"""Hierarchical reduction: within each host first, then across hosts, then back within.

Where a host runs P ranks that share one network link, a flat reduction over all N x P
ranks puts about 2P x the bucket on every host's link (each rank sends and receives its
2(NP-1)/NP share). Reducing within the host first (over loopback or shared memory, which
is not the limit), then reducing among one leader per host, then broadcasting within the
host, puts 2(N-1)/N x the bucket on each link: P times less. This
is how SageMaker's data-parallel library uses a host's GPUs.

Ranks are placed host by host (torchrun's numbering, and OpenMPI's ``-map-by slot``): host
h holds ranks ``h*P .. h*P+P-1`` and its leader is ``h*P``. :class:`HostGroups` makes the
groups (collectively: every rank calls it at the same point).

:func:`hierarchical_average` does one tensor start to end. :class:`HierarchicalStream` is
what the DDP hook uses: buckets are pipelined. Each bucket's within-host sum is started at
once (asynchronously, on one group); the leader then starts the reduction among leaders
(the backend's ring all-reduce by default, or a :class:`BalancedStream`) and goes on to the
next bucket; a broadcasting thread takes buckets in order and, once a bucket has landed on
the leader, broadcasts it within the host on a second group, so broadcasts and sums never
share a group while issued from two threads (each group sees its collectives in the same
order on every rank).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainport.distributed.errors import TopologyError
from trainport.distributed.reduction import (
    Algorithm,
    BalancedStream,
    Scratch,
    Transport,
    balanced_average,
    pieces,
    ring_bytes,
)
from trainport.distributed.trace import ByteCount

__all__ = ["HierarchicalStream", "HostGroups", "hierarchical_average"]


@dataclass
class HostGroups:
    """This rank's host group, the leaders' group, and where it sits in them."""

    local: dist.ProcessGroup | None  # the sums to the leader
    broadcasts: dist.ProcessGroup | None  # the leader's results back (another thread's)
    leaders: dist.ProcessGroup | None  # None on ranks that lead no host
    leader: int  # global rank of this host's leader
    per_host: int
    hosts: int

    @classmethod
    def create(cls, per_host: int, backend: str | None = None) -> HostGroups:
        """Make every host's group and the leaders' group (a collective call)."""
        world, rank = dist.get_world_size(), dist.get_rank()
        if per_host < 1 or world % per_host:
            raise TopologyError(
                f"{world} ranks cannot be split into hosts of {per_host} (LOCAL_WORLD_SIZE)"
            )
        hosts = world // per_host
        backend = backend or str(dist.get_backend())
        local = broadcasts = None
        for h in range(hosts):  # every rank takes part in making every group
            ranks = list(range(h * per_host, (h + 1) * per_host))
            sums = dist.new_group(ranks, backend=backend)
            results = dist.new_group(ranks, backend=backend)
            if rank in ranks:
                local, broadcasts = sums, results
        leaders_ranks = [h * per_host for h in range(hosts)]
        leaders = dist.new_group(leaders_ranks, backend=backend)
        leader = rank - rank % per_host
        return cls(
            local=local,
            broadcasts=broadcasts,
            leaders=leaders if rank == leader else None,
            leader=leader,
            per_host=per_host,
            hosts=hosts,
        )

    @property
    def leads(self) -> bool:
        return self.leaders is not None


def hierarchical_average(
    flat: torch.Tensor,
    groups: HostGroups,
    scratch: Scratch | None = None,
    transport: Transport | str | None = None,
) -> ByteCount:
    """Average ``flat`` in place over every rank: sum to the host's leader, balanced
    reduction among leaders, broadcast from the leader. The count is this rank's bytes
    across hosts (the within-host messages do not use the link)."""
    if groups.per_host > 1:
        flat.div_(groups.per_host)
        dist.reduce(flat, dst=groups.leader, group=groups.local)
    count = ByteCount()
    if groups.leaders is not None and groups.hosts > 1:
        count = balanced_average(flat, groups.leaders, scratch, transport=transport)
    if groups.per_host > 1:
        dist.broadcast(flat, src=groups.leader, group=groups.local)
    return count


Done = Callable[[BaseException | None], None]


@dataclass
class _Bucket:
    flat: torch.Tensor
    done: Done
    summed: dist.Work | None  # the within-host sum (waited for by non-leaders here)
    across: dist.Work | None = None  # the leaders' ring all-reduce, where that carries it
    landed: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    remaining: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class HierarchicalStream:
    """The hierarchical reduction of a sequence of tensors, pipelined (see module doc).

    ``across`` is how the leaders reduce: ``ring``, the backend's own all-reduce (default),
    or ``balanced``, a :class:`BalancedStream`. With one leader per host both put
    2(H-1)/H of each bucket on a host's link for H hosts; the ring runs inside the backend
    without this thread's per-slice work, and in ``benchmarks/smddp_e2e.py`` (4 hosts of 2
    ranks on two cores, where the CPU sets the pace) it was the faster of the two.

    :meth:`push` is called from one thread, in the same order on every rank; ``done`` runs
    once per tensor, from the broadcasting thread, when the tensor holds the mean over
    every rank (or with the error that stopped it).
    """

    def __init__(
        self,
        groups: HostGroups,
        scratch: Scratch | None = None,
        transport: Transport | str | None = None,
        across: Algorithm | str = Algorithm.RING,
    ) -> None:
        self.groups = groups
        across = Algorithm(across)
        if across not in (Algorithm.RING, Algorithm.BALANCED):
            raise TopologyError(f"leaders reduce by ring or balanced, not {across.value}")
        self._stream = (
            BalancedStream(groups.leaders, scratch, transport=transport)
            if groups.leads and groups.hosts > 1 and across is Algorithm.BALANCED
            else None
        )
        self._order: queue.SimpleQueue[_Bucket | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._broadcast_each, name="trainport-host-broadcast", daemon=True
        )
        self._thread.start()

    def push(self, flat: torch.Tensor, done: Done) -> ByteCount:
        """Start averaging ``flat`` in place; returns this rank's bytes across hosts."""
        groups = self.groups
        summed = None
        if groups.per_host > 1:
            flat.div_(groups.per_host)
            summed = dist.reduce(flat, dst=groups.leader, group=groups.local, async_op=True)
        bucket = _Bucket(flat, done, summed)
        count = ByteCount()
        across = groups.leads and groups.hosts > 1
        if across and summed is not None:
            summed.wait()  # within the host: short, and the leader needs the sum
        if not across:
            bucket.landed.set()
        elif self._stream is None:  # the ring: the broadcasting thread waits for it
            flat.div_(groups.hosts)
            bucket.across = dist.all_reduce(flat, group=groups.leaders, async_op=True)
            count = ring_bytes(flat, groups.hosts)
            bucket.landed.set()
        else:
            parts = pieces(flat, self._stream.world)
            bucket.remaining = len(parts)
            landed = functools.partial(self._landed, bucket)
            for part in parts:
                count += self._stream.push(part, landed)
            self._stream.settle()
        self._order.put(bucket)
        return count

    @staticmethod
    def _landed(bucket: _Bucket, error: BaseException | None) -> None:
        with bucket.lock:
            if error is not None and bucket.error is None:
                bucket.error = error
            bucket.remaining -= 1
            if bucket.remaining == 0:
                bucket.landed.set()

    def _broadcast_each(self) -> None:
        while (bucket := self._order.get()) is not None:
            try:
                if bucket.summed is not None and not self.groups.leads:
                    bucket.summed.wait()
                bucket.landed.wait()
                if bucket.across is not None:
                    bucket.across.wait()
                if bucket.error is not None:
                    raise bucket.error
                if self.groups.per_host > 1:
                    dist.broadcast(
                        bucket.flat, src=self.groups.leader, group=self.groups.broadcasts
                    )
            except Exception as exc:
                bucket.done(exc)
                continue
            bucket.done(None)

    def close(self) -> None:
        """Finish every tensor pushed so far, then stop the threads."""
        try:
            if self._stream is not None:
                self._stream.flush()
        finally:
            if self._stream is not None:
                self._stream.close()
            self._order.put(None)
            self._thread.join()
