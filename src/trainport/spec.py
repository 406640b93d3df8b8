"""CreateTrainingJob request -> validated, typed :class:`JobSpec`.

The request shape is botocore's own service model for SageMaker, so anything boto3 would send
is accepted with the same field names, and anything it would refuse is refused here with the
same kind of message (unknown fields named with their path, missing required fields, wrong
types). On top of the model's structure we check the constraints botocore leaves to the
server (patterns, lengths, enums) and trainport's own rules of form. Parsing is a pure
function of the request: what this machine can run (an engine, namespaces, the files a
request names) is asked afterwards, in the service's admission (:mod:`trainport.jobs.admission`).

trainport's extensions ride in fields botocore allows, so they work from boto3 too: tags whose
key starts with ``trainport:``, each checked by the parser its owning module registers in
:mod:`trainport.tags` (see :data:`EXTENSION_TAGS`).
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainport import tags as extension_tags
from trainport.errors import ValidationError
from trainport.store.api import S3Uri

__all__ = [
    "EXTENSION_TAGS",
    "ChannelSpec",
    "InstanceGroup",
    "JobSpec",
    "confined_local_path",
    "confined_uri",
    "parse_request",
]

DEFAULT_MAX_RUNTIME = 86400
DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"
NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")

#: Tag keys trainport reads from a request, and what each means (see :mod:`trainport.tags`).
EXTENSION_TAGS = {key: tag.describes for key, tag in extension_tags.KNOWN.items()}

MAX_HOSTS = 64
#: The longest stop grace a job may ask for: time enough to save any checkpoint, yet a
#: Stop still ends the job.
MAX_STOP_GRACE_SECONDS = 3600.0


@dataclass(frozen=True)
class InstanceGroup:
    name: str
    instance_type: str
    count: int


@dataclass(frozen=True)
class ChannelSpec:
    name: str
    s3_data_type: str  # S3Prefix | ManifestFile | AugmentedManifestFile
    s3_uri: str
    distribution: str  # FullyReplicated | ShardedByS3Key
    input_mode: str  # File | Pipe | FastFile
    content_type: str | None = None
    compression: str = "None"
    record_wrapper: str = "None"
    attribute_names: tuple[str, ...] = ()
    shuffle_seed: int | None = None

    def input_data_config_entry(self) -> dict[str, str]:
        """This channel's entry in ``/opt/ml/input/config/inputdataconfig.json``."""
        entry = {
            "TrainingInputMode": self.input_mode,
            "S3DistributionType": self.distribution,
            "RecordWrapperType": self.record_wrapper,
        }
        if self.content_type:
            entry["ContentType"] = self.content_type
        return entry


@dataclass(frozen=True)
class JobSpec:
    name: str
    request: dict[str, Any]
    hyperparameters: dict[str, str]
    environment: dict[str, str]
    training_image: str | None
    entrypoint: tuple[str, ...]
    arguments: tuple[str, ...]
    input_mode: str
    channels: tuple[ChannelSpec, ...]
    output_path: str
    instance_type: str
    instance_count: int
    max_runtime_seconds: int
    metric_definitions: tuple[tuple[str, str], ...]
    checkpoint_uri: str | None
    checkpoint_local_path: str
    tags: dict[str, str] = field(default_factory=dict)
    instance_groups: tuple[InstanceGroup, ...] = ()
    # EnableNetworkIsolation: the hosts reach each other and nothing else (see README,
    # "Network isolation", for how each runner keeps it).
    network_isolation: bool = False
    # RetryStrategy.MaximumRetryAttempts: runs again after trainport's own failures.
    retry_attempts: int = 0

    @property
    def hosts(self) -> tuple[str, ...]:
        """algo-1 .. algo-N, in the order SageMaker names them."""
        return tuple(f"algo-{k}" for k in range(1, self.instance_count + 1))

    def group_of(self, host: str) -> InstanceGroup:
        """The instance group a host belongs to (groups take hosts in order)."""
        if not self.instance_groups:
            return InstanceGroup("homogeneousCluster", self.instance_type, self.instance_count)
        index = int(host.split("-")[1]) - 1
        for group in self.instance_groups:
            if index < group.count:
                return group
            index -= group.count
        raise ValueError(f"{host} is outside the job's {self.instance_count} hosts")

    def group_hosts(self, group: InstanceGroup) -> tuple[str, ...]:
        return tuple(h for h in self.hosts if self.group_of(h).name == group.name)

    @property
    def torch_distributed(self) -> bool:
        flag = self.hyperparameters.get("sagemaker_torch_distributed_enabled", "")
        return (
            flag.strip('"').lower() == "true"
            or self.tags.get("trainport:distribution") == "torchrun"
        )

    @property
    def processes_per_host(self) -> int | None:
        raw = self.tags.get("trainport:processes-per-host")
        return int(raw) if raw is not None else None

    @property
    def runner(self) -> str | None:
        return self.tags.get("trainport:runner")

    @property
    def pipe_workers(self) -> int | None:
        """P per-worker FIFO series per Pipe channel, or None for one shared series."""
        raw = self.tags.get("trainport:pipe-workers")
        return int(raw) if raw is not None else None

    @property
    def stop_grace_seconds(self) -> float | None:
        raw = self.tags.get("trainport:stop-grace-seconds")
        return float(raw) if raw is not None else None


