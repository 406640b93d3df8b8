"""The supervisor: one process per running job, owning its record while it runs.

It runs the host agent in a thread and applies job-level policy around it: stop requests
(written to the record by :meth:`JobService.stop`, with SIGUSR1 as a wake-up), the
MaxRuntimeInSeconds deadline, and the status machine. Started detached by the job service
as ``python -m trainport.jobs.supervisor NAME`` so a job outlives the command that
submitted it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import signal
import sys
import threading
import time
from types import FrameType

from trainport.config import Settings, load_settings
from trainport.host.agent import HostAgent, HostPlan
from trainport.jobs.db import JobDB
from trainport.jobs.records import JobRecord, MetricPoint
from trainport.jobs.status import Event, Finished, Status, StopRequested, advance
from trainport.runners.api import select_runner
from trainport.spec import parse_request
from trainport.store.api import open_store

__all__ = ["supervise"]

log = logging.getLogger(__name__)

_POLL = 0.2


def _final_metrics(db: JobDB, name: str) -> tuple[MetricPoint, ...]:
    series = db.metric_series(name)
    return tuple(MetricPoint(m, pts[-1][1], pts[-1][0]) for m, pts in sorted(series.items()))


def _expire(record: JobRecord, event: StopRequested) -> JobRecord:
    return advance(record, event, time.time())


def supervise(name: str, settings: Settings) -> int:
    db = JobDB(settings.db_path)
    record = db.get(name)
    spec = parse_request(record.request, validate=False)
    grace = spec.stop_grace_seconds
    if grace is None:
        grace = settings.stop_grace_seconds
    wake = threading.Event()

    terminate_signal = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            terminate_signal.set()  # a SIGTERM to the supervisor means: stop the job
        wake.set()

    signal.signal(signal.SIGUSR1, on_signal)  # the service wrote a stop request: look now
    signal.signal(signal.SIGTERM, on_signal)

    def emit(event: Event) -> None:
        db.update(name, lambda r: advance(r, event, time.time()))

    def on_started(pgid: int) -> None:
        db.update(name, lambda r: dataclasses.replace(r, training_pgid=pgid))

    plan = HostPlan(spec, record.arn, "algo-1", ("algo-1",), settings.jobs_dir / name)
    agent = HostAgent(
        plan,
        store=open_store(settings),
        runner=select_runner(record.runner, verified=True),
        settings=settings,
        emit=emit,
        on_metrics=lambda pts: db.add_metrics(name, pts),
        on_started=on_started,
    )
    outcome: list[Finished] = []

    def run_agent() -> None:
        try:
            outcome.append(agent.run())
        finally:
            wake.set()  # end the policy loop at once, not at its next tick

    worker = threading.Thread(target=run_agent, name="host-agent")
    worker.start()
    # Runtime counts from when the job leaves the queue and starts, as SageMaker bills it.
    deadline = time.time() + spec.max_runtime_seconds
    terminating = False
    while worker.is_alive():
        wake.wait(_POLL)
        wake.clear()
        if terminating or not worker.is_alive():
            continue
        current = db.get(name)
        if terminate_signal.is_set() and current.status == Status.IN_PROGRESS.value:
            # SIGTERM straight to the supervisor (not via the service) is a stop too.
            current = db.update(
                name,
                lambda r: advance(
                    r, StopRequested("user", "Stopping the training job"), time.time()
                ),
            )
        if current.status != Status.STOPPING.value and time.time() >= deadline:
            message = f"MaxRuntimeInSeconds ({spec.max_runtime_seconds} s) exceeded; stopping"
            expired = StopRequested("max_runtime", message)
            current = db.update(name, functools.partial(_expire, event=expired))
        if current.status == Status.STOPPING.value:
            log.info("stopping job %s (grace %.0f s)", name, grace)
            agent.terminate(grace)
            terminating = True
    worker.join()
    finished = outcome[0] if outcome else Finished(None, "InternalError: the host agent died")
    metrics = _final_metrics(db, name)

    def finish(r: JobRecord) -> JobRecord:
        done = advance(r, finished, time.time())
        return dataclasses.replace(done, model_artifacts=agent.model_uri, final_metrics=metrics)

    final = db.update(name, finish)
    log.info("job %s ended %s/%s", name, final.status, final.secondary_status)
    return 0


def main(argv: list[str] | None = None, settings: Settings | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # force=True: a supervisor forked from the CLI inherits the CLI's logging setup.
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    return supervise(args[0], settings or load_settings())


if __name__ == "__main__":
    sys.exit(main())
