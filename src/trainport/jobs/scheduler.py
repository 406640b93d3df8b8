"""The scheduler: a limit of concurrent jobs, and a queue that starts in submission order.

Jobs submitted through it are created Pending (``JobService.create(start=False)``); on each
tick it reconciles (ending jobs whose supervisor died), counts the jobs that hold a slot,
and starts the oldest Pending jobs into the free slots. "Decide, then do": :func:`plan`
is the pure decision, :class:`Scheduler` applies it.

Everything it knows lives in the job database, so it holds no state of its own: a server
killed with SIGKILL and started again picks the queue up where it was (running jobs keep
their own supervisor processes and are re-adopted by reconciling).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from trainport.errors import TrainportError
from trainport.jobs.service import JobService, in_queue
from trainport.jobs.status import Status

__all__ = ["Queued", "Scheduler", "plan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Queued:
    name: str
    creation_time: float


def plan(queued: Sequence[Queued], running: int, limit: int) -> list[str]:
    """The jobs to start now: the oldest queued ones, as many as there are free slots."""
    free = max(0, limit - running)
    order = sorted(queued, key=lambda q: (q.creation_time, q.name))
    return [q.name for q in order[:free]]


class Companion(Protocol):
    """A background loop that lives as long as the scheduler (the tuning driver)."""

    def start(self) -> None: ...

    def close(self) -> None: ...


class Scheduler:
    """Starts Pending jobs of ``service`` as capacity frees; one background thread."""

    def __init__(self, service: JobService, limit: int, *, interval: float = 0.5) -> None:
        if limit < 1:
            raise TrainportError(f"the concurrent job limit must be at least 1, not {limit}")
        self.service = service
        self.limit = limit
        self.interval = interval
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._companions: list[Companion] = []

    def attach(self, companion: Companion) -> None:
        """Start and close ``companion`` with this scheduler."""
        self._companions.append(companion)

    def submit(
        self,
        request: dict[str, Any],
        *,
        runner: str | None = None,
        tuning_job_arn: str | None = None,
    ) -> str:
        """Queue a CreateTrainingJob request; returns its ARN. It starts at once if a slot
        is free. ``tuning_job_arn``: the tuning job launching it, if one is."""
        # Checking may unpack a source tarball (seconds for a large one): outside the lock,
        # so that one request holds up no other submission and no tick.
        spec = self.service.admit(request)
        with self._lock:
            queued, running = self._census()
            if not queued and running < self.limit:  # a slot is free: no wait
                return self.service.create(
                    request, runner=runner, admitted=spec, tuning_job_arn=tuning_job_arn
                )
            arn = self.service.create(
                request,
                runner=runner,
                start=False,
                admitted=spec,
                tuning_job_arn=tuning_job_arn,
            )
        self.tick()
        return arn

    def _census(self) -> tuple[list[Queued], int]:
        """The queued jobs, and how many jobs hold a slot."""
        db = self.service.db
        # cast: JobDB's method named `list` confuses mypy about its `list[str]` returns
        active = cast(
            Sequence[str],
            db.names_in_status([Status.IN_PROGRESS.value, Status.STOPPING.value]),
        )
        queued: list[Queued] = []
        running = 0
        for name in active:
            record = db.get(name)
            if in_queue(record):
                queued.append(Queued(name, record.creation_time))
            else:
                running += 1
        return queued, running

    def notify(self) -> None:
        """Something changed (a stop, say): look again soon."""
        self._wake.set()

    def tick(self) -> list[str]:
        """Reconcile, then start what fits; returns the names started."""
        with self._lock:
            self.service.reconcile()
            queued, running = self._census()
            started = []
            for name in plan(queued, running, self.limit):
                try:
                    if self.service.start(name):
                        log.info("job %s: started from the queue", name)
                        started.append(name)
                except TrainportError as exc:
                    log.error("job %s: could not start: %s", name, exc)
            return started

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.tick()
            except Exception:  # the loop must outlive any one bad tick
                log.exception("scheduler tick failed")
            self._wake.wait(self.interval)
            self._wake.clear()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
            self._thread.start()
            for companion in self._companions:
                companion.start()

    def close(self) -> None:
        for companion in self._companions:
            companion.close()
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
