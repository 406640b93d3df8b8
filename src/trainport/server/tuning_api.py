"""The SageMaker hyperparameter tuning operations, on top of the tuning service.

Each request is checked against botocore's service model first (unknown fields, enums,
bounds, in botocore's words); the tuning service and its driver do the rest. Children are
created through the server's scheduler, like any CreateTrainingJob, so they share its
queue and its limit of concurrent jobs.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from trainport.errors import ValidationError
from trainport.jobs.scheduler import Scheduler
from trainport.jobs.service import JobService
from trainport.server.protocol import Operation
from trainport.servicemodel import request_shapes, validate
from trainport.tuning.driver import TuningDriver
from trainport.tuning.plan import ChildView
from trainport.tuning.service import TuningService
from trainport.tuning.store import TuningQuery

__all__ = ["TuningApi"]


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _decode_token(token: str | None) -> int:
    if not token:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(token.encode()))["offset"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ValidationError("NextToken: invalid pagination token") from exc
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValidationError("NextToken: invalid pagination token")
    return offset


def _page(items: list[Any], params: dict[str, Any], default: int) -> tuple[list[Any], str | None]:
    offset = _decode_token(params.get("NextToken"))
    limit = params.get("MaxResults", default)
    page = items[offset : offset + limit]
    more = offset + limit < len(items)
    return page, _encode_token(offset + limit) if more else None


def _sort_key(by: str, view: ChildView) -> tuple[Any, ...]:
    child = view.child
    if by == "Name":
        return (child.name,)
    if by == "Status":
        return (view.status, child.name)
    if by == "FinalObjectiveMetricValue":
        return (view.objective or 0.0, child.name)
    return (child.creation_time, child.index)


class TuningApi:
    def __init__(self, service: JobService, scheduler: Scheduler) -> None:
        self.tuning = TuningService(
            service, lambda request, arn: scheduler.submit(request, tuning_job_arn=arn)
        )
        self.driver = TuningDriver(self.tuning)
        scheduler.attach(self.driver)

    def operations(self) -> dict[str, Operation]:
        return {
            "SageMaker.CreateHyperParameterTuningJob": self.create,
            "SageMaker.DescribeHyperParameterTuningJob": self.describe,
            "SageMaker.ListHyperParameterTuningJobs": self.list_tuning_jobs,
            "SageMaker.StopHyperParameterTuningJob": self.stop,
            "SageMaker.DeleteHyperParameterTuningJob": self.delete,
            "SageMaker.ListTrainingJobsForHyperParameterTuningJob": self.list_children,
        }

    def _checked(self, operation: str, params: dict[str, Any]) -> None:
        root, shapes = request_shapes(operation, self.tuning.jobs.settings.home / "cache")
        problems = validate(params, root, shapes)
        if problems:
            raise ValidationError(f"invalid {operation} request:\n  " + "\n  ".join(problems))

    def create(self, params: dict[str, Any]) -> dict[str, Any]:
        arn = self.tuning.create(params)
        self.driver.notify()
        return {"HyperParameterTuningJobArn": arn}

    def describe(self, params: dict[str, Any]) -> dict[str, Any]:
        self._checked("DescribeHyperParameterTuningJob", params)
        return self.tuning.describe(params["HyperParameterTuningJobName"])

    def stop(self, params: dict[str, Any]) -> dict[str, Any]:
        self._checked("StopHyperParameterTuningJob", params)
        self.tuning.stop(params["HyperParameterTuningJobName"])
        self.driver.notify()
        return {}

    def delete(self, params: dict[str, Any]) -> dict[str, Any]:
        self._checked("DeleteHyperParameterTuningJob", params)
        self.tuning.delete(params["HyperParameterTuningJobName"])
        return {}

    def list_tuning_jobs(self, params: dict[str, Any]) -> dict[str, Any]:
        self._checked("ListHyperParameterTuningJobs", params)
        query = TuningQuery(
            name_contains=params.get("NameContains"),
            status_equals=params.get("StatusEquals"),
            creation_after=params.get("CreationTimeAfter"),
            creation_before=params.get("CreationTimeBefore"),
            modified_after=params.get("LastModifiedTimeAfter"),
            modified_before=params.get("LastModifiedTimeBefore"),
            sort_by=params.get("SortBy", "Name"),
            sort_order=params.get("SortOrder", "Ascending"),
        )
        page, token = _page(self.tuning.list_jobs(query), params, 100)
        out: dict[str, Any] = {
            "HyperParameterTuningJobSummaries": [self.tuning.summary(r) for r in page]
        }
        if token:
            out["NextToken"] = token
        return out

    def list_children(self, params: dict[str, Any]) -> dict[str, Any]:
        self._checked("ListTrainingJobsForHyperParameterTuningJob", params)
        record = self.tuning.get(params["HyperParameterTuningJobName"])
        views = self.tuning.views(record, planned=False)
        wanted = params.get("StatusEquals")
        if wanted:
            views = [
                v
                for v in views
                if self.tuning.child_summary(record, v)["TrainingJobStatus"] == wanted
            ]
        by = params.get("SortBy", "CreationTime")
        descending = params.get("SortOrder", "Descending") == "Descending"
        if by == "FinalObjectiveMetricValue":
            # Children without a final objective come last, whichever the order.
            scored = [v for v in views if v.objective is not None]
            rest = [v for v in views if v.objective is None]
            scored.sort(key=lambda v: _sort_key(by, v), reverse=descending)
            rest.sort(key=lambda v: _sort_key("CreationTime", v))
            views = scored + rest
        else:
            views.sort(key=lambda v: _sort_key(by, v), reverse=descending)
        page, token = _page(views, params, 10)
        out: dict[str, Any] = {
            "TrainingJobSummaries": [self.tuning.child_summary(record, v) for v in page]
        }
        if token:
            out["NextToken"] = token
        return out
