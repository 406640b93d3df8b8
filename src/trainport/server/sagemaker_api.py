"""The SageMaker training-job operations, on top of the jobs service and its scheduler.

Each operation takes the decoded JSON body and returns the response body with the field
names of botocore's service model; timestamps are epoch seconds.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from typing import Any

from trainport.errors import ValidationError
from trainport.jobs.db import JobSummary, ListQuery, PageKey
from trainport.jobs.records import JobRecord
from trainport.jobs.scheduler import Scheduler
from trainport.jobs.service import JobService
from trainport.jobs.status import Status
from trainport.server.protocol import Operation
from trainport.servicemodel import request_shapes, validate

__all__ = ["SageMakerApi"]

_STATUSES = tuple(s.value for s in Status)
_SORT_BY = ("Name", "CreationTime", "Status")
_SORT_ORDER = ("Ascending", "Descending")
_MAX_TAGS = 50  # per resource, as in SageMaker
# ListTrainingJobs filters on things no trainport job has (a warm pool, a training plan):
# in SageMaker a job without one never matches them, so here no job does.
_ABSENT_FILTERS = ("WarmPoolStatusEquals", "TrainingPlanArnEquals")


def _string(params: dict[str, Any], field: str, *, required: bool = False) -> str | None:
    value = params.get(field)
    if value is None:
        if required:
            raise ValidationError(f"{field}: a value is required")
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{field}: expected a string, got {type(value).__name__}")
    return value


def _job_name(params: dict[str, Any]) -> str:
    name = _string(params, "TrainingJobName", required=True)
    if not name:
        raise ValidationError("TrainingJobName: a value is required")
    return name


def _choice(params: dict[str, Any], field: str, allowed: tuple[str, ...]) -> str | None:
    value = _string(params, field)
    if value is not None and value not in allowed:
        raise ValidationError(f"{field}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _timestamp(params: dict[str, Any], field: str) -> float | None:
    value = params.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{field}: expected a timestamp in epoch seconds")
    return float(value)


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _decode_token(token: str) -> int:
    try:
        offset = json.loads(base64.urlsafe_b64decode(token.encode()))["offset"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ValidationError("NextToken: invalid pagination token") from exc
    if not isinstance(offset, int) or offset < 0:
        raise ValidationError("NextToken: invalid pagination token")
    return offset


def _encode_page_key(query: ListQuery, key: PageKey) -> str:
    doc = {"sort": query.sort_by, "order": query.sort_order, "after": [key.value, key.name]}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def _decode_page_key(token: str, sort_by: str, sort_order: str) -> PageKey:
    """The key a ListTrainingJobs NextToken carries: where the previous page ended."""
    invalid = ValidationError("NextToken: invalid pagination token")
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        value, name = doc["after"]
        made_for = (doc["sort"], doc["order"])
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise invalid from exc
    if made_for != (sort_by, sort_order):
        raise ValidationError(
            f"NextToken: the token continues a list sorted by {made_for[0]} "
            f"{made_for[1]}, not by {sort_by} {sort_order}; ask for the same order "
            "as the first page"
        )
    wanted = str if sort_by in ("Name", "Status") else int | float
    if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, wanted):
        raise invalid
    return PageKey(value, name)


def summary(record: JobRecord | JobSummary) -> dict[str, Any]:
    out: dict[str, Any] = {
        "TrainingJobName": record.name,
        "TrainingJobArn": record.arn,
        "CreationTime": record.creation_time,
        "LastModifiedTime": record.last_modified_time or record.creation_time,
        "TrainingJobStatus": record.status,
        "SecondaryStatus": record.secondary_status,
    }
    if record.training_end_time is not None:
        out["TrainingEndTime"] = record.training_end_time
    return out


class SageMakerApi:
    def __init__(self, service: JobService, scheduler: Scheduler) -> None:
        self.service = service
        self.scheduler = scheduler

    def operations(self) -> dict[str, Operation]:
        return {
            "SageMaker.CreateTrainingJob": self.create_training_job,
            "SageMaker.DescribeTrainingJob": self.describe_training_job,
            "SageMaker.ListTrainingJobs": self.list_training_jobs,
            "SageMaker.StopTrainingJob": self.stop_training_job,
            "SageMaker.AddTags": self.add_tags,
            "SageMaker.ListTags": self.list_tags,
            "SageMaker.DeleteTags": self.delete_tags,
        }

    def create_training_job(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"TrainingJobArn": self.scheduler.submit(params)}

    def describe_training_job(self, params: dict[str, Any]) -> dict[str, Any]:
        name = _job_name(params)
        return self.service.describe(name)

    def stop_training_job(self, params: dict[str, Any]) -> dict[str, Any]:
        name = _job_name(params)
        record = self.service.get(name)
        if Status(record.status).terminal:
            raise ValidationError(
                f"Training job {name!r} cannot be stopped: it is already {record.status}"
            )
        self.service.stop(name)
        self.scheduler.notify()
        return {}

    # -- tags: training jobs are the only resource this server has ---------------------------

    def _tagged_job(self, operation: str, params: dict[str, Any]) -> str:
        """The training job a tag request's ResourceArn names, after checking the request
        against the service model."""
        self._checked(operation, params)
        arn = params["ResourceArn"]
        name = arn.partition(":training-job/")[2]
        if not name or self.service.arn(name) != arn:
            raise ValidationError(
                f"ResourceArn: {arn!r} is not the ARN of a training job of this server "
                f"(such as {self.service.arn('NAME')}); it keeps tags of training jobs only"
            )
        self.service.db.get(name)  # a job that does not exist is a clear error
        return name

    def add_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        name = self._tagged_job("AddTags", params)
        added = [(t["Key"], t["Value"]) for t in params["Tags"]]

        def add(record: JobRecord) -> JobRecord:
            tags = dict(record.current_tags())
            tags.update(added)  # a key given again takes its new value, as in SageMaker
            if len(tags) > _MAX_TAGS:
                raise ValidationError(
                    f"Tags: training job {name!r} would have {len(tags)} tags; the limit is "
                    f"{_MAX_TAGS}. Delete some with DeleteTags first"
                )
            return dataclasses.replace(record, tags=tuple(tags.items()))

        self.service.db.update(name, add)
        return {"Tags": [{"Key": k, "Value": v} for k, v in added]}

    def delete_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        name = self._tagged_job("DeleteTags", params)
        gone = set(params["TagKeys"])

        def delete(record: JobRecord) -> JobRecord:
            kept = tuple((k, v) for k, v in record.current_tags() if k not in gone)
            return dataclasses.replace(record, tags=kept)

        self.service.db.update(name, delete)
        return {}

    def list_tags(self, params: dict[str, Any]) -> dict[str, Any]:
        name = self._tagged_job("ListTags", params)
        limit = params.get("MaxResults", _MAX_TAGS)
        token = _string(params, "NextToken")
        offset = _decode_token(token) if token else 0
        tags = self.service.db.get(name).current_tags()
        out: dict[str, Any] = {
            "Tags": [{"Key": k, "Value": v} for k, v in tags[offset : offset + limit]]
        }
        if offset + limit < len(tags):
            out["NextToken"] = _encode_token(offset + limit)
        return out

    def list_training_jobs(self, params: dict[str, Any]) -> dict[str, Any]:
        self._checked("ListTrainingJobs", params)
        limit = params.get("MaxResults", 10)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            raise ValidationError("MaxResults: expected an integer from 1 to 100")
        sort_by = _choice(params, "SortBy", _SORT_BY) or "CreationTime"
        sort_order = _choice(params, "SortOrder", _SORT_ORDER) or "Descending"
        token = _string(params, "NextToken")
        query = ListQuery(
            name_contains=_string(params, "NameContains"),
            status_equals=_choice(params, "StatusEquals", _STATUSES),
            creation_after=_timestamp(params, "CreationTimeAfter"),
            creation_before=_timestamp(params, "CreationTimeBefore"),
            modified_after=_timestamp(params, "LastModifiedTimeAfter"),
            modified_before=_timestamp(params, "LastModifiedTimeBefore"),
            sort_by=sort_by,
            sort_order=sort_order,
            after=_decode_page_key(token, sort_by, sort_order) if token else None,
            limit=limit + 1,  # one more tells whether there is a next page
        )
        if any(params.get(f) is not None for f in _ABSENT_FILTERS):
            return {"TrainingJobSummaries": []}
        records = self.service.list_summaries(query)
        page = records[:limit]
        out: dict[str, Any] = {"TrainingJobSummaries": [summary(r) for r in page]}
        if len(records) > limit:
            out["NextToken"] = _encode_page_key(query, query.key_of(page[-1]))
        return out

    def _checked(self, operation: str, params: dict[str, Any]) -> None:
        """Refuse ``params`` where SageMaker's service model does (unknown fields, values
        outside an enum or a pattern), in botocore's words."""
        root, shapes = request_shapes(operation, self.service.settings.home / "cache")
        problems = validate(params, root, shapes)
        if problems:
            raise ValidationError(f"invalid {operation} request:\n  " + "\n  ".join(problems))
