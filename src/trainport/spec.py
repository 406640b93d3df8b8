"""CreateTrainingJob request -> validated, typed :class:`JobSpec`.

The request shape is botocore's own service model for SageMaker, so anything boto3 would send
is accepted with the same field names, and anything it would refuse is refused here with the
same kind of message (unknown fields named with their path, missing required fields, wrong
types). On top of the model's structure we check the constraints botocore leaves to the
server (patterns, lengths, enums) and trainport's own rules (what it can run on this machine).

trainport's extensions ride in fields botocore allows, so they work from boto3 too: tags whose
key starts with ``trainport:`` (see :data:`EXTENSION_TAGS`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import botocore.session
from botocore.model import ListShape, MapShape, Shape, StructureShape
from botocore.validate import ParamValidator

from trainport.errors import ValidationError
from trainport.store.api import S3Uri

__all__ = ["EXTENSION_TAGS", "ChannelSpec", "JobSpec", "parse_request"]

DEFAULT_MAX_RUNTIME = 86400
DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"
NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")

#: Tag keys trainport reads from a request (values are strings, as tags are).
EXTENSION_TAGS = {
    "trainport:runner": "runner for this job: sandbox, process or auto",
    "trainport:stop-grace-seconds": "seconds between SIGTERM and SIGKILL on stop (default 120)",
}


@functools.cache
def _service_model() -> Any:
    return botocore.session.get_session().get_service_model("sagemaker")


def create_request_shape() -> StructureShape:
    shape = _service_model().operation_model("CreateTrainingJob").input_shape
    assert isinstance(shape, StructureShape)
    return shape


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

    @property
    def runner(self) -> str | None:
        return self.tags.get("trainport:runner")

    @property
    def stop_grace_seconds(self) -> float | None:
        raw = self.tags.get("trainport:stop-grace-seconds")
        return float(raw) if raw is not None else None


def _walk_constraints(value: Any, shape: Shape, path: str, problems: list[str]) -> None:
    """Check what botocore's client-side validator leaves to the server."""
    meta = shape.metadata
    if isinstance(shape, StructureShape) and isinstance(value, dict):
        for name, sub in value.items():
            if name in shape.members:
                _walk_constraints(
                    sub, shape.members[name], f"{path}.{name}" if path else name, problems
                )
    elif isinstance(shape, ListShape) and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path} has {len(value)} entries; at most {meta['max']} are allowed")
        for i, item in enumerate(value):
            _walk_constraints(item, shape.member, f"{path}[{i}]", problems)
    elif isinstance(shape, MapShape) and isinstance(value, dict):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path} has {len(value)} entries; at most {meta['max']} are allowed")
        for key, item in value.items():
            _walk_constraints(key, shape.key, f"{path} key {key!r}", problems)
            _walk_constraints(item, shape.value, f"{path}.{key}", problems)
    elif shape.type_name == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            problems.append(f"{path}: {value!r} is not one of {', '.join(shape.enum)}")
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path} is {len(value)} characters long; at most {meta['max']}")
        pattern = meta.get("pattern")
        if pattern and not shape.enum:
            try:
                ok = re.fullmatch(pattern, value, re.DOTALL) is not None
            except re.error:
                ok = True  # a pattern Python's re cannot read is not ours to enforce
            if not ok:
                problems.append(f"{path}: {value!r} does not match the pattern {pattern}")
    elif (
        shape.type_name in ("integer", "long")
        and isinstance(value, int)
        and "max" in meta
        and value > meta["max"]
    ):
        problems.append(f"{path}: {value} is above the maximum {meta['max']}")


def _validate_shape(request: dict[str, Any]) -> None:
    shape = create_request_shape()
    report = ParamValidator().validate(request, shape)
    problems = [line for line in report.generate_report().splitlines() if line.strip()]
    if not problems:
        _walk_constraints(request, shape, "", problems)
    if problems:
        raise ValidationError("invalid CreateTrainingJob request:\n  " + "\n  ".join(problems))


def _channel(raw: dict[str, Any], job_mode: str, index: int) -> ChannelSpec:
    name = raw["ChannelName"]
    where = f"InputDataConfig[{index}] ({name})"
    source = raw["DataSource"].get("S3DataSource")
    if source is None:
        raise ValidationError(
            f"{where}: only DataSource.S3DataSource is supported (FileSystemDataSource and "
            "DatasetSource need AWS services); put the data in the object store"
        )
    S3Uri.parse(source["S3Uri"], field=f"{where}.DataSource.S3DataSource.S3Uri")
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
    if mode != "File" or data_type == "AugmentedManifestFile":
        raise ValidationError(
            f"{where}: input mode {mode} with S3DataType {data_type} is not available in this "
            "version of trainport; use TrainingInputMode File with S3Prefix or ManifestFile"
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
    output = request["OutputDataConfig"]["S3OutputPath"]
    S3Uri.parse(output, field="OutputDataConfig.S3OutputPath")
    resources = request.get("ResourceConfig") or {}
    if resources.get("InstanceGroups"):
        raise ValidationError(
            "ResourceConfig.InstanceGroups: heterogeneous clusters are not available in this "
            "version of trainport; use InstanceCount 1"
        )
    count = int(resources.get("InstanceCount", 1))
    if count != 1:
        raise ValidationError(
            f"ResourceConfig.InstanceCount is {count}; this version of trainport runs "
            "single-host jobs (InstanceCount 1)"
        )
    checkpoint = request.get("CheckpointConfig") or {}
    if checkpoint:
        S3Uri.parse(checkpoint["S3Uri"], field="CheckpointConfig.S3Uri")
    local_path = checkpoint.get("LocalPath", DEFAULT_CHECKPOINT_PATH)
    if not local_path.startswith("/opt/ml/"):
        raise ValidationError(
            f"CheckpointConfig.LocalPath {local_path!r} must lie under /opt/ml/ so each job "
            "keeps its checkpoints in its own tree"
        )
    tags = {t["Key"]: t["Value"] for t in request.get("Tags") or []}
    for key, value in tags.items():
        if key.startswith("trainport:") and key not in EXTENSION_TAGS:
            raise ValidationError(
                f"Tags: unknown trainport extension {key!r}; known: {', '.join(EXTENSION_TAGS)}"
            )
        if key == "trainport:runner" and value not in ("auto", "sandbox", "process"):
            raise ValidationError(f"Tags: trainport:runner={value!r}; use auto, sandbox or process")
        if key == "trainport:stop-grace-seconds":
            try:
                if float(value) < 0:
                    raise ValueError(value)
            except ValueError as exc:
                raise ValidationError(
                    f"Tags: trainport:stop-grace-seconds={value!r} must be a number of seconds >= 0"
                ) from exc
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
        max_runtime_seconds=int(
            (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds", DEFAULT_MAX_RUNTIME)
        ),
        metric_definitions=tuple(
            (m["Name"], m["Regex"]) for m in algo.get("MetricDefinitions") or []
        ),
        checkpoint_uri=checkpoint.get("S3Uri"),
        checkpoint_local_path=local_path,
        tags=tags,
    )
