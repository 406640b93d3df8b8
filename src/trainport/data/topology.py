"""Where this reader sits: its rank among processes and its DataLoader worker id.

Read at call time, never at import: the rank comes from ``torch.distributed`` when a process
group is initialised, else from the ``RANK`` / ``WORLD_SIZE`` variables that torchrun and
SageMaker's launchers set, else from OpenMPI's ``OMPI_COMM_WORLD_*`` (mpirun, Horovod). The
host-local rank (``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``, or OpenMPI's ``..._LOCAL_RANK`` /
``..._LOCAL_SIZE``) matters only for Pipe channels, whose FIFOs are per host; without those
variables all ranks are taken to share one host. torch is optional here: without it there
is one process and no DataLoader workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainport.data.errors import DataError

__all__ = ["ReaderSlot", "current_slot"]


@dataclass(frozen=True)
class ReaderSlot:
    """One reader: a (rank, DataLoader worker) pair, plus the host-local view of its rank."""

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise DataError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 <= self.worker < self.num_workers:
            raise DataError(f"worker {self.worker} is outside {self.num_workers} workers")
        if not 0 <= self.local_rank < self.local_world_size:
            raise DataError(
                f"local rank {self.local_rank} is outside local world size {self.local_world_size}"
            )

    @property
    def shard(self) -> int:
        """This reader's index among all readers of the job."""
        return self.rank * self.num_workers + self.worker

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise DataError(f"environment variable {name}={raw!r} is not an integer") from None


# torchrun's names, and OpenMPI's for the same thing (read when torchrun's are absent).
_MPI_NAMES = {
    "RANK": "OMPI_COMM_WORLD_RANK",
    "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
    "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
    "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE",
}


def _placement_int(env: Mapping[str, str], name: str, default: int) -> int:
    if env.get(name, "") == "" and env.get(_MPI_NAMES[name], "") != "":
        return _env_int(env, _MPI_NAMES[name], default)
    return _env_int(env, name, default)


def current_slot(env: Mapping[str, str] | None = None) -> ReaderSlot:
    """The slot of the calling process and DataLoader worker."""
    env = os.environ if env is None else env
    rank = _placement_int(env, "RANK", 0)
    world = _placement_int(env, "WORLD_SIZE", 1)
    worker, num_workers = 0, 1
    try:
        import torch.distributed as dist
        from torch.utils.data import get_worker_info
    except ImportError:
        pass
    else:
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        info = get_worker_info()
        if info is not None:
            worker, num_workers = info.id, info.num_workers
    local_world = _placement_int(env, "LOCAL_WORLD_SIZE", world)
    local_rank = _placement_int(env, "LOCAL_RANK", rank % local_world)
    return ReaderSlot(
        rank=rank,
        world_size=world,
        worker=worker,
        num_workers=num_workers,
        local_rank=local_rank,
        local_world_size=local_world,
    )
