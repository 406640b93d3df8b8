"""A DDP communication hook that reduces gradient buckets on one communication thread.

DDP fuses gradients into buckets (``bucket_cap_mb``) and calls the hook for each bucket, in
bucket order, as soon as the backward pass has produced all of its gradients. The hook
only enqueues the bucket and returns a ``torch.futures.Future``; a single communication
thread takes buckets in that order, runs the chosen reduction (:mod:`.reduction`) and
completes the future. The reduction therefore overlaps the rest of the backward pass, and
DDP waits for the futures only at the end of it.

Why a thread rather than chaining futures: the balanced reduction needs two collectives
per bucket, and on gloo a collective issued from a future's callback runs on gloo's own
worker thread and hangs there. One thread, fed in bucket order, also guarantees that every
rank issues the same collectives in the same order, which is what keeps ranks matched.

The thread talks on its own process group (created collectively at construction), so its
collectives never interleave with those DDP issues from the main thread (parameter and
buffer broadcasts, bucket rebuilding).

CUDA gradients on a group whose CUDA tensors are not carried by NCCL (gloo, whose TCP
transport cannot read device memory) take the path SageMaker's data-parallel library takes:
as soon as a bucket's gradients exist, the communication thread copies it into a pinned
host buffer on a side stream, reduces it there with the chosen algorithm like a CPU bucket,
and copies the result back on a second side stream once it has landed. The backward pass
goes on meanwhile; the bytes each rank sends are those of the CPU path. With NCCL the
reduction stays on the GPU.

Use::

    model = DDP(module, bucket_cap_mb=4)
    reducer = register_sharded_hook(model, algorithm="balanced")
    ... train ...
    reducer.timeline.write(f"trace-rank{rank}.json"); reducer.close()
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainport.distributed.errors import ReductionError, TopologyError
from trainport.distributed.hierarchy import (
    HierarchicalStream,
    HostGroups,
    hierarchical_average,
)
from trainport.distributed.reduction import (
    ALGORITHMS,
    Algorithm,
    BalancedStream,
    Scratch,
    Transport,
    balanced_average,
    carrier,
    pieces,
)
from trainport.distributed.topology import topology_from_env
from trainport.distributed.trace import ByteCount, ByteCounter, Timeline, now_us

__all__ = ["ShardedReducer", "register_sharded_hook", "sharded_hook"]

logger = logging.getLogger(__name__)

_COMM_THREAD = "comm"
_TRAIN_THREAD = "backward"


@dataclass
class _Job:
    """One bucket waiting for the communication thread."""

    label: str
    flat: torch.Tensor
    future: torch.futures.Future[torch.Tensor]
    ready_event: Any = None  # torch.cuda.Event marking when the gradients exist
    host: torch.Tensor | None = None  # pinned copy reduced on the CPU (CUDA over gloo)

    @property
    def tensor(self) -> torch.Tensor:
        """What the reduction works on: the pinned host copy if there is one."""
        return self.flat if self.host is None else self.host


class ShardedReducer:
    """Hook state: the communication thread, its process group, counters and timeline.

    Construct it on every rank at the same point (it creates a process group, which is a
    collective call). ``algorithm`` is ``"balanced"`` (default), ``"ring"`` or ``"naive"``;
    ``transport`` carries the balanced reduction: ``"p2p"`` or ``"collectives"``, by
    default point-to-point on gloo and collectives on NCCL (see ``default_transport``).
    ``hierarchical`` reduces within each host of ``per_host`` ranks, then among one rank per
    host by ``across`` (``ring`` or ``balanced``, see :class:`HierarchicalStream`).
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        *,
        algorithm: Algorithm | str = Algorithm.BALANCED,
        dedicated_group: bool = True,
        trace_events: int = 200_000,
        transport: Transport | str | None = None,
        per_host: int | None = None,
        across: Algorithm | str = Algorithm.RING,
    ) -> None:
        self.algorithm = Algorithm(algorithm)
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self._hierarchy: HierarchicalStream | None = None
        if self.algorithm is Algorithm.HIERARCHICAL:
            # Its groups are its own (made collectively here), within and across hosts.
            if process_group not in (None, dist.group.WORLD):
                raise TopologyError("the hierarchical reduction runs on the default group only")
            per_host = per_host or topology_from_env().local_world_size
            hosts = HostGroups.create(per_host)
            # CPU buckets take the pipelined stream; CUDA ones on NCCL the plain function.
            self._hierarchy = HierarchicalStream(
                hosts, Scratch(), transport=transport, across=across
            )
            self._reduce: Any = functools.partial(_hierarchical, hosts=hosts, transport=transport)
            dedicated_group = False
        elif self.algorithm is Algorithm.BALANCED:  # the CUDA path reduces through this
            self._reduce = functools.partial(balanced_average, transport=transport)
        else:
            self._reduce = ALGORITHMS[self.algorithm]
        if dedicated_group and self.world_size > 1:
            ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
            backend = str(dist.get_backend(process_group))
            self.group: dist.ProcessGroup | None = dist.new_group(ranks, backend=backend)
        else:
            self.group = process_group
        self.counter = ByteCounter()
        self.timeline = Timeline(self.rank, max_events=trace_events)
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._cuda_stream: Any = None
        self._upload_stream: Any = None  # host-to-device copies, from the landing thread
        self._pinned: dict[str, torch.Tensor] = {}  # one host buffer per bucket
        self._cuda_on_host: bool | None = None
        self._scratch = Scratch()  # used only by the communication thread
        self._stream = BalancedStream(self.group, self._scratch, transport=transport)
        self._thread = threading.Thread(
            target=self._serve, name=f"trainport-comm-rank{self.rank}", daemon=True
        )
        self._thread.start()
        logger.info(
            "gradient reduction %s on rank %d of %d (communication thread started)",
            self.algorithm.value,
            self.rank,
            self.world_size,
        )

    def submit(self, flat: torch.Tensor, label: str = "") -> torch.futures.Future[torch.Tensor]:
        """Queue ``flat`` for averaging; the future completes with ``flat`` once it is done.

        Every rank must submit the same sequence of tensor sizes.
        """
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        if self._failure is not None:
            # The group is in an unknown state after a failed collective: fail fast rather
            # than issue more collectives that would block or mismatch.
            _fail(future, ReductionError(f"an earlier reduction failed: {self._failure}"))
            return future
        job = _Job(label=label, flat=flat, future=future)
        if flat.is_cuda:
            job.ready_event = torch.cuda.Event()
            job.ready_event.record()
        self.timeline.instant(f"ready {label}", _TRAIN_THREAD, {"bytes": _nbytes(flat)})
        self._queue.put(job)
        return future

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return self.submit(bucket.buffer(), label=f"bucket {bucket.index()}")

    def _serve(self) -> None:
        while True:
            # Buckets in flight complete from the backend's callbacks as their all-gathers
            # land, so there is nothing to wait for here but the next bucket.
            job = self._queue.get()
            if job is None:
                self._guard(self._stream.flush)
                self._stream.close()
                if self._hierarchy is not None:
                    self._hierarchy.close()
                return
            if self._failure is not None:
                _fail(job.future, ReductionError(f"an earlier reduction failed: {self._failure}"))
                continue
            start = now_us()
            if job.ready_event is not None and self._reduces_on_host():
                try:
                    self._to_host(job)
                except Exception as exc:
                    self._failed(job, exc)
                    continue
            on_host = job.ready_event is None or job.host is not None
            if self.algorithm is Algorithm.BALANCED and on_host:
                self._guard(functools.partial(self._push, job, start), job)
                continue
            if self._hierarchy is not None and on_host:
                try:
                    self._push_hierarchical(self._hierarchy, job, start)
                except Exception as exc:
                    self._failed(job, exc)
                continue
            try:
                count = self._run(job)
            except Exception as exc:  # any failure must reach the trainer through the future
                self._failed(job, exc)
                continue
            self._finished(job, start, count, None)

    def _push(self, job: _Job, start: int) -> None:
        """Pipelined balanced path: the bucket completes when all its slices have landed."""
        parts = pieces(job.tensor, self.world_size)
        # One count per slice plus one for this method, so the bucket cannot complete
        # before every slice is pushed and the tally is whole (slices land in any order).
        progress = _Progress(len(parts) + 1)

        def piece_done(error: BaseException | None) -> None:
            if progress.finish_one(error):
                self._finished(job, start, progress.tally, progress.error)

        for part in parts:
            progress.add(self._stream.push(part, piece_done))
        # Start the bucket's last all-gathers now, at a point that does not depend on
        # timing (the next bucket may be long in coming); only landing is left for later.
        self._stream.settle()
        piece_done(None)

    def _push_hierarchical(self, stream: HierarchicalStream, job: _Job, start: int) -> None:
        """Pipelined hierarchical path: the bucket completes once broadcast in its host."""
        tally: list[ByteCount] = []
        known = threading.Event()  # the tally is set before the bucket can complete

        def done(error: BaseException | None) -> None:
            known.wait()
            self._finished(job, start, tally[0], error)

        try:
            tally.append(stream.push(job.tensor, done))
        finally:
            if not tally:
                tally.append(ByteCount())
            known.set()

    def _guard(self, action: Callable[[], None], job: _Job | None = None) -> None:
        """Run a stream action; on failure, fail ``job`` and every bucket in flight."""
        try:
            action()
        except Exception as exc:
            self._stream.fail(exc)
            if job is not None and not job.future.done():
                self._failed(job, exc)

    def _failed(self, job: _Job, exc: BaseException) -> None:
        self._failure = exc
        logger.error(
            "reduction of %s (%s) failed on rank %d: %s",
            job.label,
            self.algorithm.value,
            self.rank,
            exc,
        )
        error = ReductionError(
            f"{self.algorithm.value} reduction of {job.label} failed on rank {self.rank}: {exc}"
        )
        error.__cause__ = exc
        _fail(job.future, error)

    def _finished(
        self, job: _Job, start: int, count: ByteCount, error: BaseException | None
    ) -> None:
        if error is None and job.host is not None:
            try:
                self._to_device(job)
            except Exception as exc:
                error = exc
        if error is not None:
            self._failed(job, error)
            return
        self.counter.add(count.sent, count.received, count.collectives)
        self.timeline.complete(
            f"reduce {job.label}",
            _COMM_THREAD,
            start,
            now_us(),
            {"bytes": _nbytes(job.flat), "sent": count.sent, "received": count.received},
        )
        job.future.set_result(job.flat)

    def _run(self, job: _Job) -> Any:
        if job.ready_event is None or job.host is not None:
            return self._reduce(job.tensor, self.group, self._scratch)
        # CUDA: the gradients were produced on the trainer's stream; reduce on a side stream
        # that waits for them, and finish before completing the future so DDP can read the
        # result on any stream.
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=job.flat.device)
        with torch.cuda.stream(self._cuda_stream):
            self._cuda_stream.wait_event(job.ready_event)
            count = self._reduce(job.flat, self.group, self._scratch)
        self._cuda_stream.synchronize()
        return count

    def _reduces_on_host(self) -> bool:
        """Whether CUDA buckets must be reduced in host memory (no NCCL for CUDA tensors)."""
        if self._cuda_on_host is None:
            self._cuda_on_host = self.world_size > 1 and carrier(self.group, "cuda") != "nccl"
        return self._cuda_on_host

    def _to_host(self, job: _Job) -> None:
        """Copy a CUDA bucket into its pinned host buffer once its gradients exist."""
        flat = job.flat
        host = self._pinned.get(job.label)
        if host is None or host.shape != flat.shape or host.dtype != flat.dtype:
            # DDP may rebuild its buckets after the first iteration: sizes can change once.
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self._pinned[job.label] = host
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=flat.device)
        with torch.cuda.stream(self._cuda_stream):
            self._cuda_stream.wait_event(job.ready_event)
            host.copy_(flat, non_blocking=True)
        self._cuda_stream.synchronize()
        job.host = host

    def _to_device(self, job: _Job) -> None:
        """Copy a reduced host buffer back into the bucket, finished before DDP reads it."""
        assert job.host is not None  # only called for jobs reduced on the host
        if self._upload_stream is None:
            self._upload_stream = torch.cuda.Stream(device=job.flat.device)
        with torch.cuda.stream(self._upload_stream):
            job.flat.copy_(job.host, non_blocking=True)
        self._upload_stream.synchronize()

    def close(self) -> None:
        """Stop the communication thread after the buckets already queued."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> ShardedReducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Progress:
    """How many of a bucket's slices are still in flight, their bytes and first error."""

    def __init__(self, remaining: int) -> None:
        self._lock = threading.Lock()
        self._remaining = remaining
        self.error: BaseException | None = None
        self.tally = ByteCount()

    def add(self, count: ByteCount) -> None:
        self.tally += count

    def finish_one(self, error: BaseException | None) -> bool:
        """Count one slice done; True for the last one."""
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            self._remaining -= 1
            return self._remaining == 0