def _validate_shape(request: dict[str, Any]) -> None:
    from trainport.config import load_settings
    from trainport.servicemodel import request_shapes, validate

    try:
        cache: Path | None = load_settings().home / "cache"
    except ValidationError:
        cache = None
    root, shapes = request_shapes("CreateTrainingJob", cache)
    problems = validate(request, root, shapes)
    if problems:
        raise ValidationError("invalid CreateTrainingJob request:\n  " + "\n  ".join(problems))


def _refuse_nul(value: Any, where: str) -> None:
    """No string of a request may hold a NUL byte: it cannot travel in an environment
    variable, an argument or a path, and would only fail inside the running job."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValidationError(f"{where}: {value!r} holds a NUL byte; remove it")
    elif isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key, f"{where} (a key)")
            _refuse_nul(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _refuse_nul(item, f"{where}[{i}]")


def confined_uri(uri: str, where: str) -> S3Uri:
    """``uri`` parsed, refusing '.' and '..' segments in its key: in the embedded store a
    key is a path, and such a key would reach outside its bucket."""
    parsed = S3Uri.parse(uri, field=where)
    if any(part in (".", "..") for part in parsed.key.split("/")):
        raise ValidationError(
            f"{where}: {uri!r} has '.' or '..' segments in its key; write the prefix without them"
        )
    return parsed


def confined_local_path(path: str, where: str = "CheckpointConfig.LocalPath") -> str:
    """``path`` normalised, and refused unless it lies inside /opt/ml (not /opt/ml itself).

    A colon is refused too: a container engine's volume option separates its fields with
    colons, so the container runner could not mount such a folder."""
    normal = posixpath.normpath(path) if path.startswith("/") else ""
    if not normal.startswith("/opt/ml/"):
        raise ValidationError(
            f"{where} {path!r} must lie under /opt/ml/ (after resolving '.' and '..') so "
            "each job keeps its checkpoints in its own tree"
        )
    if ":" in normal:
        raise ValidationError(
            f"{where} {path!r} holds a ':'; container engines cannot mount such a folder, so "
            "name it without one"
        )
    return normal


def _channel(raw: dict[str, Any], job_mode: str, index: int) -> ChannelSpec:
    name = raw["ChannelName"]
    where = f"InputDataConfig[{index}] ({name})"
    if not isinstance(name, str) or not name.strip(".") or "/" in name:
        # '.' and '..' fit the service model's pattern, but name a folder that is not the
        # channel's own (.. is /opt/ml/input itself).
        raise ValidationError(
            f"InputDataConfig[{index}].ChannelName {name!r} is not a folder name; use "
            "letters, digits, '.', '-' and '_', not only dots"
        )
    source = raw["DataSource"].get("S3DataSource")
    if source is None:
        raise ValidationError(
            f"{where}: only DataSource.S3DataSource is supported (FileSystemDataSource and "
            "DatasetSource need AWS services); put the data in the object store"
        )
    confined_uri(source["S3Uri"], f"{where}.DataSource.S3DataSource.S3Uri")
    mode = raw.get("InputMode") or job_mode
    data_type = source["S3DataType"]
    compression = raw.get("CompressionType", "None")
    attributes = tuple(source.get("AttributeNames") or ())
    if compression == "Gzip" and mode != "Pipe":
        raise ValidationError(
            f"{where}: CompressionType Gzip is only supported in Pipe mode (this channel is "
            f"{mode}); decompress the objects or set InputMode to Pipe"
        )
    if attributes and data_type != "AugmentedManifestFile":
        raise ValidationError(
            f"{where}: AttributeNames needs S3DataType AugmentedManifestFile (it is {data_type})"
        )
    if data_type == "AugmentedManifestFile" and not attributes:
        raise ValidationError(f"{where}: an AugmentedManifestFile channel needs AttributeNames")
    if data_type == "AugmentedManifestFile" and mode != "Pipe":
        raise ValidationError(
            f"{where}: an AugmentedManifestFile channel needs InputMode Pipe (this channel is "
            f"{mode})"
        )
    if mode == "FastFile" and data_type != "S3Prefix":
        raise ValidationError(
            f"{where}: FastFile mode serves S3Prefix channels only (this one is {data_type}); "
            "use File or Pipe mode"
        )
    shuffle = raw.get("ShuffleConfig")
    return ChannelSpec(
        name=name,
        s3_data_type=data_type,
        s3_uri=source["S3Uri"],
        distribution=source.get("S3DataDistributionType", "FullyReplicated"),
        input_mode=mode,
        content_type=raw.get("ContentType"),
        compression=compression,
        record_wrapper=raw.get("RecordWrapperType", "None"),
        attribute_names=attributes,
        shuffle_seed=int(shuffle["Seed"]) if shuffle else None,
    )


@extension_tags.parser("trainport:runner")
def _runner_tag(value: str, tags: Mapping[str, str]) -> None:
    if value not in ("auto", "sandbox", "process", "ray"):
        raise ValidationError(
            f"Tags: trainport:runner={value!r}; use auto, sandbox, process or ray"
        )


@extension_tags.parser("trainport:pipe-workers")
def _pipe_workers_tag(value: str, tags: Mapping[str, str]) -> None:
    if not (value.isdigit() and 1 <= int(value) <= 1024):
        raise ValidationError(
            f"Tags: trainport:pipe-workers={value!r} must be a whole number of worker "
            "processes from 1 to 1024"
        )


@extension_tags.parser("trainport:distribution")
def _distribution_tag(value: str, tags: Mapping[str, str]) -> None:
    if value not in ("torchrun", "mpi", "smddp"):
        raise ValidationError(f"Tags: trainport:distribution={value!r}; use torchrun, mpi or smddp")


@extension_tags.parser("trainport:processes-per-host")
def _processes_tag(value: str, tags: Mapping[str, str]) -> None:
    if not (value.isdigit() and 1 <= int(value) <= 64):
        raise ValidationError(
            f"Tags: trainport:processes-per-host={value!r} must be a whole number from 1 to 64"
        )


@extension_tags.parser("trainport:network")
def _network_tag(value: str, tags: Mapping[str, str]) -> None:
    if value not in ("loopback", "namespaces"):
        raise ValidationError(f"Tags: trainport:network={value!r}; use loopback or namespaces")


@extension_tags.parser("trainport:stop-grace-seconds")
def _stop_grace_tag(value: str, tags: Mapping[str, str]) -> None:
    _check_stop_grace(value)


def _check_stop_grace(value: str) -> None:
    """A finite number of seconds in range: ``inf`` would make a Stop never kill, and
    ``nan`` compares false with everything, so it would kill at once."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_STOP_GRACE_SECONDS):
        raise ValidationError(
            f"Tags: trainport:stop-grace-seconds={value!r} must be a number of seconds from 0 "
            f"to {MAX_STOP_GRACE_SECONDS:g}"
        )


