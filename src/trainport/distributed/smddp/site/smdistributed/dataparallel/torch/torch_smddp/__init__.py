"""Importing this registers the ``smddp`` process-group backend, as SMDDP's does."""

from __future__ import annotations

from trainport.distributed.smddp.api import export_launch_env, register_backend
from trainport.distributed.smddp.errors import unsupported

register_backend()
export_launch_env()


def __getattr__(name: str) -> object:
    raise unsupported(f"smdistributed.dataparallel.torch.torch_smddp.{name}")
