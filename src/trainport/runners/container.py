"""The container runner: a job's OCI image run by podman (or docker), ``image train``.

The decision (what is mounted, which namespaces and engine flags) is ``container_argv``,
a pure function of a ``ContainerJob`` and the host's ``Placement``; starting, signalling
and handing the files back happen at the edge, in ``ContainerRunner`` and
``ContainerProcess``.

What is mounted: SageMaker's subfolders of ``/opt/ml`` (input, model, output, checkpoints),
not the whole tree. SageMaker reserves ``/opt/ml`` but images commonly keep their code in
``/opt/ml/code`` (SAGEMAKER_PROGRAM names a file there); mounting the whole tree would hide
it, mounting the subfolders keeps it while the job still sees every path of the contract.
A script-mode job is the exception: its code comes with the request, unpacked by the
platform and mounted at ``/opt/ml/code``, where the image's toolkit looks for it first.

Signals: the attached ``podman run`` is a client; killing it does not end the container.
So TERM and KILL go to the container through the engine's ``kill``, and the agent's grace
period between them is what ``stop -t`` would give.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainport.errors import SandboxError, ValidationError
from trainport.runners.api import HostProcess, Placement, Runner

__all__ = [
    "ContainerJob",
    "ContainerProcess",
    "ContainerRunner",
    "PullProgress",
    "container_argv",
    "find_engine",
    "image_present",
    "installed_engine",
    "is_framework_image",
    "network_problem",
    "pull_image",
    "remove_job_containers",
    "safe_name",
]

log = logging.getLogger(__name__)

OPT_ML = "/opt/ml"
# SageMaker's own folders under /opt/ml; the image keeps whatever else it put there.
MOUNTED = ("input", "model", "output", "checkpoints")
# Podman 4.3 on these kernels: crun refuses hybrid cgroups, and the default rlimits are
# refused; runc and explicit limits work everywhere we tried.
_PODMAN_FLAGS = (
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=20000:20000",
    "--ulimit",
    "nproc=32768:32768",
    # Podman hands its own proxy variables to a container unasked; a job gets none of the
    # machine's environment.
    "--http-proxy=false",
)
# The labels every job container carries: the job's name (for users: podman ps --filter
# label=trainport.job=NAME) and its folder, unique to one TRAINPORT_HOME.
LABEL_JOB = "trainport.job"
LABEL_JOB_DIR = "trainport.job-dir"
_DOCKER_NO_NAMESPACE = (
    "{what} puts each container in a network namespace of trainport's, and docker cannot "
    "join one; set TRAINPORT_CONTAINER_ENGINE=podman, or leave the job on the machine's "
    "network (no trainport:network tag, one host when network-isolated)"
)
# SageMaker's deep-learning containers live in ECR under these account-scoped names.
_FRAMEWORK_IMAGE = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/")


@dataclass(frozen=True)
class ContainerJob:
    """What of the request shapes the container (the rest comes from the Placement)."""

    engine: str  # path of podman or docker
    image: str
    name: str  # the container's name: unique per job and host
    host: str  # algo-k: the container's hostname
    env: dict[str, str]  # the job's contract only, never the machine's environment
    # Its role's credentials: named on the engine's command line, their values passed in
    # the engine's own environment, so that no other user of the machine reads them there.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    entrypoint: tuple[str, ...] = ()
    arguments: tuple[str, ...] = ()
    network_isolation: bool = False
    gpu_devices: tuple[str, ...] = ()  # the machine's GPU indices this host may use
    # Labels that find the job's containers again after its supervisor died (see
    # remove_job_containers): the engine, not the supervisor, keeps a container running.
    labels: dict[str, str] = field(default_factory=dict)
    # CheckpointConfig.LocalPath (normalised, under /opt/ml): mounted too when it lies
    # outside the folders above, seeded before and synced after as for any runner.
    checkpoint_path: str = f"{OPT_ML}/checkpoints"
    # Script mode: the platform unpacked the job's source dir into the host's code folder,
    # mounted at /opt/ml/code (see host.command.code_to_stage for why).
    mount_code: bool = False


def engine_kind(engine: str) -> str:
    return "docker" if Path(engine).name.startswith("docker") else "podman"


def container_argv(job: ContainerJob, placement: Placement) -> list[str]:
    """The engine command line that runs one host of ``job`` (pure: reads no state)."""
    argv = [job.engine, "run", "--rm", "--name", job.name, "--hostname", job.host]
    docker = engine_kind(job.engine) == "docker"
    if not docker:
        argv += _PODMAN_FLAGS
    # The image's entrypoint is PID 1, as under SageMaker, whatever the engine's default.
    argv += ["--init=false"]
    if placement.limits is not None:  # the instance type's shape, as the sandbox's
        limits = placement.limits
        argv += [f"--memory={limits.memory_bytes}", f"--cpus={limits.cpus:g}"]
        argv += [f"--pids-limit={limits.tasks}", f"--shm-size={limits.memory_bytes}"]
    if job.network_isolation and (docker or not placement.netns):
        # Nothing but a loopback of its own. With a namespace, that is the job's (see
        # runners.netns): an isolated job's hosts still reach each other there, as in
        # SageMaker, and nothing else. Docker cannot join it; for one host its own
        # loopback is the same (network_problem refuses more hosts).
        argv += ["--network", "none"]
    elif placement.netns:
        if docker:
            raise SandboxError(_DOCKER_NO_NAMESPACE.format(what="this job's network"))
        argv += ["--network", f"ns:/run/netns/{placement.netns}"]
    else:
        # The machine's network with a UTS namespace of its own, so the hostname is algo-k
        # (docker gives one unasked and has no --uts private).
        argv += ["--network", "host", *([] if docker else ["--uts", "private"])]
    for sub in MOUNTED:
        argv += ["-v", f"{placement.root / sub}:{OPT_ML}/{sub}"]
    extra = _extra_mount(job)
    if extra:
        argv += ["-v", f"{placement.root / extra}:{OPT_ML}/{extra}"]
    if job.mount_code:
        argv += ["-v", f"{placement.root / 'code'}:{OPT_ML}/code"]
    argv += ["-v", f"{placement.hosts_file}:/etc/hosts:ro"]
    for key, value in sorted(job.labels.items()):
        argv += ["--label", f"{key}={value}"]
    for key, value in sorted(job.env.items()):
        argv += ["-e", f"{key}={value}"]
    for key in sorted(set(job.secret_env) - set(job.env)):
        argv += ["-e", key]  # the value comes from the engine's environment
    if job.gpu_devices:
        if engine_kind(job.engine) == "docker":
            argv += ["--gpus", "device=" + ",".join(job.gpu_devices)]
        else:
            argv += [f"--device=nvidia.com/gpu={d}" for d in job.gpu_devices]
    if job.entrypoint:
        # ContainerEntrypoint replaces ENTRYPOINT; its first word is the program, the rest
        # and ContainerArguments its arguments.
        argv += ["--entrypoint", job.entrypoint[0], job.image, *job.entrypoint[1:]]
        argv += list(job.arguments)
    elif job.arguments:
        argv += [job.image, *job.arguments]
    else:
        argv += [job.image, "train"]
    return argv


def network_problem(engine: str, hosts: int, namespaces: bool, isolated: bool) -> str | None:
    """Why ``engine`` cannot give a job's hosts the network it asks for, or None.

    Docker joins no network namespace by path (podman's ``--network ns:`` has no docker
    counterpart, and its ``--network container:`` forbids a hostname of the container's
    own), so the namespace network, and isolated hosts that must reach each other in the
    job's namespace, need podman. One isolated host is a container with no network."""
    if engine_kind(engine) != "docker":
        return None
    if namespaces:
        return _DOCKER_NO_NAMESPACE.format(what="Tags: trainport:network=namespaces")
    if isolated and hosts > 1:
        return _DOCKER_NO_NAMESPACE.format(what="EnableNetworkIsolation with several hosts")
    return None