def tags_of(request: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in request.get("Tags") or []}


def _check_fifo_names(channels: tuple[ChannelSpec, ...], per_worker: bool) -> None:
    """A Pipe channel's FIFOs (``<name>_<epoch>``, ``<name>_w<k>_<epoch>``) must not take
    the name another channel's files or FIFOs live under."""
    fifo = re.compile(r"_(w\d+_)?\d+" if per_worker else r"_\d+")
    names = [c.name for c in channels]
    for ch in channels:
        if ch.input_mode != "Pipe":
            continue
        for other in names:
            rest = other[len(ch.name) :]
            if other != ch.name and other.startswith(ch.name) and fifo.fullmatch(rest):
                raise ValidationError(
                    f"InputDataConfig: channel {other!r} has the name of a FIFO of Pipe "
                    f"channel {ch.name!r}; rename one of them"
                )


def _metric_definitions(algo: dict[str, Any], validate: bool) -> tuple[tuple[str, str], ...]:
    """The (Name, Regex) pairs, each Regex compiled once at submission: one that cannot
    compile would otherwise pass and only fail inside the running job."""
    out = []
    for i, raw in enumerate(algo.get("MetricDefinitions") or []):
        try:
            if validate:
                re.compile(raw["Regex"])
        except re.error as exc:
            raise ValidationError(
                f"AlgorithmSpecification.MetricDefinitions[{i}].Regex {raw['Regex']!r} "
                f"(metric {raw['Name']!r}) is not a valid regular expression: {exc}"
            ) from exc
        out.append((raw["Name"], raw["Regex"]))
    return tuple(out)


