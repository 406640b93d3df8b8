"""What a host runs, decided from the spec: a container, an entrypoint, an image folder, or
script mode.

SageMaker runs ``<image> train`` or ``ContainerEntrypoint + ContainerArguments`` in the image.
An image the machine's container engine has runs that way in a container; without one, an
"image" is a local folder holding an executable ``train`` (the bring-your-own-container
shape), and a framework image URI the engine lacks (as the SageMaker SDK sends) works in
script mode, where trainport plays the framework container.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainport.errors import ValidationError
from trainport.host import jobenv
from trainport.runners.container import (
    LABEL_JOB,
    LABEL_JOB_DIR,
    ContainerJob,
    network_problem,
    safe_name,
)
from trainport.spec import JobSpec
from trainport.store.api import S3Uri

__all__ = [
    "PLAIN_SCRIPT_IMAGE",
    "Command",
    "check_runnable",
    "code_to_stage",
    "container_command",
    "container_engine",
    "engine_may_have",
    "image_dir",
    "needs_engine",
    "plain_command",
    "plays_image",
    "registry_image",
    "runs_in_docker",
]

SCRIPT_MODE_KEYS = ("sagemaker_program", "sagemaker_submit_directory")
# The image `trainport run --entry-point` names when the user names none: plain script
# mode, trainport's own interpreter, no image of any engine's.
PLAIN_SCRIPT_IMAGE = "trainport/python"
ISOLATED_HOSTS_NEED_NAMESPACES = (
    "EnableNetworkIsolation with several hosts in containers needs network namespaces "
    "(root), so that the hosts reach each other and nothing else; run trainport as root, "
    "or use one host"
)


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    # Set when the job's image runs in a container engine instead of the host's runner.
    container: ContainerJob | None = None


def image_dir(spec: JobSpec) -> Path | None:
    """The TrainingImage as a local folder, if it names one by its full path (or ``~``).

    A relative name is an image's: taken as a folder, it would be looked up where this
    process happens to run, and a server's answers would then depend on the files there.
    The CLI gives a folder of the submitter's its full path when it builds the request."""
    if not spec.training_image:
        return None
    path = Path(spec.training_image).expanduser()
    if not path.is_absolute():
        return None
    return path.resolve() if path.is_dir() else None


def is_script_mode(spec: JobSpec) -> bool:
    return all(k in spec.hyperparameters for k in SCRIPT_MODE_KEYS)


def registry_image(image: str) -> bool:
    """Whether ``image`` names a registry of its own (``registry.example.com/team/img:1``,
    ``localhost:5000/img``): one an engine can pull whatever its configuration, unlike a
    short name (``pytorch``, ``team/img``) that means something only where it was built."""
    first, slash, _ = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def plays_image(image: str | None) -> bool:
    """Whether trainport's script mode may stand for a job's image that no engine here
    has: a framework image (see host.frameworks), no image, or a short name; not an image
    of a registry, which is that image's to run."""
    from trainport.host.frameworks import parse_image_uri

    return not image or parse_image_uri(image) is not None or not registry_image(image)


def needs_engine(spec: JobSpec) -> bool:
    """Whether the job's image can run only in a container engine: an image no folder
    names, with no ContainerEntrypoint to run instead, and not one script mode plays."""
    if not spec.training_image or image_dir(spec) is not None or spec.entrypoint:
        return False
    return not (is_script_mode(spec) and plays_image(spec.training_image))


def container_engine(
    spec: JobSpec, *, pull: Callable[[str, str], None] | None = None
) -> str | None:
    """The engine that will run the job's TrainingImage as a container, or None.

    An image the engine has always runs in it. One it lacks runs in it (once pulled) only
    where the job has no other way to run (:func:`needs_engine`): a framework image's
    reference means trainport's script mode. ``pull(engine, image)`` is called for an image
    to be pulled; without it nothing is pulled (the job's start pulls, see host.agent).
    """
    from trainport.config import container_engine_setting
    from trainport.runners import container

    if not spec.training_image or image_dir(spec) is not None:
        return None
    engine = container.find_engine(container_engine_setting())
    if engine is None:
        return None
    if container.image_present(engine, spec.training_image):
        return engine
    if not needs_engine(spec):
        return None
    if pull is not None:
        pull(engine, spec.training_image)
    return engine


