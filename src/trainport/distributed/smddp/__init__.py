"""SageMaker's distributed data parallel library's PyTorch API, on trainport's reduction.

Scripts written for SageMaker's data-parallel library (SMDDP) run unchanged in a trainport
job that asked for it: trainport puts the folder :data:`SITE` on the ranks' Python path,
whose ``smdistributed.dataparallel`` package is a thin face over this one.

- ``import smdistributed.dataparallel.torch.torch_smddp`` registers the ``smddp``
  process-group backend (:func:`register_backend`): ``dist.init_process_group(backend=
  "smddp")`` joins the job (the rank variables come from the MPI launch, see
  :func:`export_launch_env`), CPU and CUDA tensors travel over gloo, and a
  ``torch.nn.parallel.DistributedDataParallel`` made on such a group gets a fusion buffer
  sized to its model and, on hosts of several ranks, trainport's hierarchical reduction
  (within each host, then across hosts; see :func:`.api.reduction_for`).
- ``smdistributed.dataparallel.torch.distributed`` (the library's older API: rank and size
  queries, ``barrier``, ``all_reduce``, ``broadcast`` ...) and
  ``smdistributed.dataparallel.torch.parallel.distributed.DistributedDataParallel`` are
  :mod:`.api`.

Parts of SMDDP's API that trainport does not provide raise :class:`UnsupportedFeatureError`
naming them. The package ``smdistributed`` in :data:`SITE` defers to a real one: where the
job's interpreter has SMDDP installed, the real library is imported, not this one.
"""

from __future__ import annotations

from pathlib import Path

from trainport.distributed.smddp.errors import UnsupportedFeatureError

__all__ = ["SITE", "UnsupportedFeatureError"]

#: The folder holding the ``smdistributed`` package a job's Python path gets.
SITE = Path(__file__).resolve().parent / "site"
