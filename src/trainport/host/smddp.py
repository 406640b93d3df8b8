"""SageMaker's distributed data parallel (SMDDP) launch, as the training toolkit runs it.

The SDK's ``distribution={"smdistributed": {"dataparallel": {"enabled": True}}}`` (and
``{"pytorchddp": {"enabled": True}}``, which the PyTorch estimator rewrites into the same)
sends ``sagemaker_distributed_dataparallel_enabled``, ``sagemaker_instance_type`` and
``sagemaker_distributed_dataparallel_custom_mpi_options``; the PyTorch container picks its
SMDataParallel runner for that flag or for ``sagemaker_pytorch_ddp_enabled``. The runner is
an MPI launch: mpirun on the leader over every host, one process per GPU (on a CPU host one
per host unless ``sagemaker_mpi_num_of_processes_per_host`` says otherwise; here the GPUs
of the host's share of the machine, at most as many as its instance type has), with the
library's variables passed to every rank (``SMDATAPARALLEL_USE_HOMOGENEOUS`` or
``..._SINGLENODE``, the server address and port, ``SAGEMAKER_INSTANCE_TYPE``) and the
user's options after the toolkit's (``--NCCL_DEBUG X`` among them becomes ``-x
NCCL_DEBUG=X``). trainport runs it through its own MPI launch (:mod:`trainport.host.mpi`),
so ranks, failures and logs behave as for any MPI job.

Inside such a job (and only there) trainport puts its own ``smdistributed.dataparallel``
on the ranks' path (:data:`SITE`, see :mod:`trainport.distributed.smddp`), which defers to
a real one the job's interpreter has.

``smdistributed.modelparallel`` (the SDK's ``mp_parameters``) is not provided: a job asking
for it is refused at submission.

Everything here is a pure decision on the job's spec; the agent applies it.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from trainport.errors import ValidationError
from trainport.host.mpi import HP_PROCESSES, MpiSettings, plain_value
from trainport.instances import INSTANCE_TYPES
from trainport.spec import JobSpec

__all__ = [
    "HP_ENABLED",
    "HP_OPTIONS",
    "HP_PYTORCH_DDP",
    "SERVER_PORT",
    "SITE",
    "check",
    "enabled",
    "instance_type",
    "mpi_settings",
    "rank_environment",
    "refuse_model_parallel",
]

HP_ENABLED = "sagemaker_distributed_dataparallel_enabled"
HP_PYTORCH_DDP = "sagemaker_pytorch_ddp_enabled"
HP_OPTIONS = "sagemaker_distributed_dataparallel_custom_mpi_options"
HP_INSTANCE_TYPE = "sagemaker_instance_type"
HP_MODEL_PARALLEL = "mp_parameters"
TAG = "trainport:distribution"
TAG_VALUE = "smddp"
TAG_OPTIONS = "trainport:mpi-options"
# The toolkit's SMDataParallel server port (its rendezvous, here the process group's store).
SERVER_PORT = 7592
#: The folder whose ``smdistributed`` package trainport adds to an SMDDP job's Python path.
SITE = Path(__file__).resolve().parents[1] / "distributed" / "smddp" / "site"

_MODEL_PARALLEL = (
    "smdistributed.modelparallel (distribution={'smdistributed': {'modelparallel': ...}}, "
    "sent as the hyperparameter mp_parameters) is not provided by trainport; use "
    "smdistributed dataparallel, torch_distributed or mpi, or run the job on SageMaker"
)


def _flag(spec: JobSpec, key: str) -> bool:
    return plain_value(spec.hyperparameters.get(key)).lower() == "true"


def enabled(spec: JobSpec) -> bool:
    """Whether the job asks for SMDDP (either flag the PyTorch container reads, or the tag)."""
    return _flag(spec, HP_ENABLED) or _flag(spec, HP_PYTORCH_DDP) or spec.tags.get(TAG) == TAG_VALUE


def asks_model_parallel(spec: JobSpec) -> bool:
    return HP_MODEL_PARALLEL in spec.hyperparameters


def refuse_model_parallel(spec: JobSpec) -> None:
    """smdistributed.modelparallel is not provided: refused at submission, whatever runs it."""
    if asks_model_parallel(spec):
        raise ValidationError(f"HyperParameters.{HP_MODEL_PARALLEL}: {_MODEL_PARALLEL}")


def check(spec: JobSpec, entry: str | None) -> None:
    """Refuse at submission what this launch cannot run, naming the setting to change."""
    refuse_model_parallel(spec)
    if not enabled(spec):
        return
    if spec.torch_distributed:
        raise ValidationError(
            f"the job asks for both SMDDP ({HP_ENABLED}) and torchrun "
            "(sagemaker_torch_distributed_enabled); choose one"
        )
    if _flag(spec, "sagemaker_mpi_enabled") or spec.tags.get(TAG) == "mpi":
        raise ValidationError(
            f"the job asks for both SMDDP ({HP_ENABLED}) and MPI (sagemaker_mpi_enabled); "
            "SMDDP already launches with mpirun: keep one"
        )
    if entry is None or not entry.endswith(".py"):
        raise ValidationError(
            "SMDDP runs a Python script-mode entry point: set sagemaker_program to a .py "
            "file and sagemaker_submit_directory (trainport run --entry-point train.py)"
        )
    if shutil.which("mpirun") is None:
        raise ValidationError(
            "the job asks for SMDDP, which launches with mpirun, but mpirun is not on PATH: "
            "install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin; or run "
            "scripts/setup.sh --test)"
        )
    mpi_settings(spec)  # its own refusals (processes per host, options)


def instance_type(spec: JobSpec, host: str) -> str:
    """``sagemaker_instance_type`` as the SDK sent it, else the host's own InstanceType
    (the toolkit's fallback for heterogeneous clusters)."""
    sent = plain_value(spec.hyperparameters.get(HP_INSTANCE_TYPE))
    return sent or spec.group_of(host).instance_type


def mpi_settings(spec: JobSpec) -> MpiSettings | None:
    """The MPI launch of an SMDDP job, or None when the job does not ask for SMDDP.

    Processes per host: the ``trainport:processes-per-host`` tag, else
    ``sagemaker_mpi_num_of_processes_per_host``, else None (the host's GPUs, else 1).
    The custom options: the tag ``trainport:mpi-options`` wins over the hyperparameter.
    """
    if not enabled(spec):
        return None
    per_host = spec.processes_per_host
    raw_count = plain_value(spec.hyperparameters.get(HP_PROCESSES))
    if per_host is None and raw_count:
        if not raw_count.isdigit() or not 1 <= int(raw_count) <= 64:
            raise ValidationError(
                f"HyperParameters.{HP_PROCESSES}={raw_count!r} must be a whole number from 1 to 64"
            )
        per_host = int(raw_count)
    options = spec.tags.get(TAG_OPTIONS)
    where = f"Tags: {TAG_OPTIONS}"
    if options is None:
        options = plain_value(spec.hyperparameters.get(HP_OPTIONS))
        where = f"HyperParameters.{HP_OPTIONS}"
    kind = instance_type(spec, spec.hosts[0])
    exports = mpirun_exports(spec.hosts, kind)
    return MpiSettings(
        per_host, (*exports, *custom_options(options, where)), gpu_cap=instance_gpus(kind)
    )


def instance_gpus(kind: str) -> int | None:
    """The GPUs of an instance type trainport knows (0 for a CPU type), else None."""
    shape = INSTANCE_TYPES.get(kind)
    return None if shape is None else int(shape.gpus)


def custom_options(options: str, where: str) -> tuple[str, ...]:
    """The user's mpirun options, ``--NCCL_DEBUG X`` turned into ``-x NCCL_DEBUG=X`` (the
    toolkit reads that one itself; its default is INFO)."""
    try:
        words = shlex.split(options)
    except ValueError as exc:
        raise ValidationError(f"{where}: cannot split {options!r}: {exc}") from exc
    nccl_debug = "INFO"
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--NCCL_DEBUG":
            if i + 1 >= len(words):
                raise ValidationError(f"{where}: --NCCL_DEBUG needs a value (e.g. WARN)")
            nccl_debug, i = words[i + 1], i + 2
            continue
        if word.startswith("--NCCL_DEBUG="):
            nccl_debug = word.partition("=")[2]
        else:
            rest.append(word)
        i += 1
    return ("-x", f"NCCL_DEBUG={nccl_debug}", *rest)


def rank_environment(hosts: tuple[str, ...], kind: str) -> dict[str, str]:
    """What the toolkit's runner passes every rank (``-x``) beside its own options."""
    env = {
        "SMDATAPARALLEL_SERVER_ADDR": hosts[0],
        "SMDATAPARALLEL_SERVER_PORT": str(SERVER_PORT),
        "SAGEMAKER_INSTANCE_TYPE": kind,
    }
    if len(hosts) > 1:
        env["SMDATAPARALLEL_USE_HOMOGENEOUS"] = "1"
    else:
        env["SMDATAPARALLEL_USE_SINGLENODE"] = "1"
    return env


def mpirun_exports(hosts: tuple[str, ...], kind: str) -> tuple[str, ...]:
    """:func:`rank_environment` as mpirun ``-x`` options."""
    out: list[str] = []
    for key, value in rank_environment(hosts, kind).items():
        out += ["-x", f"{key}={value}"]
    return tuple(out)
