"""SMDDP's older ``smdistributed.dataparallel.torch.distributed`` API."""

from __future__ import annotations

from trainport.distributed.smddp.api import (
    ReduceOp,
    all_gather,
    all_reduce,
    all_to_all_single,
    barrier,
    broadcast,
    destroy_process_group,
    get_local_rank,
    get_local_size,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
    reduce,
)
from trainport.distributed.smddp.errors import unsupported

__all__ = [
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "new_group",
    "reduce",
]


def __getattr__(name: str) -> object:
    raise unsupported(f"smdistributed.dataparallel.torch.distributed.{name}")
