"""SMDDP's ``DistributedDataParallel``, reducing with trainport's balanced hook."""

from __future__ import annotations

from trainport.distributed.smddp.api import DistributedDataParallel
from trainport.distributed.smddp.errors import unsupported

__all__ = ["DistributedDataParallel"]


def __getattr__(name: str) -> object:
    raise unsupported(f"smdistributed.dataparallel.torch.parallel.distributed.{name}")
