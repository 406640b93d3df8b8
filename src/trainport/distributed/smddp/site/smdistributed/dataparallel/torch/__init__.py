"""SMDDP's PyTorch API as trainport provides it (see trainport.distributed.smddp)."""

from __future__ import annotations

from trainport.distributed.smddp.errors import unsupported


def __getattr__(name: str) -> object:
    raise unsupported(f"smdistributed.dataparallel.torch.{name}")