def runs_in_docker(spec: JobSpec) -> bool:
    """Whether the job's image will run in docker here, which joins no network namespace of
    trainport's."""
    from trainport.config import container_engine_setting
    from trainport.errors import TrainportError
    from trainport.runners import container

    if not spec.training_image or image_dir(spec) is not None:
        return False
    try:
        engine = container.find_engine(container_engine_setting())
        if engine is None or container.engine_kind(engine) != "docker":
            return False
        return container_engine(spec) is not None
    except TrainportError:
        return False  # the host says why when it runs the job


def check_runnable(spec: JobSpec, *, ask_engine: bool = True) -> str:
    """How the job will run ("container" | "entrypoint" | "image" | "script"), or a clear
    error now.

    ``ask_engine=False`` (submission) asks no container engine and pulls nothing: an image
    only an engine can run needs one installed, and the job's start pulls it. A job that
    may run in an engine's copy of its image or else on this machine (a
    ContainerEntrypoint beside an image) has its command checked only then."""
    from trainport.config import container_engine_setting
    from trainport.host import launch_kind, mpi, smddp
    from trainport.runners import container

    smddp.refuse_model_parallel(spec)
    if ask_engine:
        engine = container_engine(spec)
    else:
        setting = container_engine_setting()
        engine = container.installed_engine(setting) if needs_engine(spec) else None
    if engine is not None:
        namespaces = spec.tags.get("trainport:network") == "namespaces"
        problem = network_problem(engine, len(spec.hosts), namespaces, spec.network_isolation)
        if problem:
            raise ValidationError(problem)
        return "container"

    if smddp.enabled(spec):  # first: its launch is an MPI launch, with rules of its own
        program = spec.hyperparameters.get("sagemaker_program") if is_script_mode(spec) else None
        smddp.check(spec, mpi.plain_value(program) if program is not None else None)
    if launch_kind.mpi_launch_settings(spec) is not None:
        script = is_script_mode(spec)
        mpi.check(spec, spec.hyperparameters.get("sagemaker_program") if script else None)
    if spec.entrypoint and not ask_engine and engine_may_have(spec):
        return "entrypoint"
    if spec.entrypoint:
        exe = spec.entrypoint[0]
        # Found as the job will find it: on its own PATH, not this process's.
        job_path = spec.environment.get("PATH") or jobenv.job_path()
        if "/" not in exe and shutil.which(exe, path=job_path) is None:
            raise ValidationError(
                f"AlgorithmSpecification.ContainerEntrypoint: {exe!r} is not on PATH (the "
                f"job's: {job_path}); give its full path or install it"
            )
        if exe.startswith("/") and not exe.startswith("/opt/ml/") and not os.access(exe, os.X_OK):
            raise ValidationError(
                f"AlgorithmSpecification.ContainerEntrypoint: {exe!r} does not exist or is not "
                "executable"
            )
        return "entrypoint"
    folder = image_dir(spec)
    if folder is not None:
        train = folder / "train"
        if not train.is_file() or not os.access(train, os.X_OK):
            raise ValidationError(
                f"AlgorithmSpecification.TrainingImage: the folder {folder} has no executable "
                "'train'; add one (chmod +x) or give ContainerEntrypoint"
            )
        return "image"
    if is_script_mode(spec):
        if not plays_image(spec.training_image):
            raise ValidationError(
                f"AlgorithmSpecification.TrainingImage {spec.training_image!r} is not a "
                "framework image trainport plays in script mode (see docs/framework-images.md), "
                "and no container engine (podman, or docker with its daemon running) was found "
                "to run it; install one, or name a framework image"
            )
        return "script"
    if any(k in spec.hyperparameters for k in SCRIPT_MODE_KEYS):
        raise ValidationError(
            "script mode needs both HyperParameters sagemaker_program and "
            "sagemaker_submit_directory (trainport run --entry-point sets both)"
        )
    raise ValidationError(
        f"AlgorithmSpecification.TrainingImage {spec.training_image!r} is not a local folder "
        "with an executable 'train', and no container engine (podman, or docker with its "
        "daemon running) was found; install one, give ContainerEntrypoint, an image "
        "folder, or use script mode (--entry-point)"
    )


