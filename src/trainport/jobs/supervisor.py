"""The supervisor: one process per running job, owning its record while it runs.

It places the job's host agents (:mod:`trainport.placement`), turns their event stream into
the job's record, and applies job-level policy around them: stop requests
(written to the record by :meth:`JobService.stop`, read every 0.2 s), the
MaxRuntimeInSeconds deadline, and the status machine. Started detached by the job service
as ``python -m trainport.jobs.supervisor NAME`` so a job outlives the command that
submitted it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from trainport.config import Settings, load_settings
from trainport.errors import DatabaseError, TrainportError
from trainport.host import command as commands
from trainport.host import jobtree, mpi
from trainport.host.agent import HostPlan
from trainport.host.artifacts import scratch_dir, upload_merged
from trainport.host.events import (
    HostEnded,
    HostEvent,
    MetricsFound,
    StatusChanged,
    TrainingStarted,
    append_log_lines,
)
from trainport.host.launch_kind import mpi_launch_settings
from trainport.host.resources import ResourcesSampled, append_resource_samples, resource_path
from trainport.jobs import liveness
from trainport.jobs.db import JobDB
from trainport.jobs.records import JobRecord, MetricPoint
from trainport.jobs.status import (
    Event,
    Finished,
    Phase,
    Progress,
    Status,
    StopRequested,
    advance,
    goes_back,
)
from trainport.placement import HostGroup, LocalHosts
from trainport.runners.netns import (
    HostNetwork,
    JobLoopback,
    NetworkMode,
    choose_network,
    firewall_problem,
    netns_problem,
)
from trainport.runners.registry import select_runner
from trainport.spec import JobSpec, parse_request
from trainport.store.api import ObjectStore
from trainport.store.registry import open_store

__all__ = ["supervise"]

log = logging.getLogger(__name__)

_POLL = 0.2


@dataclass(frozen=True)
class JobRun:
    """What one run of a job needs, made once by :func:`supervise` and passed down: the
    job (its name, record and spec), where it lives (database, store, settings), its
    hosts' network, its stop grace, the signal that stops it, and its one deadline."""

    db: JobDB
    record: JobRecord
    spec: JobSpec
    settings: Settings
    store: ObjectStore
    network: JobNetwork
    grace: float
    # Set by a SIGTERM to the supervisor: a stop, as one through the service.
    terminate_signal: threading.Event
    # One deadline for the whole job, retries included, from when it leaves the queue (as
    # SageMaker bills it): a job never runs longer than MaxRuntimeInSeconds asked.
    deadline: float

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.spec.hosts

    @property
    def job_dir(self) -> Path:
        return self.settings.jobs_dir / self.record.name


def _final_metrics(db: JobDB, name: str) -> tuple[MetricPoint, ...]:
    series = db.metric_series(name)
    return tuple(MetricPoint(m, pts[-1][1], pts[-1][0]) for m, pts in sorted(series.items()))


def _expire(record: JobRecord, event: StopRequested) -> JobRecord:
    return advance(record, event, time.time())


def host_addresses(job: str, hosts: tuple[str, ...]) -> dict[str, str]:
    """Every host of a job gets its own loopback address: algo-k is 127.a.b.(k+1).

    The block 127.a.b.0/24 comes from the job's name (a >= 1, so 127.0.0.x stays the
    machine's own), so two jobs running at once do not share addresses: each one's
    torchrun can listen on algo-1:7777.
    """
    digest = int.from_bytes(hashlib.sha256(job.encode()).digest()[:4], "big")
    base = ((1 + digest % 254) << 16) | ((digest >> 8) % 256) << 8
    return {h: _loopback(base + int(h.rsplit("-", 1)[1]) + 1) for h in hosts}


def _loopback(offset: int) -> str:
    return f"127.{offset >> 16 & 255}.{offset >> 8 & 255}.{offset & 255}"


