"""Errors raised by :mod:`trainport.distributed`.

Like ``trainport.data``, this package runs inside training code, possibly in real SageMaker
or under plain torchrun where the rest of trainport is absent, so it keeps its own small
tree instead of importing ``trainport.errors``::

    DistributedError          anything this package raises on purpose
    ├── TopologyError         the launcher's environment is missing or inconsistent
    │                         (names the variable and its value)
    └── ReductionError        a gradient reduction failed; the process group is unusable
                              afterwards, so training should stop

Errors of ``torch.distributed`` (a peer died, a timeout) are translated at the boundary with
``raise ... from exc`` so the message names the bucket and algorithm involved.
"""

from __future__ import annotations

__all__ = ["DistributedError", "ReductionError", "TopologyError"]


class DistributedError(Exception):
    """Root of every error trainport.distributed raises on purpose."""


class TopologyError(DistributedError):
    """The environment does not describe a valid (rank, world) placement."""


class ReductionError(DistributedError):
    """A collective of the gradient reduction failed."""