def engine_may_have(spec: JobSpec) -> bool:
    """Whether an engine installed here may hold the job's image (not asked: submission)."""
    from trainport.config import container_engine_setting
    from trainport.runners import container

    if not spec.training_image or image_dir(spec) is not None:
        return False
    return container.installed_engine(container_engine_setting()) is not None


def code_to_stage(spec: JobSpec) -> S3Uri | None:
    """The source dir that the platform unpacks into /opt/ml/code for a container job in
    script mode (an image whose toolkit runs ``sagemaker_program``), or None.

    The toolkit in the image would download ``sagemaker_submit_directory`` from S3 itself,
    unless /opt/ml/code already holds code. trainport's store is often its embedded one,
    which speaks no S3, and the container may have no network (EnableNetworkIsolation) or
    one where the machine's endpoint is not reachable (a namespace network); credentials
    would have to be handed into it too. Unpacking it here, as the input channels are,
    works in all these cases, and the toolkit then runs the code as it would have. A source
    dir already inside the container (a path, as the SageMaker SDK sends with network
    isolation, its code then a channel) is left to the toolkit. An image that keeps code of
    its own in /opt/ml/code has it hidden for such a job: the request's code is what runs.
    """
    if not is_script_mode(spec):
        return None
    where = spec.hyperparameters["sagemaker_submit_directory"].strip('"')
    if not where.startswith("s3://"):
        return None
    return S3Uri.parse(where, field="HyperParameters.sagemaker_submit_directory")


def container_command(
    spec: JobSpec,
    engine: str,
    host: str,
    arn: str,
    gpu_devices: tuple[str, ...],
    job_dir: Path | None = None,
    mount_code: bool = False,
    credentials: Mapping[str, str] | None = None,
) -> Command:
    """The command of a job whose image runs in ``engine``: its environment is the
    request's and the contract's only, never the machine's (the image has its own PATH),
    and ``credentials``, its role's (see host.jobenv.role_environment).
    The engine exposes only this host's GPUs, numbered from 0 inside, so
    CUDA_VISIBLE_DEVICES is left to the request."""
    env = {
        **spec.environment,
        "TRAINING_JOB_NAME": spec.name,
        "TRAINING_JOB_ARN": arn,
    }
    job = ContainerJob(
        engine=engine,
        image=spec.training_image or "",
        name=safe_name(spec.name, host),
        host=host,
        env=env,
        secret_env=dict(credentials or {}),
        entrypoint=spec.entrypoint,
        arguments=spec.arguments,
        gpu_devices=gpu_devices,
        network_isolation=spec.network_isolation,
        checkpoint_path=spec.checkpoint_local_path,
        mount_code=mount_code,
        labels={
            LABEL_JOB: spec.name,
            "trainport.host": host,
            **({LABEL_JOB_DIR: str(job_dir)} if job_dir else {}),
        },
    )
    return Command((spec.training_image or "", "train"), "/", env, container=job)


def plain_command(spec: JobSpec, env: dict[str, str], code_dir: str) -> Command:
    """The command of an entrypoint or image-folder job; it starts in the image folder if
    there is one, else in the job's code folder (``/opt/ml/code``)."""
    if spec.entrypoint:
        folder = image_dir(spec)
        return Command(spec.entrypoint + spec.arguments, str(folder or code_dir), env)
    folder = image_dir(spec)
    assert folder is not None  # check_runnable ran first
    path = f"{folder}{os.pathsep}{env.get('PATH', '')}"
    return Command((str(folder / "train"), "train"), str(folder), {**env, "PATH": path})