def _extra_mount(job: ContainerJob) -> str | None:
    """The checkpoint folder, relative to /opt/ml, if no mounted folder holds it."""
    rel = job.checkpoint_path[len(OPT_ML) + 1 :]
    return None if rel.split("/")[0] in MOUNTED else rel


class ContainerProcess(HostProcess):
    """A running container: signals go through the engine, and when it ends the files
    it wrote are handed back to the platform's user."""

    def __init__(self, popen: subprocess.Popen[bytes], job: ContainerJob, root: Path) -> None:
        super().__init__(popen, popen.pid)
        self.job = job
        self.root = root

    def signal(self, sig: int) -> None:
        if self.popen.poll() is not None:
            return
        subprocess.run(
            [self.job.engine, "kill", "--signal", str(int(sig)), self.job.name],
            capture_output=True,
            check=False,
        )

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._own_files()
        return code

    def group_alive(self) -> bool:
        return self.popen.poll() is None

    def _own_files(self) -> None:
        """Rootless podman: files a non-root image user wrote belong to a sub-uid the
        platform cannot upload or remove; map them back to this user."""
        if os.geteuid() == 0 or engine_kind(self.job.engine) != "podman":
            return  # root reads and removes whatever the image's user wrote
        code = ["code"] if self.job.mount_code else []
        for sub in (*MOUNTED, *code, *filter(None, [_extra_mount(self.job)])):
            path = self.root / sub
            if path.exists():
                subprocess.run(
                    [self.job.engine, "unshare", "chown", "-R", "0:0", str(path)],
                    capture_output=True,
                    check=False,
                )


