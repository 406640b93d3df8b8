"""Job files and the convenience flags of ``trainport run``, turned into a request.

A job file is a CreateTrainingJob request in YAML or JSON with boto3's field names; the
flags (``--entry-point``, ``--hp``, ``--channel`` ...) fill or extend one, so a newcomer
never has to write the whole request. Script mode packs the code into the store as
``sourcedir.tar.gz`` and a ``--channel`` given as a local folder is uploaded first.

Those uploads go under ``s3://trainport/<job>/<submission>/``, where the submission id is
random and new for each ``trainport run``: a refused duplicate of a name, or two runs of one
name at the same instant, each write only their own keys and never the stored code or data
of the job that holds the name.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from trainport.errors import ValidationError
from trainport.host.command import PLAIN_SCRIPT_IMAGE
from trainport.store.api import ObjectStore, S3Uri
from trainport.yamldoc import load_yaml

__all__ = [
    "DEFAULT_BUCKET",
    "DEFAULT_ROLE",
    "SCRIPT_IMAGE",
    "build_request",
    "discard_uploads",
    "new_submission",
    "upload_prefix",
]

DEFAULT_ROLE = "arn:aws:iam::000000000000:role/trainport"
DEFAULT_BUCKET = "trainport"
SCRIPT_IMAGE = PLAIN_SCRIPT_IMAGE
DEFAULT_INSTANCE_TYPE = "ml.m5.large"


def _load_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValidationError(f"cannot read the job file {path}: {exc.strerror}") from exc
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"the job file {path} is not valid JSON: {exc}") from exc
    else:
        doc = load_yaml(text, f"the job file {path}")
    if not isinstance(doc, dict):
        raise ValidationError(
            f"the job file {path} must hold a mapping of CreateTrainingJob fields "
            "(TrainingJobName, AlgorithmSpecification, ...)"
        )
    return doc


def _pairs(values: tuple[str, ...], flag: str) -> list[tuple[str, str]]:
    out = []
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise ValidationError(f"{flag} {raw!r}: write it as KEY=VALUE")
        out.append((key, value))
    return out


def _default_name(stem: str) -> str:
    base = "".join(c if c.isalnum() else "-" for c in stem).strip("-")[:40] or "job"
    return f"{base}-{datetime.now().strftime('%Y%m%d-%H%M%S-%f')[:-3]}"


def new_submission() -> str:
    """A random id that names one submission's uploads and no other's."""
    return secrets.token_hex(8)


def upload_prefix(job: str, submission: str) -> S3Uri:
    """Where one submission of ``job`` puts its code and local channels."""
    return S3Uri(DEFAULT_BUCKET, f"{job}/{submission}/")


def build_request(
    job_file: Path | None,
    *,
    name: str | None,
    entry_point: str | None,
    source_dir: str | None,
    image: str | None,
    hps: tuple[str, ...],
    channels: tuple[str, ...],
    output: str | None,
    metrics: tuple[str, ...],
    env: tuple[str, ...],
    checkpoint: str | None,
    max_run: int | None,
    stop_grace: float | None,
    store: ObjectStore,
    tags: tuple[str, ...] = (),
    instance_count: int | None = None,
    torchrun: bool = False,
    processes_per_host: int | None = None,
    submission: str | None = None,
    mpi: bool = False,
    mpi_options: str | None = None,
    check_name: Callable[[str], None] = lambda name: None,
) -> dict[str, Any]:
    """A CreateTrainingJob request from a job file and/or the convenience flags.

    ``check_name`` is called with the job's name before anything is uploaded (it raises
    when the name is taken); uploads go under :func:`upload_prefix` of ``submission``."""
    hp_pairs, channel_pairs = _pairs(hps, "--hp"), _pairs(channels, "--channel")
    metric_pairs, env_pairs = _pairs(metrics, "--metric"), _pairs(env, "--env")
    tag_pairs = _pairs(tags, "--tag")
    request: dict[str, Any] = _load_file(job_file) if job_file else {}
    stem = job_file.stem if job_file else Path(entry_point or "job").stem
    request["TrainingJobName"] = name or request.get("TrainingJobName") or _default_name(stem)
    job = request["TrainingJobName"]
    check_name(job)
    uploads = upload_prefix(job, submission or new_submission())
    request.setdefault("RoleArn", DEFAULT_ROLE)
    if job_file is None:
        request.setdefault(
            "OutputDataConfig", {"S3OutputPath": output or f"s3://{DEFAULT_BUCKET}/output"}
        )
        # A real instance type, so that the SageMaker SDK can attach to the job: it takes
        # "local" only with a LocalSession. "local" is still accepted when given.
        request.setdefault(
            "ResourceConfig",
            {"InstanceType": DEFAULT_INSTANCE_TYPE, "InstanceCount": 1, "VolumeSizeInGB": 1},
        )
    elif output:
        request.setdefault("OutputDataConfig", {})["S3OutputPath"] = output
    # A job file without AlgorithmSpecification gets the usual clear error from the
    # checks downstream ("give TrainingImage ... or ContainerEntrypoint").
    algo = request.setdefault("AlgorithmSpecification", {})
    if not isinstance(algo, dict):
        raise ValidationError("AlgorithmSpecification must be a mapping of its fields")
    algo.setdefault("TrainingInputMode", "File")
    if image:
        algo["TrainingImage"] = image
    if isinstance(algo.get("TrainingImage"), str) and Path(algo["TrainingImage"]).is_dir():
        # A folder of the submitter's, named as they would name it: its full path is what
        # the job runs (a relative name in a request is an image's).
        algo["TrainingImage"] = str(Path(algo["TrainingImage"]).expanduser().resolve())
    hyper: dict[str, str] = (
        request.setdefault("HyperParameters", {}) if (hp_pairs or entry_point) else {}
    )
    for key, value in hp_pairs:
        hyper[key] = value  # --hp converts: every value is a string, as the API wants
    if entry_point:
        from trainport.host.script_mode import pack_entry_point, pack_sourcedir

        if source_dir:
            tarball = pack_sourcedir(Path(source_dir), entry_point)
        else:
            tarball = pack_entry_point(Path(entry_point))
            entry_point = Path(entry_point).name
        target = uploads.child("source/sourcedir.tar.gz")
        store.put_bytes(target.bucket, target.key, tarball)
        # Quoted as the SageMaker SDK writes them; trainport and the toolkit both decode.
        hyper["sagemaker_program"] = json.dumps(entry_point)
        hyper["sagemaker_submit_directory"] = json.dumps(str(target))
        # The SDK writes it too, and its framework estimators' attach decode it.
        hyper.setdefault("sagemaker_container_log_level", json.dumps(logging.INFO))
        algo.setdefault("TrainingImage", SCRIPT_IMAGE)
    if channel_pairs:
        configs = request.setdefault("InputDataConfig", [])
        for channel, where in channel_pairs:
            uri = where
            if not where.startswith("s3://"):
                folder = Path(where)
                if not folder.is_dir():
                    raise ValidationError(
                        f"--channel {channel}={where}: give an s3:// URI or an existing folder"
                    )
                uri = _upload_folder(store, folder, uploads.child(f"input/{channel}/"))
            configs.append(
                {
                    "ChannelName": channel,
                    "DataSource": {
                        "S3DataSource": {
                            "S3DataType": "S3Prefix",
                            "S3Uri": uri,
                            "S3DataDistributionType": "FullyReplicated",
                        }
                    },
                }
            )
    if metric_pairs:
        defs = algo.setdefault("MetricDefinitions", [])
        defs += [{"Name": k, "Regex": v} for k, v in metric_pairs]
    if env_pairs:
        request.setdefault("Environment", {}).update(dict(env_pairs))
    if checkpoint:
        request["CheckpointConfig"] = {"S3Uri": checkpoint}
    if max_run is not None:
        request.setdefault("StoppingCondition", {})["MaxRuntimeInSeconds"] = max_run
    added: list[dict[str, str]] = [{"Key": k, "Value": v} for k, v in tag_pairs]
    if stop_grace is not None:
        added.append({"Key": "trainport:stop-grace-seconds", "Value": str(stop_grace)})
    if instance_count is not None:
        request.setdefault("ResourceConfig", {})["InstanceCount"] = instance_count
    if torchrun and mpi:
        raise ValidationError("--torchrun and --mpi: choose one launcher")
    if torchrun:
        added.append({"Key": "trainport:distribution", "Value": "torchrun"})
    if mpi:
        added.append({"Key": "trainport:distribution", "Value": "mpi"})
    if mpi_options is not None:
        added.append({"Key": "trainport:mpi-options", "Value": mpi_options})
    if processes_per_host is not None:
        added.append({"Key": "trainport:processes-per-host", "Value": str(processes_per_host)})
    if added:
        request.setdefault("Tags", []).extend(added)
    return request


def discard_uploads(store: ObjectStore, job: str, submission: str) -> None:
    """Delete what one submission uploaded, once its job was refused: nothing else can
    ever point at those keys."""
    prefix = upload_prefix(job, submission)
    for obj in store.list_objects(prefix.bucket, prefix.key):
        store.delete(prefix.bucket, obj.key)


def _upload_folder(store: ObjectStore, folder: Path, target: S3Uri) -> str:
    from trainport.store.transfer import Transfer, upload_all

    items = [
        Transfer(target.bucket, target.key + str(p.relative_to(folder)), p, p.stat().st_size)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]
    from trainport.config import load_settings

    # As many in flight as the store's connections were sized for (see open_store).
    upload_all(
        store,
        items,
        workers=load_settings().download_workers,
        label=f"upload {folder}",
        progress=sys.stderr.isatty(),
        keep_bar=True,
    )
    return str(target)
