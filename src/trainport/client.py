"""A client of a running ``trainport server``, with the methods of the local JobService.

The CLI uses it when given ``--endpoint`` (or ``TRAINPORT_ENDPOINT``): the same commands,
but jobs go through the server (and its scheduler). It talks the SageMaker and CloudWatch
Logs APIs with boto3, so it is also a worked example of pointing boto3 at trainport.

Which key signs the requests, first found first:

1. ``TRAINPORT_ACCESS_KEY_ID``/``TRAINPORT_SECRET_ACCESS_KEY``, when set;
2. the server's own key, when the server keeps its keys under this machine's
   ``TRAINPORT_HOME`` (``TRAINPORT_SERVER_KEYS``, or its key file): a server on the same
   home needs nothing configured;
3. the AWS profile ``TRAINPORT_PROFILE`` names (``trainport`` by default) in the AWS shared
   credentials file, when it has one.

The user's own AWS credentials (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``~/.aws``) are
used only when asked (``trainport --aws-credentials``, or ``TRAINPORT_AWS_CREDENTIALS=1``):
they are for AWS, and a trainport server does not know them. Instance metadata (EC2, ECS)
is never asked for credentials. A loopback endpoint is reached directly, whatever proxy
the environment names. Objects the CLI uploads (script-mode sources, local channel
folders) go to the store this process is configured with, which must be the server's too
(the same ``TRAINPORT_HOME``, or the same S3-compatible endpoint).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from trainport.config import ClientKey, Settings, client_key, load_settings
from trainport.errors import NotFoundError, ResourceInUseError, TrainportError, ValidationError
from trainport.jobs.db import ListQuery
from trainport.jobs.records import ECHOED_REQUEST_FIELDS, JobRecord, MetricPoint, Transition
from trainport.jobs.status import Status
from trainport.store.api import ObjectStore
from trainport.store.registry import open_store

__all__ = ["RemoteJobService"]

LogLine = tuple[float, str]
_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return float(value)


def record_from_describe(doc: dict[str, Any]) -> JobRecord:
    """A JobRecord view of a DescribeTrainingJob response (what the CLI prints from)."""
    return JobRecord(
        name=doc["TrainingJobName"],
        arn=doc["TrainingJobArn"],
        request={k: doc[k] for k in ECHOED_REQUEST_FIELDS if k in doc},
        creation_time=_epoch(doc.get("CreationTime")) or 0.0,
        status=doc["TrainingJobStatus"],
        secondary_status=doc.get("SecondaryStatus", ""),
        status_message=(doc.get("SecondaryStatusTransitions") or [{}])[-1].get("StatusMessage", ""),
        last_modified_time=_epoch(doc.get("LastModifiedTime")) or 0.0,
        transitions=tuple(
            Transition(
                t["Status"],
                _epoch(t.get("StartTime")) or 0.0,
                _epoch(t.get("EndTime")),
                t.get("StatusMessage", ""),
            )
            for t in doc.get("SecondaryStatusTransitions", ())
        ),
        failure_reason=doc.get("FailureReason"),
        training_start_time=_epoch(doc.get("TrainingStartTime")),
        training_end_time=_epoch(doc.get("TrainingEndTime")),
        model_artifacts=(doc.get("ModelArtifacts") or {}).get("S3ModelArtifacts") or None,
        final_metrics=tuple(
            MetricPoint(m["MetricName"], float(m["Value"]), _epoch(m.get("Timestamp")) or 0.0)
            for m in doc.get("FinalMetricDataList", ())
        ),
    )


def _plain(value: Any) -> Any:
    """``value`` with botocore's datetimes as epoch seconds, as the local service gives
    them: what the CLI prints must be JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return value


_REFUSED_KEY = ("UnrecognizedClientException", "InvalidSignatureException")
_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


def _translate(exc: Exception, key: ClientKey | None = None, endpoint: str = "") -> TrainportError:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", str(exc))
        if code == "ResourceInUse":
            return ResourceInUseError(message)
        if code in _REFUSED_KEY and key is not None:
            return ValidationError(
                f"the server at {endpoint} does not accept the access key {key.key_id} "
                f"({key.source}): set TRAINPORT_ACCESS_KEY_ID/TRAINPORT_SECRET_ACCESS_KEY "
                "to the key `trainport server` printed, or use the server's TRAINPORT_HOME"
            )
        if "not found" in message.lower():
            return NotFoundError(message)
        return ValidationError(f"{code}: {message}")
    return TrainportError(f"cannot talk to the trainport server at {endpoint}: {exc}")


def _loopback(endpoint: str) -> bool:
    from urllib.parse import urlsplit

    host = urlsplit(endpoint).hostname or ""
    return host.startswith(_LOOPBACK) or host in ("localhost", "::1")


def _aws_credentials(session: Any) -> ClientKey:
    """The user's AWS credentials, from the variables, profiles and files only: the
    instance-metadata providers are taken out of the chain first."""
    from botocore.exceptions import BotoCoreError

    resolver = session._session.get_component("credential_provider")
    for name in ("iam-role", "container-role"):
        if resolver.get_provider(name) is not None:
            resolver.remove(name)
    try:
        found = session.get_credentials()
    except BotoCoreError as exc:
        raise ValidationError(
            f"--aws-credentials: cannot read your AWS credentials: {exc}"
        ) from exc
    if found is None:
        raise ValidationError(
            "--aws-credentials: no AWS credentials found (AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE or ~/.aws/credentials)"
        )
    frozen = found.get_frozen_credentials()
    return ClientKey(frozen.access_key, frozen.secret_key, "your AWS credentials", frozen.token)