def parse_request(request: dict[str, Any], *, validate: bool = True) -> JobSpec:
    """Validate a CreateTrainingJob request and return the typed spec trainport runs.

    ``validate=False`` skips the service-model check, for a request that was validated
    when it was stored (loading the model costs a noticeable part of a job's start).
    """
    if not isinstance(request, dict):
        raise ValidationError(
            "a training job request must be a mapping of CreateTrainingJob fields"
        )
    name = request.get("TrainingJobName")
    if isinstance(name, str) and not NAME_PATTERN.fullmatch(name):
        raise ValidationError(
            f"TrainingJobName {name!r} is invalid: use 1-63 letters, digits and hyphens, "
            "starting and ending with a letter or digit"
        )
    _refuse_nul(request, "CreateTrainingJob")
    if validate:
        _validate_shape(request)
    algo = request.get("AlgorithmSpecification") or {}
    if not algo:
        raise ValidationError(
            "AlgorithmSpecification is required: give TrainingImage (a local directory "
            "holding an executable 'train') or ContainerEntrypoint, or use script mode"
        )
    job_mode = algo.get("TrainingInputMode", "File")
    channels = tuple(
        _channel(raw, job_mode, i) for i, raw in enumerate(request.get("InputDataConfig") or [])
    )
    seen: set[str] = set()
    for ch in channels:
        if ch.name in seen:
            raise ValidationError(f"InputDataConfig: channel name {ch.name!r} appears twice")
        seen.add(ch.name)
    _check_fifo_names(channels, "trainport:pipe-workers" in tags_of(request))
    output = request["OutputDataConfig"]["S3OutputPath"]
    confined_uri(output, "OutputDataConfig.S3OutputPath")
    resources = request.get("ResourceConfig") or {}
    groups = tuple(
        InstanceGroup(g["InstanceGroupName"], g["InstanceType"], int(g["InstanceCount"]))
        for g in resources.get("InstanceGroups") or ()
    )
    if groups:
        if len({g.name for g in groups}) != len(groups):
            raise ValidationError("ResourceConfig.InstanceGroups: group names must be unique")
        count = sum(g.count for g in groups)
    else:
        count = int(resources.get("InstanceCount", 1))
    if not 1 <= count <= MAX_HOSTS:
        raise ValidationError(
            f"ResourceConfig: {count} hosts asked for; trainport runs 1 to {MAX_HOSTS} hosts "
            "of a job on this machine"
        )
    checkpoint = request.get("CheckpointConfig") or {}
    if checkpoint:
        confined_uri(checkpoint["S3Uri"], "CheckpointConfig.S3Uri")
    local_path = confined_local_path(checkpoint.get("LocalPath", DEFAULT_CHECKPOINT_PATH))
    isolation = request.get("EnableNetworkIsolation", False)
    if not isinstance(isolation, bool):
        raise ValidationError(
            f"EnableNetworkIsolation {isolation!r} must be true or false (a JSON boolean)"
        )
    tags = {t["Key"]: t["Value"] for t in request.get("Tags") or []}
    extension_tags.check(tags)
    return JobSpec(
        name=request["TrainingJobName"],
        request=request,
        hyperparameters=dict(request.get("HyperParameters") or {}),
        environment=dict(request.get("Environment") or {}),
        training_image=algo.get("TrainingImage"),
        entrypoint=tuple(algo.get("ContainerEntrypoint") or ()),
        arguments=tuple(algo.get("ContainerArguments") or ()),
        input_mode=job_mode,
        channels=channels,
        output_path=output,
        instance_type=resources.get("InstanceType", "local"),
        instance_count=count,
        instance_groups=groups,
        max_runtime_seconds=int(
            (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", DEFAULT_MAX_RUNTIME)
        ),
        metric_definitions=_metric_definitions(algo, validate),
        checkpoint_uri=checkpoint.get("S3Uri"),
        checkpoint_local_path=local_path,
        tags=tags,
        network_isolation=isolation,
        retry_attempts=int((request.get("RetryStrategy") or {}).get("MaximumRetryAttempts", 0)),
    )