def _hierarchical(
    flat: torch.Tensor,
    group: dist.ProcessGroup | None,
    scratch: Scratch | None,
    *,
    hosts: HostGroups,
    transport: Transport | str | None,
) -> ByteCount:
    return hierarchical_average(flat, hosts, scratch, transport=transport)


def _fail(future: torch.futures.Future[torch.Tensor], error: BaseException) -> None:
    # torch annotates set_exception as taking the result type; it takes an exception.
    future.set_exception(error)  # type: ignore[arg-type]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def sharded_hook(
    state: ShardedReducer, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """The function DDP calls per bucket: ``model.register_comm_hook(reducer, sharded_hook)``."""
    return state.hook(bucket)


# DDP compares the hook's annotations with the real GradBucket and Future types; with
# postponed evaluation they are strings, so resolve them once here.
sharded_hook.__annotations__ = typing.get_type_hints(sharded_hook)


def register_sharded_hook(
    model: DistributedDataParallel,
    *,
    algorithm: Algorithm | str = Algorithm.BALANCED,
    dedicated_group: bool = True,
    transport: Transport | str | None = None,
    per_host: int | None = None,
    across: Algorithm | str = Algorithm.RING,
) -> ShardedReducer:
    """Create a :class:`ShardedReducer` for ``model``'s process group and register its hook.

    The fusion-buffer size is DDP's ``bucket_cap_mb``; call this on every rank, before the
    first backward pass.
    """
    reducer = ShardedReducer(
        model.process_group,
        algorithm=algorithm,
        dedicated_group=dedicated_group,
        transport=transport,
        per_host=per_host,
        across=across,
    )
    model.register_comm_hook(reducer, sharded_hook)
    return reducer