class ContainerRunner(Runner):
    name = "container"

    def __init__(self, job: ContainerJob) -> None:
        self.job = job

    def base_dir(self, placement_root: Path) -> str:
        return OPT_ML

    def start(self, placement: Placement) -> HostProcess:
        for sub in MOUNTED:
            path = placement.root / sub
            path.mkdir(parents=True, exist_ok=True)
            # Whichever user the image runs as must write its model, output and checkpoints
            # there; the job's folder above stays private to the platform's user.
            if sub != "input":
                path.chmod(0o777)
        extra = _extra_mount(self.job)
        if extra:
            (placement.root / extra).mkdir(parents=True, exist_ok=True)
            (placement.root / extra).chmod(0o777)
        argv = container_argv(self.job, placement)
        log.info("starting container %s from image %s", self.job.name, self.job.image)
        try:
            popen = subprocess.Popen(
                argv,
                env={**os.environ, **self.job.secret_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {self.job.engine}: {exc}") from exc
        return ContainerProcess(popen, self.job, placement.root)


@functools.cache
def _docker_runs(docker: str) -> bool:
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_engine(setting: str) -> str | None:
    """The engine to run images with: ``setting`` ("auto", "none", "podman", "docker" or
    a path); "auto" is podman on PATH, else docker where its daemon answers."""
    if setting == "none":
        return None
    if setting != "auto":
        found = shutil.which(setting)
        if found is None:
            raise ValidationError(
                f"TRAINPORT_CONTAINER_ENGINE={setting!r} is not on PATH; install it or set "
                "auto or none"
            )
        return found
    podman = shutil.which("podman")
    if podman:
        return podman
    docker = shutil.which("docker")
    return docker if docker and _docker_runs(docker) else None


def image_present(engine: str, image: str) -> bool:
    if engine_kind(engine) == "podman":
        argv = [engine, "image", "exists", image]
    else:
        argv = [engine, "image", "inspect", image]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def installed_engine(setting: str) -> str | None:
    """The engine :func:`find_engine` would choose, judged by what is installed alone: no
    engine is asked (a docker daemon that does not answer is found when the job starts)."""
    if setting != "auto":
        return find_engine(setting)
    return shutil.which("podman") or shutil.which("docker")


class PullProgress:
    """How far a pull has come, from the lines the engine prints without a terminal
    (docker: ``<layer>: Pulling fs layer`` ... ``<layer>: Pull complete``; podman:
    ``Copying blob <digest>`` ... ``Writing manifest``): layers done of those seen."""

    _DOCKER_LAYER = re.compile(r"^([0-9a-f]{12}): (.+)$")
    _DOCKER_DONE = ("Pull complete", "Already exists")
    _PODMAN_BLOB = re.compile(r"^Copying blob (?:sha256:)?([0-9a-f]{12})")

    def __init__(self) -> None:
        self.layers: dict[str, bool] = {}
        self.last = ""

    def line(self, text: str) -> str:
        """Take one line of the engine's output; what to show now."""
        text = text.strip()
        if not text:
            return self.summary()
        self.last = text
        docker = self._DOCKER_LAYER.match(text)
        podman = self._PODMAN_BLOB.match(text)
        if docker:
            layer, state = docker.groups()
            self.layers[layer] = self.layers.get(layer, False) or state in self._DOCKER_DONE
        elif podman:
            # Podman says a blob once it starts copying it; the one before is then done.
            for key in self.layers:
                self.layers[key] = True
            self.layers[podman.group(1)] = "skipped" in text or text.endswith("done")
        elif text.startswith(("Writing manifest", "Storing signatures", "Status:", "Digest:")):
            for key in self.layers:
                self.layers[key] = True
        return self.summary()

    def summary(self) -> str:
        if self.layers:
            done = sum(self.layers.values())
            return f"{done}/{len(self.layers)} layers"
        return self.last or "starting"


def pull_image(engine: str, image: str, on_progress: Callable[[str], None] | None = None) -> None:
    """Pull ``image``, telling ``on_progress`` how far it has come at each line the engine
    prints; an error that names the image and quotes the engine when that fails."""
    progress = PullProgress()
    try:
        proc = subprocess.Popen(
            [engine, "pull", image],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise ValidationError(
            f"AlgorithmSpecification.TrainingImage {image!r}: cannot start {engine} to pull "
            f"it: {exc}"
        ) from exc
    assert proc.stdout is not None
    said: list[str] = []
    for text in proc.stdout:
        if text.strip():
            said = [*said[-4:], text.strip()]
        shown = progress.line(text)
        if on_progress is not None:
            on_progress(shown)
    code = proc.wait()
    if code != 0:
        raise ValidationError(
            f"AlgorithmSpecification.TrainingImage {image!r} is not a local folder with an "
            f"executable 'train', nor an image in {engine}, and could not be pulled: "
            f"{said[-1] if said else f'exit {code}'}. Build or load the image, "
            "or use script mode (--entry-point)"
        )


def is_framework_image(image: str) -> bool:
    """A SageMaker framework container's ECR reference (trainport can play it itself)."""
    return bool(_FRAMEWORK_IMAGE.match(image))


def safe_name(*parts: str) -> str:
    """A container name from job and host names (the engine allows [a-zA-Z0-9_.-])."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", "trainport-" + "-".join(parts))


def remove_job_containers(engine: str, job_dir: str, grace: float = 2.0) -> list[str]:
    """Stop (SIGTERM, ``grace`` seconds, SIGKILL) and remove every container of the job
    whose folder is ``job_dir``; the ids removed. For a job whose supervisor died: the
    attached ``run`` is only a client, and the engine keeps the container running."""
    listed = subprocess.run(
        [engine, "ps", "-a", "-q", "--filter", f"label={LABEL_JOB_DIR}={job_dir}"],
        capture_output=True,
        text=True,
        check=False,
    )
    ids = listed.stdout.split()
    if not ids:
        return []
    subprocess.run([engine, "stop", "-t", str(int(grace)), *ids], capture_output=True, check=False)
    # --rm containers are gone once stopped; any other is removed here.
    subprocess.run([engine, "rm", "-f", *ids], capture_output=True, check=False)
    log.info("removed the containers %s of %s", " ".join(ids), job_dir)
    return ids
