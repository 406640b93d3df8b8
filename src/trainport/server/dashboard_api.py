"""The dashboard's read endpoints (``GET /api/...``) and its sign-in.

The page itself (``GET /``, static files under ``dashboard/``) holds no data; everything it
shows comes from these endpoints, which reuse the API operations so the dashboard shows
exactly what boto3 sees. They need the dashboard token: the server prints
``http://HOST:PORT/?token=...`` at start; opening it sets an HttpOnly, SameSite=Strict
cookie. The token is derived from the server's first access key (HMAC), so it survives
restarts and changes when the keys do. ``Authorization: Bearer <token>`` works too.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from typing import Any, cast
from urllib.parse import parse_qs, unquote

from trainport.errors import ValidationError
from trainport.jobs.service import JobService
from trainport.server.logs_api import LogsApi
from trainport.server.protocol import ApiError
from trainport.server.sagemaker_api import SageMakerApi
from trainport.server.sigv4 import AccessKey
from trainport.server.tuning_api import TuningApi
from trainport.store.api import S3Uri

__all__ = ["COOKIE", "DashboardApi", "Download", "dashboard_token"]

COOKIE = "trainport_dashboard"


def dashboard_token(key: AccessKey) -> str:
    return hmac.new(key.secret.encode(), b"trainport-dashboard", hashlib.sha256).hexdigest()[:40]


@dataclass
class Download:
    filename: str
    chunks: Iterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)


class DashboardApi:
    def __init__(
        self,
        service: JobService,
        sagemaker: SageMakerApi,
        logs: LogsApi,
        token: str | None,
        tuning: TuningApi | None = None,
    ) -> None:
        self.service = service
        self.sagemaker = sagemaker
        self.logs = logs
        self.token = token  # None: --no-auth
        self.tuning = tuning

    # -- sign-in ---------------------------------------------------------------------------

    def authorized(self, headers: Mapping[str, str]) -> bool:
        if self.token is None:
            return True
        bearer = headers.get("authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(bearer[7:], self.token):
            return True
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except CookieError:
            return False
        morsel = cookie.get(COOKIE)
        return morsel is not None and hmac.compare_digest(morsel.value, self.token)

    def sign_in(self, query: str) -> str | None:
        """The Set-Cookie value for ``?token=`` when it is right, else None."""
        given = parse_qs(query).get("token", [""])[0]
        if self.token is None or not given or not hmac.compare_digest(given, self.token):
            return None
        return f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"

    # -- reads -----------------------------------------------------------------------------

    def get(self, path: str, query: str) -> dict[str, Any] | Download:
        """Answer ``GET /api/<path>``; raises TrainportError for what cannot be answered."""
        parts = [unquote(p) for p in path.split("/") if p]
        args = {k: v[0] for k, v in parse_qs(query).items()}
        if parts == ["jobs"]:
            return self._jobs(args)
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
        params: dict[str, Any] = {"MaxResults": 100}
        if args.get("status"):
            params["StatusEquals"] = args["status"]
        if args.get("contains"):
            params["NameContains"] = args["contains"]
        if args.get("next"):
            params["NextToken"] = args["next"]
        listed = self.sagemaker.list_training_jobs(params)
        return {"jobs": listed["TrainingJobSummaries"], "next": listed.get("NextToken")}

    def _job(self, name: str) -> dict[str, Any]:
        job = self.sagemaker.describe_training_job({"TrainingJobName": name})
        streams = self.logs.describe_log_streams(
            {"logGroupName": "/aws/sagemaker/TrainingJobs", "logStreamNamePrefix": name + "/"}
        )["logStreams"]
        # cast: JobService's method named `list` confuses mypy about its return types
        series = cast(dict[str, Sequence[tuple[float, float]]], self.service.metric_series(name))
        return {
            "job": job,
            "metrics": {m: [[t, v] for t, v in pts] for m, pts in series.items()},
            "logStreams": [s["logStreamName"] for s in streams],
        }

    def _logs(self, name: str, args: dict[str, str]) -> dict[str, Any]:
        stream = args.get("stream")
        if not stream:
            streams = self._job(name)["logStreams"]
            if not streams:
                return {"events": [], "nextForwardToken": None, "stream": None}
            stream = streams[0]
        if not stream.startswith(name + "/"):
            raise ValidationError(f"stream {stream!r} is not a stream of job {name!r}")
        params: dict[str, Any] = {
            "logGroupName": "/aws/sagemaker/TrainingJobs",
            "logStreamName": stream,
            "startFromHead": True,
            "limit": 1000,
        }
        if args.get("token"):
            params["nextToken"] = args["token"]
        out = self.logs.get_log_events(params)
        out["stream"] = stream
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