class RemoteJobService:
    """The subset of JobService the CLI uses, over HTTP."""

    def __init__(
        self,
        endpoint: str,
        settings: Settings | None = None,
        *,
        aws_credentials: bool | None = None,
    ) -> None:
        import boto3
        import botocore.config

        self.endpoint = endpoint
        self.settings = settings or load_settings()
        session = boto3.session.Session()
        if aws_credentials is None:
            aws_credentials = self.settings.use_aws_credentials
        self.key = _aws_credentials(session) if aws_credentials else self._trainport_key()
        config = botocore.config.Config(proxies={}) if _loopback(endpoint) else None
        kwargs: dict[str, Any] = {
            "endpoint_url": endpoint,
            "region_name": self.settings.region,
            "aws_access_key_id": self.key.key_id,
            "aws_secret_access_key": self.key.secret,
            "aws_session_token": self.key.token,
            "config": config,
        }
        self._sm = session.client("sagemaker", **kwargs)
        self._logs = session.client("logs", **kwargs)
        self._store: ObjectStore | None = None

    def _trainport_key(self) -> ClientKey:
        """The key of the module docstring's list; an error that says where to put one."""
        found = client_key(self.settings)
        if found is not None:
            return found
        path = self.settings.server_keys_path
        raise ValidationError(
            f"no key for the server at {self.endpoint}: set TRAINPORT_ACCESS_KEY_ID and "
            "TRAINPORT_SECRET_ACCESS_KEY to the key `trainport server` printed, or run on the "
            f"server's machine with its TRAINPORT_HOME ({path} is missing); "
            "--aws-credentials signs with your AWS credentials instead"
        )

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    def _call(self, client: Any, operation: str, **params: Any) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            result: dict[str, Any] = getattr(client, operation)(**params)
        except (BotoCoreError, ClientError) as exc:
            raise _translate(exc, self.key, self.endpoint) from exc
        return result

    def sagemaker(self, operation: str, **params: Any) -> dict[str, Any]:
        """Any SageMaker operation of the server (boto3's snake_case name), its response
        without metadata and with epoch-second times (the tuning commands use it)."""
        doc = self._call(self._sm, operation, **params)
        doc.pop("ResponseMetadata", None)
        plain: dict[str, Any] = _plain(doc)
        return plain

    def create(self, request: dict[str, Any], *, runner: str | None = None) -> str:
        if runner:
            raise ValidationError("--runner cannot be chosen for a job sent to a server")
        return str(self._call(self._sm, "create_training_job", **request)["TrainingJobArn"])

    def describe(self, name: str) -> dict[str, Any]:
        doc = self._call(self._sm, "describe_training_job", TrainingJobName=name)
        doc.pop("ResponseMetadata", None)
        plain: dict[str, Any] = _plain(doc)
        return plain

    def get(self, name: str) -> JobRecord:
        return record_from_describe(self.describe(name))

    def list(self, query: ListQuery | None = None) -> list[JobRecord]:
        query = query or ListQuery()
        params: dict[str, Any] = {"SortBy": query.sort_by, "SortOrder": query.sort_order}
        if query.name_contains:
            params["NameContains"] = query.name_contains
        if query.status_equals:
            params["StatusEquals"] = query.status_equals
        out: list[JobRecord] = []
        token: str | None = None
        want = query.limit
        while want is None or len(out) < want:
            page = dict(params, MaxResults=100 if want is None else min(100, want - len(out)))
            if token:
                page["NextToken"] = token
            resp = self._call(self._sm, "list_training_jobs", **page)
            for summary in resp["TrainingJobSummaries"]:
                out.append(self.get(summary["TrainingJobName"]))
            token = resp.get("NextToken")
            if not token:
                break
        return out

    def stop(self, name: str) -> JobRecord:
        self._call(self._sm, "stop_training_job", TrainingJobName=name)
        return self.get(name)

    def logs(
        self, name: str, *, follow: bool = False, poll: float = 0.5, host: str = "algo-1"
    ) -> Iterator[LogLine]:
        """One host's log lines through GetLogEvents' forward tokens."""
        stream: str | None = None
        token: str | None = None
        while True:
            ended = Status(self.get(name).status).terminal if follow else True
            if stream is None:
                streams = self._call(
                    self._logs,
                    "describe_log_streams",
                    logGroupName=_LOG_GROUP,
                    logStreamNamePrefix=f"{name}/{host}-",
                )["logStreams"]
                stream = streams[0]["logStreamName"] if streams else None
            while stream is not None:
                params: dict[str, Any] = {
                    "logGroupName": _LOG_GROUP,
                    "logStreamName": stream,
                    "startFromHead": True,
                }
                if token:
                    params["nextToken"] = token
                resp = self._call(self._logs, "get_log_events", **params)
                for event in resp["events"]:
                    yield event["timestamp"] / 1000.0, event["message"]
                same = resp["nextForwardToken"] == token
                token = resp["nextForwardToken"]
                if same or not resp["events"]:
                    break
            if ended:
                return
            time.sleep(poll)
