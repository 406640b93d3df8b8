"""The tuning service: tuning jobs created, read, stopped and deleted, and their children
seen as the tuning job sees them.

Children are ordinary training jobs, created through the same door as any other (a
server's scheduler, or the jobs service) with the tuning job's ARN recorded on them; the
tuning job keeps which children it planned and, once each has ended, what it scored. The
driver (:mod:`trainport.tuning.driver`) moves tuning jobs on; this module holds what both
the driver and the API need: the records, the children's views, and the API's shapes.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainport.errors import NotFoundError, ResourceInUseError, ValidationError
from trainport.jobs.records import JobRecord
from trainport.jobs.service import JobService
from trainport.jobs.status import Status
from trainport.tuning.autotune import autotuned
from trainport.tuning.plan import PLANNED, ChildView, best_child, not_improving
from trainport.tuning.records import Child, ChildEnd, ChildState, TuningRecord, TuningStatus
from trainport.tuning.spec import (
    Definition,
    TuningSpec,
    child_request,
    parse_tuning_request,
    resource_config,
    with_objective,
)
from trainport.tuning.store import TuningQuery, TuningStore
from trainport.tuning.strategies import encode

__all__ = ["Submit", "TuningService"]

#: Creates a child: (its CreateTrainingJob request, the tuning job's ARN) -> its ARN.
Submit = Callable[[dict[str, Any], str], str]


class TuningService:
    def __init__(self, jobs: JobService, submit: Submit | None = None) -> None:
        self.jobs = jobs
        self.store = TuningStore(jobs.db)
        self.submit: Submit = submit or (
            lambda request, arn: jobs.create(request, tuning_job_arn=arn)
        )
        self._specs: dict[str, TuningSpec] = {}

    def arn(self, name: str) -> str:
        s = self.jobs.settings
        return f"arn:aws:sagemaker:{s.region}:{s.account_id}:hyper-parameter-tuning-job/{name}"

    def spec(self, record: TuningRecord) -> TuningSpec:
        """The record's request as a spec (validated when it was created)."""
        key = f"{record.name}@{record.creation_time}"
        if key not in self._specs:
            self._specs[key] = parse_tuning_request(record.request, self._cache_dir())
        return self._specs[key]

    def _cache_dir(self) -> Path:
        return self.jobs.settings.home / "cache"

    # -- create ---------------------------------------------------------------------------

    def create(self, request: dict[str, Any]) -> str:
        """Accept a CreateHyperParameterTuningJob request; returns its ARN. The driver
        launches its children."""
        # Autotune's choices are made once, here, and stored: the tuning job runs, and
        # describes, the request as trainport completed it.
        request = autotuned(request)
        spec = parse_tuning_request(request, self._cache_dir())
        try:
            self.store.get(spec.name)
        except NotFoundError:
            pass
        else:
            raise ResourceInUseError(
                f"Hyperparameter tuning job {spec.name!r} already exists; choose another "
                "HyperParameterTuningJobName"
            )
        for parent in spec.warm_start_parents:
            record = self.store.get(parent)  # a parent that does not exist is a clear error
            if not TuningStatus(record.status).terminal:
                raise ValidationError(
                    f"WarmStartConfig.ParentHyperParameterTuningJobs: {parent!r} is still "
                    f"{record.status}; a parent must have ended"
                )
        seed = spec.seed if spec.seed is not None else random.randrange(2**31)
        self._check_children(spec)
        now = time.time()
        record = TuningRecord(
            name=spec.name,
            arn=self.arn(spec.name),
            request=request,
            creation_time=now,
            last_modified_time=now,
            seed=seed,
        )
        self.store.insert(record)
        return record.arn

    def _check_children(self, spec: TuningSpec) -> None:
        """Check each definition's child as CreateTrainingJob would, before anything is
        stored: a definition no child could run fails the tuning job's creation."""
        for which, definition in enumerate(spec.definitions):
            tuned = {
                r.name: r.values[0] if r.kind == "Categorical" else encode(r, r.low)
                for r in definition.ranges
            }
            request = child_request(spec, definition, f"{spec.name}-check", tuned)
            try:
                self.jobs.admit(request)
            except ValidationError as exc:
                where = (
                    "TrainingJobDefinition"
                    if len(spec.definitions) == 1
                    else f"TrainingJobDefinitions[{which}]"
                )
                raise ValidationError(
                    f"{where}: its training jobs would be refused: {exc}"
                ) from exc

    # -- read -----------------------------------------------------------------------------

    def get(self, name: str) -> TuningRecord:
        return self.store.get(name)

    def list_jobs(self, query: TuningQuery) -> list[TuningRecord]:
        return self.store.list(query)

    def views(self, record: TuningRecord, *, planned: bool = True) -> list[ChildView]:
        """Every child of ``record`` as it is now (cancelled ones left out, and those whose
        job is not created yet unless ``planned``)."""
        spec = self.spec(record)
        out = []
        for child in record.children:
            if child.state == ChildState.CANCELLED.value:
                continue
            if child.state == ChildState.PLANNED.value and not planned:
                continue
            out.append(self._view(spec, child))
        return out

    def _view(self, spec: TuningSpec, child: Child) -> ChildView:
        if child.ended is not None:
            e = child.ended
            return ChildView(child, e.status, e.points, e.start_time, e.end_time, e.failure_reason)
        if child.state == ChildState.REFUSED.value:
            return ChildView(child, Status.FAILED.value, (), failure_reason=child.refusal)
        if child.state == ChildState.PLANNED.value:
            return ChildView(child, PLANNED, ())
        job = self.jobs.db.get(child.name)
        metric = self._definition(spec, child).objective.metric
        points = tuple(self.jobs.db.metric_series(child.name).get(metric, ()))
        return ChildView(
            child,
            job.status,
            points,
            job.training_start_time,
            job.training_end_time,
            job.failure_reason,
        )

    @staticmethod
    def _definition(spec: TuningSpec, child: Child) -> Definition:
        return next(
            (d for d in spec.definitions if d.name == child.definition), spec.definitions[0]
        )

    @staticmethod
    def ended(view: ChildView) -> ChildEnd | None:
        """What to keep of a child whose job has ended; None while it runs."""
        if view.child.state != ChildState.CREATED.value or view.child.ended is not None:
            return None
        if not Status(view.status).terminal:
            return None
        return ChildEnd(
            view.status, view.points, view.start_time, view.end_time, view.failure_reason
        )

    def job(self, name: str) -> JobRecord:
        return self.jobs.db.get(name)

    # -- stop and delete ------------------------------------------------------------------

    def stop(self, name: str) -> TuningRecord:
        def stopping(r: TuningRecord) -> TuningRecord:
            if r.status != TuningStatus.IN_PROGRESS.value:
                raise ValidationError(
                    f"Hyperparameter tuning job {name!r} cannot be stopped: it is {r.status}"
                )
            return dataclasses.replace(
                r, status=TuningStatus.STOPPING.value, last_modified_time=time.time()
            )

        return self.store.update(name, stopping)

    def delete(self, name: str) -> None:
        def allowed(r: TuningRecord) -> None:
            if not TuningStatus(r.status).terminal:
                raise ValidationError(
                    f"Hyperparameter tuning job {name!r} cannot be deleted while it is "
                    f"{r.status}; stop it first (StopHyperParameterTuningJob)"
                )

        self.store.delete(name, allowed)

    # -- the API's shapes -----------------------------------------------------------------

    def child_summary(self, record: TuningRecord, view: ChildView) -> dict[str, Any]:
        """A HyperParameterTrainingJobSummary."""
        spec = self.spec(record)
        child = view.child
        status = view.status if view.status != PLANNED else Status.IN_PROGRESS.value
        out: dict[str, Any] = {
            "TrainingJobName": child.name,
            "TrainingJobArn": self.jobs.arn(child.name),
            "TuningJobName": record.name,
            "CreationTime": child.creation_time,
            "TrainingJobStatus": status,
            "TunedHyperParameters": dict(child.tuned),
            "ObjectiveStatus": view.objective_status,
        }
        if child.definition:
            out["TrainingJobDefinitionName"] = child.definition
        if view.start_time is not None:
            out["TrainingStartTime"] = view.start_time
        if view.end_time is not None:
            out["TrainingEndTime"] = view.end_time
        if view.failure_reason:
            out["FailureReason"] = view.failure_reason
        if view.objective is not None:
            objective = self._definition(spec, child).objective
            out["FinalHyperParameterTuningJobObjectiveMetric"] = {
                "Type": "Minimize" if objective.minimize else "Maximize",
                "MetricName": objective.metric,
                "Value": view.objective,
            }
        return out

    def counters(self, views: list[ChildView]) -> tuple[dict[str, int], dict[str, int]]:
        """TrainingJobStatusCounters and ObjectiveStatusCounters."""
        status = {"Completed": 0, "InProgress": 0, "RetryableError": 0, "NonRetryableError": 0}
        status["Stopped"] = 0
        objective = {"Succeeded": 0, "Pending": 0, "Failed": 0}
        for v in views:
            key = {
                PLANNED: "InProgress",
                "Stopping": "InProgress",
                "Failed": "NonRetryableError",
            }.get(v.status, v.status)
            status[key] = status.get(key, 0) + 1
            objective[v.objective_status] += 1
        return status, objective

    def summary(self, record: TuningRecord) -> dict[str, Any]:
        """A HyperParameterTuningJobSummary."""
        views = self.views(record, planned=False)
        status, objective = self.counters(views)
        config = record.request["HyperParameterTuningJobConfig"]
        out: dict[str, Any] = {
            "HyperParameterTuningJobName": record.name,
            "HyperParameterTuningJobArn": record.arn,
            "HyperParameterTuningJobStatus": record.status,
            "Strategy": config["Strategy"],
            "CreationTime": record.creation_time,
            "LastModifiedTime": record.last_modified_time or record.creation_time,
            "TrainingJobStatusCounters": status,
            "ObjectiveStatusCounters": objective,
            "ResourceLimits": config["ResourceLimits"],
        }
        if record.end_time is not None:
            out["HyperParameterTuningEndTime"] = record.end_time
        return out

    def describe(self, name: str) -> dict[str, Any]:
        """The DescribeHyperParameterTuningJob response."""
        record = self.store.get(name)
        spec = self.spec(record)
        views = self.views(record, planned=False)
        out = self.summary(record)
        del out["Strategy"], out["ResourceLimits"]
        for key in ("HyperParameterTuningJobConfig", "WarmStartConfig", "Autotune"):
            if key in record.request:
                out[key] = record.request[key]
        echoed = [
            {
                **d.body,
                "StaticHyperParameters": with_objective(d),
                "ResourceConfig": resource_config(d.body),
            }
            for d in spec.definitions
        ]
        if "TrainingJobDefinition" in record.request:
            out["TrainingJobDefinition"] = echoed[0]
        else:
            out["TrainingJobDefinitions"] = echoed
        best = best_child(views, spec.objective)
        if best is not None:
            out["BestTrainingJob"] = self.child_summary(record, best)
        if spec.warm_start_parents:
            owners = {v.child.name: record for v in views}
            for parent in self.parents(spec):
                parent_views = self.views(parent)
                owners.update({v.child.name: parent for v in parent_views})
                views = views + parent_views
            overall = best_child(views, spec.objective)
            if overall is not None:
                out["OverallBestTrainingJob"] = self.child_summary(
                    owners[overall.child.name], overall
                )
        if record.failure_reason:
            out["FailureReason"] = record.failure_reason
        details: dict[str, Any] = {
            "NumberOfTrainingJobsObjectiveNotImproving": not_improving(
                self.views(record), spec.objective
            )
        }
        if record.convergence_time is not None:
            details["ConvergenceDetectedTime"] = record.convergence_time
        out["TuningJobCompletionDetails"] = details
        end = record.end_time or time.time()
        out["ConsumedResources"] = {"RuntimeInSeconds": int(end - record.creation_time)}
        return out

    def parents(self, spec: TuningSpec) -> list[TuningRecord]:
        """The warm start's parents that still exist."""
        out = []
        for parent in spec.warm_start_parents:
            try:
                out.append(self.store.get(parent))
            except NotFoundError:
                continue  # deleted since: nothing left to learn from it
        return out
