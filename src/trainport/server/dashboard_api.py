"""The dashboard's endpoints (``/api/...``): reads, the stop button, and signing in.

The page itself (``GET /``, static files under ``dashboard/``) holds no data; everything it
shows comes from these endpoints, which reuse the API operations so the dashboard shows
exactly what boto3 sees. They need a sign-in (see :mod:`.dashboard_auth`): a cookie set by
``POST /api/signin`` with an access key pair, or by the link ``trainport server`` prints.
``POST`` endpoints also need the header ``X-Trainport-Dashboard: 1``, which a page of
another site cannot send without the server's consent (a CORS preflight it never gets).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qs, unquote

from trainport.errors import ValidationError
from trainport.host.resources import read_resource_samples, resource_path
from trainport.jobs.service import JobService
from trainport.server.dashboard_auth import DashboardAuth, SignIn
from trainport.server.dashboard_series import host_order, job_settings, metric_steps
from trainport.server.logs_api import LogsApi
from trainport.server.protocol import ApiError
from trainport.server.sagemaker_api import SageMakerApi
from trainport.server.tuning_api import TuningApi
from trainport.store.api import S3Uri

__all__ = ["DashboardApi", "Download", "Signed"]

_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_SORTABLE = {"Name", "CreationTime", "Status"}
_MAX_COMPARED = 10


@dataclass
class Download:
    filename: str
    chunks: Iterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Signed:
    """An answer that sets (or clears) the sign-in cookie."""

    body: dict[str, Any]
    cookie: str


class DashboardApi:
    def __init__(
        self,
        service: JobService,
        sagemaker: SageMakerApi,
        logs: LogsApi,
        auth: DashboardAuth,
        tuning: TuningApi | None = None,
    ) -> None:
        self.service = service
        self.sagemaker = sagemaker
        self.logs = logs
        self.auth = auth
        self.tuning = tuning

    @property
    def token(self) -> str | None:
        """The sign-in link's token (None: ``--no-auth``)."""
        return self.auth.link_token

    # -- sign-in ---------------------------------------------------------------------------

    def check(self, headers: Mapping[str, str]) -> SignIn:
        return self.auth.check(headers)

    def sign_in(self, query: str) -> str | None:
        """The Set-Cookie value for the link's ``?token=`` when it is right, else None."""
        return self.auth.with_link(query)

    def post(self, path: str, body: bytes) -> dict[str, Any] | Signed:
        """Answer ``POST /api/<path>`` (signed in, but for ``signin``)."""
        parts = [unquote(p) for p in path.split("/") if p]
        if parts == ["signout"]:
            return Signed({"signedIn": False}, self.auth.signed_out())
        if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "stop":
            return self._stop(parts[1])
        raise ApiError("ResourceNotFoundException", f"no dashboard endpoint POST /api/{path}", 404)

    def sign_in_with_key(self, body: bytes) -> Signed:
        """``POST /api/signin`` with ``{"accessKeyId": ..., "secretAccessKey": ...}``."""
        try:
            doc = json.loads(body or b"{}")
        except ValueError as exc:
            raise ValidationError("the sign-in body is not JSON") from exc
        key_id = doc.get("accessKeyId") if isinstance(doc, dict) else None
        secret = doc.get("secretAccessKey") if isinstance(doc, dict) else None
        if not isinstance(key_id, str) or not key_id or not isinstance(secret, str) or not secret:
            raise ValidationError("give both accessKeyId and secretAccessKey")
        cookie = self.auth.with_key(key_id.strip(), secret.strip())
        if cookie is None:
            raise ApiError(
                "AccessDeniedException",
                "that access key pair is not one this server accepts (see "
                "$TRAINPORT_HOME/server/keys.json, or the key `trainport server` printed)",
                403,
            )
        return Signed({"signedIn": True}, cookie)

    def _stop(self, name: str) -> dict[str, Any]:
        """What StopTrainingJob does, and the job's status after it."""
        self.sagemaker.stop_training_job({"TrainingJobName": name})
        job = self.sagemaker.describe_training_job({"TrainingJobName": name})
        return {"TrainingJobStatus": job["TrainingJobStatus"]}

    # -- reads -----------------------------------------------------------------------------

    def get(self, path: str, query: str) -> dict[str, Any] | Download:
        """Answer ``GET /api/<path>``; raises TrainportError for what cannot be answered."""
        parts = [unquote(p) for p in path.split("/") if p]
        args = {k: v[0] for k, v in parse_qs(query).items()}
        if parts == ["jobs"]:
            return self._jobs(args)
        if parts == ["compare"]:
            return self._compare(args)
        if len(parts) >= 2 and parts[0] == "jobs":
            name = parts[1]
            if len(parts) == 2:
                return self._job(name)
            if parts[2:] == ["logs"]:
                return self._logs(name, args)
            if parts[2:] == ["model"]:
                return self._model(name)
        if self.tuning is not None and parts == ["tuning"]:
            return self._tuning_jobs(self.tuning)
        if self.tuning is not None and len(parts) == 2 and parts[0] == "tuning":
            return self._tuning_job(self.tuning, parts[1])
        raise ApiError("ResourceNotFoundException", f"no dashboard endpoint /api/{path}", 404)

    def _jobs(self, args: dict[str, str]) -> dict[str, Any]:
        """One page of ListTrainingJobs: ``status``, ``contains``, ``sort`` (Name,
        CreationTime or Status), ``order`` (Ascending or Descending), ``next``, ``size``."""
        try:
            size = int(args.get("size", "100"))
        except ValueError:
            size = 0
        if not 1 <= size <= 100:
            raise ValidationError("size: expected a number of jobs from 1 to 100")
        params: dict[str, Any] = {"MaxResults": size}
        if args.get("status"):
            params["StatusEquals"] = args["status"]
        if args.get("contains"):
            params["NameContains"] = args["contains"]
        if args.get("sort"):
            if args["sort"] not in _SORTABLE:
                raise ValidationError(f"sort: one of {', '.join(sorted(_SORTABLE))}")
            params["SortBy"] = args["sort"]
        if args.get("order"):
            params["SortOrder"] = args["order"]
        if args.get("next"):
            params["NextToken"] = args["next"]
        listed = self.sagemaker.list_training_jobs(params)
        return {"jobs": listed["TrainingJobSummaries"], "next": listed.get("NextToken")}

    def _hosts(self, job: dict[str, Any]) -> list[str]:
        config = job.get("ResourceConfig") or {}
        count = config.get("InstanceCount") or sum(
            g.get("InstanceCount", 0) for g in config.get("InstanceGroups") or ()
        )
        return [f"algo-{k}" for k in range(1, max(1, int(count)) + 1)]

    def _job(self, name: str) -> dict[str, Any]:
        job = self.sagemaker.describe_training_job({"TrainingJobName": name})
        record = self.service.get(name)
        streams = self.logs.describe_log_streams(
            {"logGroupName": _LOG_GROUP, "logStreamNamePrefix": name + "/"}
        )["logStreams"]
        by_host = {s["logStreamName"][len(name) + 1 :].rpartition("-")[0]: s for s in streams}
        hosts = host_order(self._hosts(job), job.get("FailureReason"))
        job_dir = self.service.settings.jobs_dir / name
        for host in hosts:
            stream = by_host.get(host["host"])
            host["stream"] = stream["logStreamName"] if stream else None
            host["resources"] = read_resource_samples(resource_path(job_dir, host["host"]))
        # cast: JobService's method named `list` confuses mypy about its return types
        series = cast(dict[str, Sequence[tuple[float, float]]], self.service.metric_series(name))
        # Environment values may be secrets: the page gets their names only.
        env = job.pop("Environment", None) or {}
        return {
            "job": job,
            "settings": job_settings({**job, "Environment": env}, record.current_tags()),
            "metrics": metric_steps(self.service.log_path(name), series),
            "hosts": hosts,
            "logStreams": [s["logStreamName"] for s in streams],
        }

    def _compare(self, args: dict[str, str]) -> dict[str, Any]:
        """Several jobs side by side: ``jobs`` names them, comma-separated."""
        names = [n for n in args.get("jobs", "").split(",") if n]
        if not 2 <= len(names) <= _MAX_COMPARED:
            raise ValidationError(f"jobs: name from 2 to {_MAX_COMPARED} jobs to compare")
        out = []
        for name in names:
            job = self.sagemaker.describe_training_job({"TrainingJobName": name})
            series = cast(
                dict[str, Sequence[tuple[float, float]]], self.service.metric_series(name)
            )
            out.append(
                {
                    "name": name,
                    "status": job["TrainingJobStatus"],
                    "start": job.get("TrainingStartTime") or job["CreationTime"],
                    "hyperParameters": job.get("HyperParameters") or {},
                    "finalMetrics": {
                        m["MetricName"]: m["Value"] for m in job.get("FinalMetricDataList") or ()
                    },
                    "metrics": metric_steps(self.service.log_path(name), series),
                }
            )
        return {"jobs": out}

    def _logs(self, name: str, args: dict[str, str]) -> dict[str, Any]:
        """A page of one host's log (``host``, default algo-1, or ``stream``): with no
        token its newest lines, then the lines after ``token`` (a forward token), or the
        lines before ``before`` (the ``earlier`` token of a page, while it has one)."""
        stream = args.get("stream")
        if not stream:
            host = args.get("host", "algo-1")
            streams = self.logs.describe_log_streams(
                {"logGroupName": _LOG_GROUP, "logStreamNamePrefix": f"{name}/{host}-"}
            )["logStreams"]
            if not streams:
                return {"events": [], "nextForwardToken": None, "stream": None}
            stream = streams[0]["logStreamName"]
        if not stream.startswith(name + "/"):
            raise ValidationError(f"stream {stream!r} is not a stream of job {name!r}")
        params: dict[str, Any] = {
            "logGroupName": _LOG_GROUP,
            "logStreamName": stream,
            "startFromHead": False,  # a long log opens at its newest lines
            "limit": 1000,
        }
        backward = not args.get("token")
        if args.get("token"):
            params["nextToken"] = args["token"]
        elif args.get("before"):
            params["nextToken"] = args["before"]
        out = self.logs.get_log_events(params)
        out["stream"] = stream
        first = int(out["nextBackwardToken"].partition("/")[2] or 0)
        out["earlier"] = out["nextBackwardToken"] if backward and first > 0 else None
        return out

    def _tuning_jobs(self, tuning: TuningApi) -> dict[str, Any]:
        listed = tuning.list_tuning_jobs(
            {"MaxResults": 100, "SortBy": "CreationTime", "SortOrder": "Descending"}
        )
        return {"tuningJobs": listed["HyperParameterTuningJobSummaries"]}

    def _tuning_job(self, tuning: TuningApi, name: str) -> dict[str, Any]:
        """A tuning job, its children, and its best objective as each child ended."""
        described = tuning.describe({"HyperParameterTuningJobName": name})
        children: list[dict[str, Any]] = []
        params: dict[str, Any] = {"HyperParameterTuningJobName": name, "MaxResults": 100}
        while True:
            page = tuning.list_children(params)
            children += page["TrainingJobSummaries"]
            if not page.get("NextToken"):
                break
            params["NextToken"] = page["NextToken"]
        objective = described["HyperParameterTuningJobConfig"].get(
            "HyperParameterTuningJobObjective", {}
        )
        minimize = objective.get("Type", "Minimize") == "Minimize"
        ended = sorted(
            (c["TrainingEndTime"], c["FinalHyperParameterTuningJobObjectiveMetric"]["Value"])
            for c in children
            if c.get("TrainingEndTime") and c.get("FinalHyperParameterTuningJobObjectiveMetric")
        )
        best: list[list[float]] = []
        for when, value in ended:
            if best and (value >= best[-1][1] if minimize else value <= best[-1][1]):
                value = best[-1][1]
            best.append([when, value])
        return {
            "tuningJob": described,
            "children": children,
            "objective": [[t, v] for t, v in ended],
            "bestSoFar": best,
        }

    def _model(self, name: str) -> Download:
        uri = self.service.describe(name)["ModelArtifacts"]["S3ModelArtifacts"]
        if not uri:
            raise ApiError("ResourceNotFoundException", f"job {name!r} has no model artifact", 404)
        target = S3Uri.parse(uri, field="ModelArtifacts.S3ModelArtifacts")
        store = self.service.store
        if not store.exists(target.bucket, target.key):
            raise ApiError("ResourceNotFoundException", f"{uri} is not in the store", 404)
        return Download(f"{name}-model.tar.gz", store.iter_chunks(target.bucket, target.key))
