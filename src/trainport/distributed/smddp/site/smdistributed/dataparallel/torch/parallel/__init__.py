"""SMDDP's ``smdistributed.dataparallel.torch.parallel``."""

from __future__ import annotations

from trainport.distributed.smddp.api import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