@dataclasses.dataclass(frozen=True)
class JobNetwork:
    """The network the job's hosts run in: each host's address, the namespaces made for
    them (None: the machine's network), and what the submitter is told about it."""

    addresses: dict[str, str]
    made: HostNetwork | JobLoopback | None = None
    note: str | None = None

    @property
    def interface(self) -> str:
        return "eth0" if isinstance(self.made, HostNetwork) else "lo"

    def namespace(self, host: str) -> str | None:
        """The network namespace ``host`` runs in, if not the machine's."""
        if isinstance(self.made, HostNetwork):
            return self.made.hosts[host].namespace
        return self.made.namespace if self.made is not None else None

    def teardown(self) -> None:
        if self.made is not None:
            self.made.teardown()


def _network_mode(runner: str, spec: JobSpec) -> tuple[NetworkMode, str | None]:
    if runner == "ray":  # asks the machine nothing
        return NetworkMode.MACHINE, None
    return choose_network(
        runner=runner,
        tag=spec.tags.get("trainport:network"),
        isolated=spec.network_isolation,
        netns=netns_problem(),
        firewall=firewall_problem(),
        docker=commands.runs_in_docker(spec),
    )


def _make_network(name: str, runner: str, spec: JobSpec) -> JobNetwork:
    """The job's network, made; a TrainportError if it cannot be."""
    hosts = spec.hosts
    mode, why = _network_mode(runner, spec)
    if mode is NetworkMode.BRIDGE:
        bandwidth = spec.tags.get("trainport:host-bandwidth")
        bridge = HostNetwork(name, hosts, bandwidth, isolated=spec.network_isolation)
        bridge.__enter__()
        return JobNetwork({h: bridge.hosts[h].address for h in hosts}, bridge)
    addresses = host_addresses(name, hosts)
    if mode is NetworkMode.LOOPBACK:
        # An isolated job's hosts get a loopback of their own instead of the machine's
        # (without root, see HostAgent's note).
        loopback = JobLoopback(name)
        loopback.__enter__()
        return JobNetwork(addresses, loopback)
    note = None
    if why and len(hosts) > 1:
        note = f"the hosts share this machine's network: {why}"
        log.warning("job %s: %s", name, note)
    return JobNetwork(addresses, None, note)


def _host_outcome(finished: Finished, host: str, multi: bool) -> Finished:
    if not multi or finished.exit_code == 0:
        return finished
    reason = finished.failure_reason or f"AlgorithmError: , exit code: {finished.exit_code}"
    return Finished(finished.exit_code, f"{host}: {reason}")


def _claim(record: JobRecord, me: tuple[int, int, str] | None) -> JobRecord:
    """The record with this process as its supervisor, unless it has ended or a live
    supervisor other than this one holds it."""
    if me is None or Status(record.status).terminal:
        return record
    held = record.supervisor
    if held is not None and held != me and liveness.is_alive(held):
        return record
    return dataclasses.replace(record, supervisor=me)


def _owned(record: JobRecord, pid: int) -> bool:
    return not Status(record.status).terminal and (
        record.supervisor is not None and record.supervisor[0] == pid
    )


