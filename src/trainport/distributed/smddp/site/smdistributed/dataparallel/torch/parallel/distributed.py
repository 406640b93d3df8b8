"""SMDDP's ``DistributedDataParallel``, on trainport's reductions."""

from __future__ import annotations

from trainport.distributed.smddp.api import DistributedDataParallel
from trainport.distributed.smddp.errors import unsupported

__all__ = ["DistributedDataParallel"]


def __getattr__(name: str) -> object:
    raise unsupported(f"smdistributed.dataparallel.torch.parallel.distributed.{name}")
