"""SMDDP as trainport provides it: the PyTorch API (see trainport.distributed.smddp)."""

from __future__ import annotations

from trainport.distributed.smddp.errors import unsupported

__version__ = "trainport"


def __getattr__(name: str) -> object:
    raise unsupported(f"smdistributed.dataparallel.{name}")
