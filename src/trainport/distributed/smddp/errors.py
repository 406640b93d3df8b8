"""The error SMDDP's API raises for a part trainport does not provide."""

from __future__ import annotations

from trainport.distributed.errors import DistributedError

__all__ = ["UnsupportedFeatureError", "unsupported"]

_WHERE = (
    "trainport provides SMDDP's PyTorch data-parallel API (the smddp backend, "
    "smdistributed.dataparallel.torch.distributed and its DistributedDataParallel); "
    "use torch.distributed for the rest, or run the job where the real library is installed"
)


class UnsupportedFeatureError(DistributedError, AttributeError):
    """A part of SMDDP's API that trainport does not provide (an AttributeError too, so
    ``hasattr`` and ``getattr(..., default)`` see it as absent)."""


def unsupported(name: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(f"{name} is not provided by trainport's SMDDP: {_WHERE}")
