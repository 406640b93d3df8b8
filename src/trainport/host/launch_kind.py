"""Which MPI-style launch a job asks for, if any.

Two kinds of job start their ranks through ``mpirun``: MPI jobs (SageMaker's
``sagemaker_mpi_*`` hyperparameters or trainport's tags, :mod:`trainport.host.mpi`) and
SMDDP jobs (:mod:`trainport.host.smddp`, whose settings are read its own way). Everything
that has to know whether a job's hosts meet on a launch board asks here, so neither module
needs the other's rules.
"""

from __future__ import annotations

from trainport.host import mpi, smddp
from trainport.host.mpi import MpiSettings
from trainport.spec import JobSpec

__all__ = ["mpi_launch_settings"]


def mpi_launch_settings(spec: JobSpec) -> MpiSettings | None:
    """The job's MPI launch settings (plain MPI first, then SMDDP), or None for neither."""
    return mpi.mpi_settings(spec) or smddp.mpi_settings(spec)