def supervise(name: str, settings: Settings) -> int:
    log.info("supervising job %s (pid %d)", name, os.getpid())
    db = JobDB(settings.db_path)
    record = db.update(name, functools.partial(_claim, me=liveness.identity(os.getpid())))
    if not _owned(record, os.getpid()):
        # A reconcile ended it while it was being started (or another supervisor has it):
        # running it now would train a job the record already calls ended.
        log.warning("job %s is %s; not running it", name, record.status)
        return 0
    spec = parse_request(record.request, validate=False)
    grace = spec.stop_grace_seconds
    if grace is None:
        grace = settings.stop_grace_seconds
    terminate_signal = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            terminate_signal.set()  # a SIGTERM to the supervisor means: stop the job

    # The service wrote a stop request; the loop reads the record every _POLL seconds, so
    # the signal only has to not end this process.
    signal.signal(signal.SIGUSR1, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    try:
        network = _make_network(name, record.runner, spec)
    except TrainportError as exc:
        failed = Finished(None, f"ClientError: cannot make the hosts' network: {exc}")
        db.update(name, lambda r: advance(r, failed, time.time()))
        return 1
    try:
        run = JobRun(
            db, record, spec, settings, open_store(settings), network, grace, terminate_signal,
            deadline=time.time() + spec.max_runtime_seconds,
        )  # fmt: skip
        return _run_hosts(run)
    finally:
        network.teardown()


def _run_hosts(run: JobRun) -> int:
    db, name, spec, settings = run.db, run.name, run.spec, run.settings
    hosts = run.hosts
    multi = len(hosts) > 1

    def emit(event: Event, from_host: bool = False) -> None:
        # With several hosts the job uploads once all of them are done: one host's
        # "Uploading" would say so too early.
        if multi and isinstance(event, Phase) and event.secondary == "Uploading":
            return

        def change(r: JobRecord) -> JobRecord:
            # A slower host's phase does not take the job back; a retry's Starting does.
            if (
                from_host
                and isinstance(event, Phase)
                and goes_back(r.secondary_status, event.secondary)
            ):
                return r
            return advance(r, event, time.time())

        with _unless_unwritable(name, "a status change"):
            db.update(name, change)

    def on_started(pgid: int) -> None:
        with _unless_unwritable(name, "its process group"):
            db.update(
                name,
                lambda r: dataclasses.replace(
                    r,
                    training_pgid=r.training_pgid or pgid,
                    training_pgids=(*r.training_pgids, pgid),
                ),
            )

    outcomes: dict[str, Finished] = {}
    model_uris: dict[str, str | None] = {}

    def apply(event: HostEvent) -> None:
        """One host event into the job's record (logs are already in the job's folder)."""
        if isinstance(event, StatusChanged):
            emit(event.change, from_host=True)
        elif isinstance(event, TrainingStarted):
            log.info("host %s started training (process group %d)", event.host, event.pgid)
        elif isinstance(event, MetricsFound):
            # FinalMetricDataList and the metric series come from algo-1, as on SageMaker
            # where the first host's log feeds the job's metrics.
            if event.host == hosts[0]:
                with _unless_unwritable(name, "metric points"):
                    db.add_metrics(name, list(event.points))
        elif isinstance(event, ResourcesSampled):
            # Beside the logs in the job's folder, for the dashboard's charts; best-effort.
            try:
                path = resource_path(settings.jobs_dir / name, event.host)
                append_resource_samples(path, event.samples)
            except OSError as exc:
                log.debug("job %s: resource samples not written: %s", name, exc)
        elif isinstance(event, HostEnded):
            outcomes[event.host] = event.finished
            model_uris[event.host] = event.model_uri

    attempts = 1 + spec.retry_attempts
    attempt = 1
    while True:
        outcomes.clear()
        model_uris.clear()
        ran = _attempt(run, apply, outcomes, on_started)
        if ran is None:
            return 1
        group, failed_host, overdue, stopped = ran
        if failed_host and should_retry(outcomes[failed_host], attempt, attempts, stopped):
            attempt += 1
            reason = _host_outcome(outcomes[failed_host], failed_host, multi).failure_reason
            message = (
                f"Restarting the training job (attempt {attempt} of {attempts}, RetryStrategy) "
                f"after: {reason}"
            )
            log.warning("job %s: %s", name, message)
            _say_in_logs(run.job_dir, hosts, message)
            # Fresh instances, as SageMaker's retry gets: nothing of the failed attempt's
            # trees is merged into the next one's archives (checkpoints are in the store).
            # Never following a link a job left in them (see jobtree.remove_tree).
            jobtree.remove_tree(run.job_dir / "hosts")
            emit(Phase("Starting", message))
            continue
        break
    run.network.teardown()  # before the job is marked ended: an ended job holds nothing
    finished = (
        _host_outcome(outcomes[failed_host], failed_host, multi)
        if failed_host
        else Finished(0, None)
    )
    model_uri = model_uris.get(hosts[0])
    try:
        # A job whose hosts never got their instances (stopped while it waited for a
        # cluster's capacity) has nothing to upload, and says no Uploading.
        if multi and _got_instances(db.get(name)):
            model_uri, finished = _upload_merged(run, group, finished)
        metrics = _final_metrics(db, name)

        def finish(r: JobRecord) -> JobRecord:
            if overdue:
                r = advance(r, _overrun(spec), time.time())
            done = advance(r, finished, time.time())
            return dataclasses.replace(done, model_artifacts=model_uri, final_metrics=metrics)

        final = db.update(name, finish)
    except DatabaseError as exc:
        # Nothing more to free here (the hosts gave back their room); reconcile ends the
        # job once its record can be written again.
        log.error("job %s: its end (%s) could not be recorded: %s", name, finished, exc)
        return 1
    log.info("job %s ended %s/%s", name, final.status, final.secondary_status)
    return 0


def should_retry(outcome: Finished, attempt: int, attempts: int, stopped: bool) -> bool:
    """Whether a failed attempt is run again (RetryStrategy): only for trainport's own
    failures (InternalServerError: a Ray node that died or was lost), never for the
    training code's (AlgorithmError), the request's (ClientError) or a stop, and only while
    attempts remain. ``outcome`` is the failed host's own, ``attempts`` 1 + the retries."""
    if stopped or outcome.exit_code == 0 or attempt >= attempts:
        return False
    return (outcome.failure_reason or "").startswith("InternalServerError")


def _say_in_logs(job_dir: Path, hosts: tuple[str, ...], message: str) -> None:
    line = (time.time(), f"[trainport] {message}")
    for host in hosts:
        with contextlib.suppress(OSError):
            append_log_lines(job_dir / "logs" / f"{host}.log", (line,))


def _attempt(
    run: JobRun,
    apply: Callable[[HostEvent], None],
    outcomes: Mapping[str, Finished],
    on_started: Callable[[int], None],
) -> tuple[HostGroup, str | None, bool, bool] | None:
    """Place the job's hosts and run them to their end, applying stop requests and the
    deadline; (the group, the first host that failed, whether the deadline passed while the
    record was unwritable, whether the job was stopped), or None if the hosts could not
    be started (the job is then ended). ``apply`` fills ``outcomes`` as hosts end."""
    db, name, spec, network, grace = run.db, run.name, run.spec, run.network, run.grace
    terminate_signal, deadline = run.terminate_signal, run.deadline
    hosts = spec.hosts
    multi = len(hosts) > 1
    # MPI: algo-1's mpirun asks for a daemon on each other host through this board.
    board = mpi.LaunchBoard(hosts) if mpi_launch_settings(spec) is not None else None
    plans = [
        HostPlan(
            spec,
            run.record.arn,
            host,
            hosts,
            run.job_dir,
            addresses=network.addresses,
            upload_artifacts=not multi,
            network_interface=network.interface,
            netns=network.namespace(host),
            network_note=network.note,
            mpi_board=board,
        )
        for host in hosts
    ]
    group = _place(run, plans, on_started)
    try:
        group.start()
    except Exception as exc:  # no cluster to connect to, say: the job must still end
        log.error("job %s: its hosts could not be started: %s", name, exc)
        failed = Finished(None, f"ClientError: the job's hosts could not be started: {exc}")
        db.update(name, lambda r: advance(r, failed, time.time()))
        return None
    terminating = False
    overdue = False  # stopped at the deadline while its record could not be written
    unreadable = False  # said once per spell of a database that cannot be read
    failed_host: str | None = None
    while len(outcomes) < len(hosts):
        for event in group.events(_POLL):
            apply(event)
        if terminating:
            continue
        if failed_host is None:
            failed_host = _first_failed(hosts, outcomes)
            if failed_host is not None and multi:
                log.info("host %s failed; stopping the other hosts", failed_host)
                for host in hosts:
                    if host != failed_host:
                        group.terminate(host, grace)
        try:
            current = db.get(name)
            if terminate_signal.is_set() and current.status == Status.IN_PROGRESS.value:
                # SIGTERM straight to the supervisor (not via the service) is a stop too.
                user_stop = StopRequested("user", "Stopping the training job")
                current = db.update(name, functools.partial(_expire, event=user_stop))
            if current.status != Status.STOPPING.value and time.time() >= deadline:
                current = db.update(name, functools.partial(_expire, event=_overrun(spec)))
            unreadable = False
        except DatabaseError as exc:
            # A full disk, say: the deadline and a SIGTERM hold all the same; the record
            # catches up when the job ends.
            if not unreadable:
                log.warning("job %s: its record cannot be read or written: %s", name, exc)
            unreadable = True
            overdue = time.time() >= deadline
            if overdue or terminate_signal.is_set():
                log.info("stopping job %s (grace %.0f s)", name, grace)
                for host in hosts:
                    group.terminate(host, grace)
                terminating = True
            continue
        if current.status == Status.STOPPING.value:
            log.info("stopping job %s (grace %.0f s)", name, grace)
            for host in hosts:
                group.terminate(host, grace)
            terminating = True
    group.close()
    return group, failed_host or _first_failed(hosts, outcomes), overdue, terminating


def _first_failed(hosts: tuple[str, ...], outcomes: Mapping[str, Finished]) -> str | None:
    return next((h for h in hosts if h in outcomes and outcomes[h].exit_code != 0), None)


def _place(run: JobRun, plans: list[HostPlan], on_started: Callable[[int], None]) -> HostGroup:
    """The job's hosts, placed where its runner says: a Ray cluster, or this machine.

    Only hosts on this machine record their process groups (``on_started``): a reconcile
    here stops an orphan's groups by number, which names nothing of a node's processes.
    """
    if run.record.runner == "ray":
        from trainport.placement.ray import RayHosts

        return RayHosts(plans, settings=run.settings, job_dir=run.job_dir)
    runner = select_runner(run.record.runner, verified=True)
    # The hosts record their process groups as they start them (see LocalHosts._report).
    return LocalHosts(
        plans, store=run.store, runner=runner, settings=run.settings, on_started=on_started
    )


def _overrun(spec: JobSpec) -> StopRequested:
    message = f"MaxRuntimeInSeconds ({spec.max_runtime_seconds} s) exceeded; stopping"
    return StopRequested("max_runtime", message)


def _got_instances(record: JobRecord) -> bool:
    return any(t.status in ("Downloading", "Training") for t in record.transitions)


@contextlib.contextmanager
def _unless_unwritable(name: str, what: str) -> Iterator[None]:
    """Go on without recording ``what`` when the job database cannot be written (a full
    disk): the job's outcome, recorded at its end, is what must not be lost."""
    try:
        yield
    except DatabaseError as exc:
        log.warning("job %s: %s not recorded: %s", name, what, exc)


def _upload_merged(
    run: JobRun, group: HostGroup, finished: Finished
) -> tuple[str | None, Finished]:
    """Every host's model and output folders as one pair of archives (see pack_merged)."""
    db, name, spec = run.db, run.name, run.spec
    db.update(
        name,
        lambda r: advance(r, Phase("Uploading", "Uploading generated training model"), time.time()),
    )
    folders = group.artifact_folders()
    try:
        uri, conflicts = upload_merged(
            run.store,
            spec.output_path,
            spec.name,
            [(h, model) for h, model, _ in folders],
            [(h, output) for h, _, output in folders],
            scratch=scratch_dir(run.job_dir),
        )
    except TrainportError as exc:
        reason = f"ClientError: artifact upload failed: {exc}"
        return None, finished if finished.exit_code else Finished(1, reason)
    if conflicts:
        note = (
            "Uploading generated training model; files written by several hosts, kept from "
            "the lowest-numbered host: " + "; ".join(conflicts)
        )
        db.update(name, lambda r: advance(r, Progress(note), time.time()))
        db.update(name, lambda r: dataclasses.replace(r, notes=(*r.notes, note)))
    return uri, finished


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
