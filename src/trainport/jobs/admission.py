"""Admission: every part with a say in whether a CreateTrainingJob may be created, asked
in one fixed order through one small interface.

The request is parsed first (:func:`trainport.spec.parse_request`, a pure function of
the request); then each :class:`Check` reads the parsed job and what this machine and its
store hold, and refuses with the error of the part that knows the rule. No check pulls an
image or asks a container engine for one: the job's start does.

The order, and who decides:

1. ``command`` (:func:`trainport.host.command.check_runnable`): what runs, an entry point,
   an image folder, script mode or an engine's image, with the MPI and SMDDP launch rules
   and the engine's network rule that ride with it;
2. ``network`` (:mod:`trainport.runners.netns`): namespaces the job asks for, or needs;
3. ``channels`` (:func:`trainport.host.channels.resolve_channel`): each channel's data;
4. ``checkpoint``: the checkpoint URI's form;
5. ``script`` (:mod:`trainport.host.framework_envs`, :mod:`trainport.host.script_mode`):
   a script-mode job's framework and source archive;
6. at create, ``placement`` (:func:`place`): the runner that will hold the hosts, a Ray
   cluster's shape, the sandbox or plain processes, and whether this service allows it.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainport.config import Settings
from trainport.errors import ValidationError
from trainport.host import command as commands
from trainport.host.channels import resolve_channel
from trainport.runners.registry import select_runner
from trainport.spec import JobSpec, confined_uri
from trainport.store.api import ObjectStore, S3Uri

__all__ = ["CHECKS", "Admission", "Check", "admit", "place"]


@dataclass
class Admission:
    """What the checks read: the parsed job, the settings and the store, and how the job
    will run (asked of the command part once, by the first check that needs it)."""

    spec: JobSpec
    settings: Settings
    store: ObjectStore

    @functools.cached_property
    def how(self) -> str:
        # Asks no container engine: an image is pulled when its job starts.
        return commands.check_runnable(self.spec, ask_engine=False)


#: A part's say: returns if the job may go on, raises ValidationError naming what is wrong.
Check = Callable[[Admission], None]


def _command(admission: Admission) -> None:
    admission.how  # noqa: B018 (asked for its refusal)


def _network(admission: Admission) -> None:
    from trainport.runners.netns import netns_problem

    spec = admission.spec
    if spec.tags.get("trainport:network") == "namespaces":
        problem = netns_problem()
        if problem:
            raise ValidationError(f"Tags: trainport:network=namespaces: {problem}")
    # A container's own "no network" would cut an isolated job's hosts off from each other.
    multi = len(spec.hosts) > 1
    if admission.how == "container" and spec.network_isolation and multi and netns_problem():
        raise ValidationError(commands.ISOLATED_HOSTS_NEED_NAMESPACES)


def _channels(admission: Admission) -> None:
    for channel in admission.spec.channels:
        resolve_channel(admission.store, channel)


def _checkpoint(admission: Admission) -> None:
    if admission.spec.checkpoint_uri:
        S3Uri.parse(admission.spec.checkpoint_uri, field="CheckpointConfig.S3Uri")


def _script(admission: Admission) -> None:
    if admission.how != "script":
        return
    from trainport.host import framework_envs, script_mode

    spec, store = admission.spec, admission.store
    raw = spec.hyperparameters["sagemaker_submit_directory"].strip('"')
    if not raw.startswith("s3://") and commands.engine_may_have(spec):
        # A folder inside the image (the SDK's with network isolation): right where an
        # engine runs the image, which admission does not ask; the job's start does.
        return
    framework_envs.check_image(spec.training_image, admission.settings.envs_dir)

    uri = confined_uri(raw, "HyperParameters.sagemaker_submit_directory")
    if not store.exists(uri.bucket, uri.key):
        raise ValidationError(
            f"HyperParameters.sagemaker_submit_directory: {raw} does not exist in the "
            f"{store.description}"
        )
    # By its form first: the archive is unpacked into a folder of this machine, and a
    # program that escaped it would be found or not there, telling which files exist.
    program = script_mode.check_entry(spec.hyperparameters["sagemaker_program"].strip('"'))
    with tempfile.TemporaryDirectory(prefix="trainport-check-") as tmp:
        script_mode.unpack_sourcedir(
            store.get_bytes(uri.bucket, uri.key),
            Path(tmp),
            max_bytes=admission.settings.max_sourcedir_bytes,
        )
        if not (Path(tmp) / program).is_file():
            raise ValidationError(
                f"HyperParameters.sagemaker_program: the entry point {program!r} is not in "
                f"the source archive {raw}; check --entry-point and --source-dir"
            )


#: The parts asked about a parsed request, in this order (see the module's docstring).
CHECKS: tuple[tuple[str, Check], ...] = (
    ("command", _command),
    ("network", _network),
    ("channels", _channels),
    ("checkpoint", _checkpoint),
    ("script", _script),
)


def admit(spec: JobSpec, settings: Settings, store: ObjectStore) -> JobSpec:
    """Ask every part of :data:`CHECKS` about ``spec``, in order; the first refusal ends it."""
    admission = Admission(spec, settings, store)
    for _, check in CHECKS:
        check(admission)
    return spec


def place(spec: JobSpec, requested: str, settings: Settings, *, allow_process: bool) -> str:
    """The last say, at create: the runner that will hold the job's hosts (its name), or
    a refusal (a Ray cluster no host fits, a sandbox this machine cannot make, the process
    runner where the service refuses it)."""
    if requested == "ray":
        from trainport.placement.ray import check_cluster, check_ray_job

        check_ray_job(spec)
        check_cluster(spec, settings)
        runner_name = "ray"
    else:
        runner_name = select_runner(requested).name
    if runner_name == "process" and not allow_process:
        raise ValidationError(
            f"Training job {spec.name!r} would run under the process runner, which "
            "isolates nothing (the job could read the store, the job database and the "
            "server's keys); this server refuses it. Its operator may allow it with "
            "TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER=1, or make the sandbox work here"
        )
    return runner_name
