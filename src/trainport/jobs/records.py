"""The job record: what trainport knows about one training job, and its API view."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trainport.host.phases import MetricPoint

__all__ = ["ECHOED_REQUEST_FIELDS", "JobRecord", "MetricPoint", "Transition"]


#: The request fields DescribeTrainingJob echoes back, in its order.
ECHOED_REQUEST_FIELDS = (
    "HyperParameters",
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "DebugHookConfig",
    "ExperimentConfig",
    "TensorBoardOutputConfig",
    "Environment",
    "RetryStrategy",
)


# The SecondaryStatus of a job whose instances are up: time from the first of them counts
# as training (and billable) time.
_ON_INSTANCES = ("Downloading", "Training", "Uploading")


@dataclass(frozen=True)
class Transition:
    status: str
    start_time: float
    end_time: float | None
    message: str

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "Status": self.status,
            "StartTime": self.start_time,
            "StatusMessage": self.message,
        }
        if self.end_time is not None:
            out["EndTime"] = self.end_time
        return out


@dataclass(frozen=True)
class JobRecord:
    name: str
    arn: str
    request: dict[str, Any]
    creation_time: float
    status: str = "InProgress"
    secondary_status: str = "Starting"
    status_message: str = ""
    last_modified_time: float = 0.0
    transitions: tuple[Transition, ...] = ()
    failure_reason: str | None = None
    stop_reason: str | None = None
    training_start_time: float | None = None
    training_end_time: float | None = None
    model_artifacts: str | None = None
    final_metrics: tuple[MetricPoint, ...] = ()
    runner: str = ""
    job_dir: str = ""
    # The supervising process, to tell a live job from one whose supervisor died:
    # (pid, the process's start time in clock ticks since boot, boot id).
    supervisor: tuple[int, int, str] | None = None
    # The process starting the supervisor (same identity form). While it lives and no
    # supervisor is recorded yet, the job is being started, not orphaned.
    launcher: tuple[int, int, str] | None = None
    training_pgid: int | None = None
    training_pgids: tuple[int, ...] = ()  # one process group per host
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The job's tags as AddTags and DeleteTags left them, in order; None while they are
    # still the request's own Tags (which are kept as sent: they configured the job).
    tags: tuple[tuple[str, str], ...] | None = None
    # The hyperparameter tuning job that launched this job, if one did.
    tuning_job_arn: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobRecord:
        doc = dict(doc)
        doc["transitions"] = tuple(Transition(**t) for t in doc.get("transitions", ()))
        doc["final_metrics"] = tuple(MetricPoint(**m) for m in doc.get("final_metrics", ()))
        doc["notes"] = tuple(doc.get("notes", ()))
        doc["training_pgids"] = tuple(doc.get("training_pgids", ()))
        if doc.get("tags") is not None:
            doc["tags"] = tuple((k, v) for k, v in doc["tags"])
        for key in ("supervisor", "launcher"):
            if doc.get(key) is not None:
                doc[key] = tuple(doc[key])
        return cls(**doc)

    def current_tags(self) -> tuple[tuple[str, str], ...]:
        """The tags ListTags shows: the request's, then as AddTags and DeleteTags changed them."""
        if self.tags is not None:
            return self.tags
        return tuple((t["Key"], t.get("Value", "")) for t in self.request.get("Tags") or ())

    def to_describe(self) -> dict[str, Any]:
        """The DescribeTrainingJob response for this job."""
        req = self.request
        out: dict[str, Any] = {
            "TrainingJobName": self.name,
            "TrainingJobArn": self.arn,
            "TrainingJobStatus": self.status,
            "SecondaryStatus": self.secondary_status,
            "CreationTime": self.creation_time,
            "LastModifiedTime": self.last_modified_time or self.creation_time,
            "SecondaryStatusTransitions": [t.to_api() for t in self.transitions],
            "ModelArtifacts": {"S3ModelArtifacts": self.model_artifacts or ""},
        }
        # Echo of the request, as SageMaker's response carries it.
        for key in ECHOED_REQUEST_FIELDS:
            if key in req:
                out[key] = req[key]
        out.setdefault("StoppingCondition", {"MaxRuntimeInSeconds": 86400})
        out.setdefault(
            "ResourceConfig",
            {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        )
        # SageMaker always answers with these, and the SageMaker SDK reads them without
        # looking first (Estimator.attach): a request may have left them out.
        output = out.setdefault("OutputDataConfig", {})
        out["OutputDataConfig"] = {"KmsKeyId": "", **output}
        if self.tuning_job_arn:
            out["TuningJobArn"] = self.tuning_job_arn
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        if self.training_start_time is not None:
            out["TrainingStartTime"] = self.training_start_time
        if self.training_end_time is not None:
            out["TrainingEndTime"] = self.training_end_time
            seconds = 0  # a job that never had its instances (stopped while queued)
            if any(t.status in _ON_INSTANCES for t in self.transitions):
                start = self.training_start_time or self.creation_time
                seconds = max(1, round(self.training_end_time - start))
            out["TrainingTimeInSeconds"] = seconds
            out["BillableTimeInSeconds"] = seconds
        if self.final_metrics:
            out["FinalMetricDataList"] = [
                {"MetricName": m.name, "Value": m.value, "Timestamp": m.timestamp}
                for m in self.final_metrics
            ]
        return out
