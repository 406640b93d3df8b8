"""The tuning driver: applies each tuning job's :class:`~trainport.tuning.plan.Plan`.

On every step it takes each unfinished tuning job it may drive, creates the children it
planned, keeps what ended children scored, asks :func:`~trainport.tuning.plan.decide`
what to do, and does it: stops children, plans and creates new ones, ends the tuning job.

Everything lives in the job database, so a driver that dies loses nothing. A child is
recorded before its job is created and its name is fixed then; a driver taking over
creates the planned children whose job does not exist and adopts those whose job does
(names are unique), so no child runs twice. A tuning job is driven by one process at a
time: the driver records itself on it, and another takes it over only once that process
is gone (a server started again, or ``trainport tune`` after one was killed).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time

from trainport.errors import ResourceInUseError, TrainportError
from trainport.jobs import liveness
from trainport.tuning.plan import ChildView, Plan, decide
from trainport.tuning.records import Child, ChildState, TuningRecord, TuningStatus
from trainport.tuning.service import TuningService
from trainport.tuning.spec import TuningSpec, child_request
from trainport.tuning.strategies import Trial, make_strategy

__all__ = ["TuningDriver", "child_name"]

log = logging.getLogger(__name__)

_UNFINISHED = [TuningStatus.IN_PROGRESS.value, TuningStatus.STOPPING.value]


def child_name(tuning_name: str, index: int, arn: str) -> str:
    """A child's TrainingJobName, as SageMaker forms it: the tuning job's name, the
    child's number and a short hash (fixed by the tuning job's ARN and the number)."""
    digest = hashlib.sha256(f"{arn}#{index}".encode()).hexdigest()[:8]
    return f"{tuning_name}-{index + 1:03d}-{digest}"


def _settle(record: TuningRecord, *, name: str, state: str, refusal: str | None) -> TuningRecord:
    return record.with_child(name, state=state, refusal=refusal)


class TuningDriver:
    """Moves every unfinished tuning job of ``service`` on, from one background thread
    (:meth:`start`) or a caller's loop (:meth:`step`)."""

    def __init__(self, service: TuningService, *, interval: float = 0.1) -> None:
        self.service = service
        self.interval = interval
        self.me = liveness.identity(os.getpid())
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the loop -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stopped.clear()
            self._thread = threading.Thread(target=self._loop, name="tuning", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def notify(self) -> None:
        """Something changed (a new tuning job, a stop): step again now."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.step()
            except Exception:  # the loop must outlive any one bad step
                log.exception("tuning step failed")
            self._wake.wait(self.interval)
            self._wake.clear()

    def step(self, only: str | None = None) -> None:
        """One step of every unfinished tuning job this process may drive (or of ``only``)."""
        for name in self.service.store.names_in_status(_UNFINISHED):
            if only is not None and name != only:
                continue
            if self._stopped.is_set():
                return
            try:
                self.drive(name)
            except TrainportError as exc:
                log.error("tuning job %s: %s", name, exc)

    # -- one tuning job -------------------------------------------------------------------

    def _claim(self, name: str) -> bool:
        """Record this process as the tuning job's driver, unless a live one is."""

        def claim(r: TuningRecord) -> TuningRecord:
            if r.driver == self.me or (r.driver is not None and liveness.is_alive(r.driver)):
                return r
            if r.driver is not None:
                log.info(
                    "tuning job %s: its driver (pid %d) is gone; taking it over", name, r.driver[0]
                )
            return dataclasses.replace(r, driver=self.me)

        return self.service.store.update(name, claim).driver == self.me

    def drive(self, name: str) -> None:
        record = self.service.get(name)
        # A plain read most steps; the write that claims it only when another process (or
        # nobody) holds it: every write waits for the supervisors' writes to the database.
        if record.driver != self.me:
            if not self._claim(name):
                return
            record = self.service.get(name)
        spec = self.service.spec(record)
        record = self._create_planned(record, spec)
        views = self.service.views(record)
        record = self._keep_ends(record, views)
        plan = decide(spec, record, views, time.time())
        self._apply(record, spec, views, plan)

    def _apply(
        self, record: TuningRecord, spec: TuningSpec, views: list[ChildView], plan: Plan
    ) -> None:
        store = self.service.store
        rungs = dict(plan.paused_at)
        for child, why in plan.stop:
            self._stop_child(record.name, child, why, rungs.get(child))
        if plan.ending and not record.ending:
            log.info(
                "tuning job %s: ends (%s); stopping its running children", record.name, plan.ending
            )
            converged = time.time() if plan.ending == "convergence" else None
            store.update(
                record.name,
                lambda r: dataclasses.replace(r, ending=plan.ending, convergence_time=converged),
            )
        if plan.launch or plan.promote:
            self._launch(record, spec, plan.launch, plan.promote)
        if plan.finish is not None:
            self._finish(record, *plan.finish)

    def _stop_child(self, tuning: str, child: str, why: str, rung: int | None = None) -> None:
        try:
            self.service.jobs.stop(child)
        except TrainportError as exc:
            log.debug("tuning job %s: stopping child %s: %s", tuning, child, exc)
        if why == "early":
            log.info("tuning job %s: stopped %s early", tuning, child)
        elif why == "pause":
            log.info(
                "tuning job %s: paused %s at rung %s (its checkpoint kept)", tuning, child, rung
            )
        self.service.store.update(
            tuning, lambda r: r.with_child(child, stop_reason=why, paused_at=rung)
        )

    def _finish(self, seen: TuningRecord, status: str, reason: str | None) -> None:
        def finish(r: TuningRecord) -> TuningRecord:
            if r.status != seen.status:  # a stop arrived meanwhile: decide again
                return r
            now = time.time()
            return dataclasses.replace(
                r, status=status, failure_reason=reason, end_time=now, last_modified_time=now
            )

        done = self.service.store.update(seen.name, finish)
        if done.status == status:
            log.info("tuning job %s: %s", seen.name, status)

    def _keep_ends(self, record: TuningRecord, views: list[ChildView]) -> TuningRecord:
        ends = {v.child.name: e for v in views if (e := self.service.ended(v)) is not None}
        if not ends:
            return record

        def keep(r: TuningRecord) -> TuningRecord:
            for name, end in ends.items():
                r = r.with_child(name, ended=end)
            return dataclasses.replace(r, last_modified_time=time.time())

        return self.service.store.update(record.name, keep)

    def _history(self, record: TuningRecord, spec: TuningSpec, *, own: bool = True) -> list[Trial]:
        """What a strategy learns from: every ended child (unless not ``own``), and a warm
        start's parents'."""
        records = [*self.service.parents(spec), *([record] if own else [])]
        return [
            Trial(c.definition, c.tuned, c.ended.objective)
            for r in records
            for c in r.children
            if c.ended is not None and c.ended.objective is not None
        ]

    def _launch(
        self, record: TuningRecord, spec: TuningSpec, n: int, promote: tuple[str, ...]
    ) -> None:
        """Plan ``n`` new trials and a continuation of each paused child in ``promote``."""
        strategy = make_strategy(spec, record.seed, self._history(record, spec, own=False))
        history = self._history(record, spec)
        now = time.time()
        planned = []
        index = len(record.children)
        for paused in promote:
            first = record.first_of_trial(paused)
            depth = sum(1 for c in record.children if record.first_of_trial(c.name) == first)
            source = record.child(paused)
            planned.append(
                Child(
                    index=index,
                    name=f"{first.name}-r{depth}",
                    definition=source.definition,
                    tuned=dict(source.tuned),
                    state=ChildState.PLANNED.value,
                    creation_time=now,
                    continues=paused,
                )
            )
            index += 1
        # A trial's values and name follow its number among trials (continuations are
        # not trials), so a tuning job draws the same values with or without resuming.
        for trial in range(record.trials, record.trials + n):
            which, tuned = strategy.propose(trial, history)
            planned.append(
                Child(
                    index=index,
                    name=child_name(record.name, trial, record.arn),
                    definition=spec.definitions[which].name,
                    tuned=tuned,
                    state=ChildState.PLANNED.value,
                    creation_time=now,
                )
            )
            index += 1

        def plan(r: TuningRecord) -> TuningRecord:
            if len(r.children) != len(record.children) or r.status != record.status:
                return r  # changed meanwhile (a stop): decide again next step
            return dataclasses.replace(
                r, children=r.children + tuple(planned), last_modified_time=now
            )

        stored = self.service.store.update(record.name, plan)
        if len(stored.children) == len(record.children) + len(planned):
            self._create_planned(stored, spec)

    def _create_planned(self, record: TuningRecord, spec: TuningSpec) -> TuningRecord:
        """Create each planned child's job (or adopt it, if a driver before this one did),
        or cancel it when the tuning job is ending."""
        for child in record.children:
            if child.state != ChildState.PLANNED.value:
                continue
            ending = record.status != TuningStatus.IN_PROGRESS.value or record.ending
            state, refusal = self._create(record, spec, child, cancel=bool(ending))
            change = functools.partial(_settle, name=child.name, state=state, refusal=refusal)
            record = self.service.store.update(record.name, change)
        return record

    def _create(
        self, record: TuningRecord, spec: TuningSpec, child: Child, *, cancel: bool
    ) -> tuple[str, str | None]:
        jobs = self.service.jobs
        if jobs.db.exists(child.name):
            if jobs.db.get(child.name).tuning_job_arn == record.arn:
                return ChildState.CREATED.value, None  # created before a restart: adopt it
            return ChildState.REFUSED.value, f"a training job named {child.name!r} exists already"
        if cancel:
            return ChildState.CANCELLED.value, None
        definition = next(d for d in spec.definitions if d.name == child.definition)
        first = record.first_of_trial(child.name).name
        request = child_request(
            spec, definition, child.name, child.tuned, None if first == child.name else first
        )
        try:
            self.service.submit(request, record.arn)
        except ResourceInUseError:
            return ChildState.CREATED.value, None  # another driver's create won the race
        except TrainportError as exc:
            log.warning("tuning job %s: child %s refused: %s", record.name, child.name, exc)
            return ChildState.REFUSED.value, f"{type(exc).__name__}: {exc}"
        log.info("tuning job %s: started %s with %s", record.name, child.name, child.tuned)
        return ChildState.CREATED.value, None
