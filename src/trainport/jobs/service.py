"""The jobs service: the one door the CLI, the HTTP server and the Python client go through.

It validates and checks a request before anything runs (so bad input fails fast and nothing
stored is touched), persists the record, and starts a detached supervisor process for the
job. Every read first reconciles: a job whose supervisor is gone is ended, Failed with a
reason that says so (see README, "Durability"), never left InProgress.

Reconciling and starting race each other from different processes (a CLI reads while a
server's queue drains), so the verdict :func:`is_orphan` is taken again inside the update
that ends the job, and a supervisor claims its job in one update before it runs anything:
whichever comes first wins, and a job once ended never trains.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainport.config import Settings, load_settings
from trainport.errors import DatabaseError, JobError, ResourceInUseError, ValidationError
from trainport.host.artifacts import scratch_dir, upload_merged
from trainport.jobs import admission, liveness
from trainport.jobs.db import JobDB, JobSummary, ListQuery
from trainport.jobs.records import JobRecord, Transition
from trainport.jobs.status import Finished, Phase, Status, StopRequested, advance
from trainport.spec import JobSpec, parse_request
from trainport.store.api import ObjectStore
from trainport.store.registry import open_store

__all__ = ["JobService", "LogLine", "in_queue", "is_orphan"]

log = logging.getLogger(__name__)

LogLine = tuple[float, str]
# A host of a job, as --host names it (jobs logs): algo-1, algo-2, ...
_HOST = re.compile(r"algo-[1-9][0-9]{0,2}")
# Seconds a job whose launcher has died may take to record its supervisor: a supervisor
# spawned just before its launcher died still records itself once it is up.
_LAUNCH_WINDOW = 60.0
# SecondaryStatus of a job waiting in a scheduler's queue, or for a Ray cluster's capacity
PENDING = "Pending"

Identity = tuple[int, int, str]


def _launch_time(record: JobRecord) -> float:
    """When the job's latest start began: leaving the queue, or its creation."""
    starts = [t.start_time for t in record.transitions if t.status == "Starting"]
    return max(starts, default=record.creation_time)


def in_queue(record: JobRecord) -> bool:
    """Whether ``record`` waits in a scheduler's queue: Pending, and no supervisor ever
    recorded. A job whose supervisor waits for a Ray cluster's capacity is Pending too, but
    it has left the queue: it holds its slot and its supervisor answers a stop."""
    return (
        record.status == Status.IN_PROGRESS.value
        and record.secondary_status == PENDING
        and record.supervisor is None
    )


def is_orphan(record: JobRecord, now: float, alive: Callable[[Identity], bool]) -> bool:
    """Whether nothing will ever finish ``record``: the reconcile verdict.

    A queued job waits for its scheduler; a job with no supervisor recorded yet is being
    started while the process starting it lives, and for :data:`_LAUNCH_WINDOW` seconds
    after that process is gone; past that, or once its recorded supervisor is dead, it is
    orphaned. ``alive`` tells whether a process identity (see ``liveness``) still runs.
    """
    if Status(record.status).terminal:
        return False
    if record.supervisor is not None:
        return not alive(record.supervisor)
    if record.secondary_status == PENDING:
        return False
    if record.launcher is not None and alive(record.launcher):
        return False
    return now - _launch_time(record) >= _LAUNCH_WINDOW


class JobService:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        reconcile_on_read: bool = True,
        launch: str = "spawn",
        allow_process_runner: bool = True,
        allow_host_paths: bool = True,
    ) -> None:
        self.settings = settings or load_settings()
        # The process runner isolates nothing: a server takes it only if its operator says.
        self.allow_process_runner = allow_process_runner
        # A local user may run their own files; a server's clients may not name the
        # server's files (the sandbox would show them), unless its operator says.
        self.allow_host_paths = allow_host_paths
        # "spawn" starts each supervisor as a new interpreter (safe from any caller);
        # "fork" copies this one, which has everything imported already: a single-threaded
        # caller such as the CLI saves a whole Python start-up per job.
        self.launch = launch
        # A long-lived caller (the server's scheduler) reconciles on its own clock instead.
        self.reconcile_on_read = reconcile_on_read
        self.db = JobDB(self.settings.db_path)
        self._store: ObjectStore | None = None

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    def arn(self, name: str) -> str:
        s = self.settings
        return f"arn:aws:sagemaker:{s.region}:{s.account_id}:training-job/{name}"

    # -- create ---------------------------------------------------------------------------

    def check(self, request: dict[str, Any]) -> JobSpec:
        """Validate ``request`` and everything it points at, without running anything:
        parsed (a pure function of the request), then asked of every part with a say, in
        the fixed order of :mod:`trainport.jobs.admission`."""
        return admission.admit(parse_request(request), self.settings, self.store)

    def admit(self, request: dict[str, Any]) -> JobSpec:
        """The checks of :meth:`create` that come before anything is stored: a name already
        taken, then :meth:`check`. They may read and unpack what the request points at, so
        a scheduler runs them outside its lock."""
        name = request.get("TrainingJobName") if isinstance(request, dict) else None
        if isinstance(name, str) and self.db.exists(name):
            raise ResourceInUseError(
                f"Training job {name!r} already exists; choose another TrainingJobName "
                "(names are unique, as in SageMaker)"
            )
        if not self.allow_host_paths and isinstance(request, dict):
            # Before the checks that look at the files a request names (an entry point
            # that must be executable): those would answer a client about this machine.
            _refuse_host_paths(request)
        return self.check(request)

    def create(
        self,
        request: dict[str, Any],
        *,
        runner: str | None = None,
        start: bool = True,
        admitted: JobSpec | None = None,
        tuning_job_arn: str | None = None,
    ) -> str:
        """Accept a CreateTrainingJob request and start it; returns the job's ARN.

        With ``start=False`` the job waits with SecondaryStatus Pending until
        :meth:`start` (called by a scheduler when capacity frees). ``admitted`` is what
        :meth:`admit` returned for this request, if the caller ran it already;
        ``tuning_job_arn`` names the tuning job that launches it, if one does."""
        spec = admitted or self.admit(request)
        requested = runner or spec.runner or self.settings.runner
        runner_name = admission.place(
            spec, requested, self.settings, allow_process=self.allow_process_runner
        )
        now = time.time()
        record = JobRecord(
            name=spec.name,
            arn=self.arn(spec.name),
            request=request,
            creation_time=now,
            last_modified_time=now,
            status_message="Preparing the instances for training",
            transitions=(
                Transition("Starting", now, None, "Preparing the instances for training"),
            ),
            runner=runner_name,
            job_dir=str(self.settings.jobs_dir / spec.name),
            launcher=liveness.identity(os.getpid()) if start else None,
            tuning_job_arn=tuning_job_arn,
        )
        if not start:
            waiting = "Waiting for capacity: the job starts when a running job ends"
            record = dataclasses.replace(
                record,
                secondary_status=PENDING,
                status_message=waiting,
                transitions=(Transition(PENDING, now, None, waiting),),
            )
        self.db.insert(record)
        if start:
            self._launch(spec.name)
        return record.arn

    def start(self, name: str) -> bool:
        """Start a Pending job; False if it is no longer Pending (stopped meanwhile)."""

        left = [False]

        def leave_queue(r: JobRecord) -> JobRecord:
            left[0] = False  # update() may retry; only the applied call counts
            if not in_queue(r):
                return r
            left[0] = True
            started = advance(r, Phase("Starting", "Preparing the instances"), time.time())
            return dataclasses.replace(started, launcher=liveness.identity(os.getpid()))

        self.db.update(name, leave_queue)
        if not left[0]:
            return False
        self._launch(name)
        return True

    def _launch(self, name: str) -> None:
        try:
            pid, wait = self._start_supervisor(name)
        except OSError as exc:
            # Nothing will run it: end it now rather than leave it "being started".
            reason = f"InternalError: trainport could not start the job's supervisor: {exc}"
            self.db.update(name, lambda r: advance(r, Finished(None, reason), time.time()))
            raise JobError(f"training job {name!r}: could not start its supervisor: {exc}") from exc
        ident = liveness.identity(pid)
        # Reap it when it ends, so a long-lived caller (the server) keeps no zombies.
        threading.Thread(target=wait, name=f"reap-{name}", daemon=True).start()
        # The launch is over: the job is its supervisor's now. One that ended before it
        # could be seen (ident None) and never recorded itself gets the launch window.
        self.db.update(
            name,
            lambda r: dataclasses.replace(r, supervisor=ident or r.supervisor, launcher=None),
        )

    def _start_supervisor(self, name: str) -> tuple[int, Callable[[], object]]:
        job_dir = self.settings.jobs_dir / name
        job_dir.mkdir(parents=True, exist_ok=True)
        log_path = job_dir / "supervisor.log"
        settings = self.settings
        env = {**os.environ, "TRAINPORT_HOME": str(settings.home)}
        if not self.allow_process_runner:
            # What this service refuses here it must not get on a Ray node either.
            settings = dataclasses.replace(settings, require_isolation=True)
            env["TRAINPORT_REQUIRE_ISOLATION"] = "1"
        # A process connected to a Ray cluster (it checked a ray job's size) must not
        # fork: the copy would inherit the connection's threads mid-state.
        if self.launch == "fork" and not _ray_connected():
            pid = _fork_supervisor(name, settings, log_path)
            return pid, functools.partial(os.waitpid, pid, 0)
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainport.jobs.supervisor", name],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        return proc.pid, proc.wait

    # -- read -----------------------------------------------------------------------------

    def get(self, name: str) -> JobRecord:
        if self.reconcile_on_read:
            self.reconcile()
        return self.db.get(name)

    def describe(self, name: str) -> dict[str, Any]:
        return self.get(name).to_describe()

    def list(self, query: ListQuery | None = None) -> builtins.list[JobRecord]:
        if self.reconcile_on_read:
            self.reconcile()
        return self.db.list(query or ListQuery())

    def list_summaries(self, query: ListQuery | None = None) -> builtins.list[JobSummary]:
        if self.reconcile_on_read:
            self.reconcile()
        return self.db.list_summaries(query or ListQuery())

    def metric_series(self, name: str) -> dict[str, builtins.list[tuple[float, float]]]:
        self.db.get(name)
        return self.db.metric_series(name)

    # -- stop -----------------------------------------------------------------------------

    def stop(self, name: str) -> JobRecord:
        self.reconcile()
        record = self.db.update(
            name,
            lambda r: advance(r, StopRequested("user", "Stopping the training job"), time.time()),
        )
        if record.supervisor is not None and liveness.is_alive(record.supervisor):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.supervisor[0], signal.SIGUSR1)
        elif _never_started(record):
            # A queued job has no processes to stop: it ends Stopped at once.
            record = self.db.update(name, lambda r: advance(r, Finished(None), time.time()))
        return record

    # -- durability -----------------------------------------------------------------------

    def reconcile(self) -> builtins.list[str]:
        """End every unfinished job whose supervisor is gone; returns their names."""
        ended: builtins.list[str] = []
        for name in self.db.names_in_status([Status.IN_PROGRESS.value, Status.STOPPING.value]):
            record = self.db.get(name)
            if is_orphan(record, time.time(), liveness.is_alive) and self._end_orphan(record):
                ended.append(name)
        return ended

    def _end_orphan(self, record: JobRecord) -> bool:
        """End an orphaned job; False if it turned out not to be one (it was started)."""
        killed = False
        model_uri = None
        if record.supervisor is not None and record.job_dir:
            # A dead supervisor never comes back: clean up after it and keep what the
            # hosts' model folders hold, all that is left of the job. (With no supervisor
            # recorded nothing ran: a supervisor claims its job before it runs anything.)
            groups = record.training_pgids or (
                (record.training_pgid,) if record.training_pgid else ()
            )
            killed = any([_stop_group(pgid, record.arn) for pgid in groups])
            killed = _remove_containers(record) or killed
            from trainport.runners.netns import remove_left

            for name in remove_left(record.name, record.supervisor[0]):
                log.warning("job %s: removed its network %s", record.name, name)
            job_dir = Path(record.job_dir)
            _unmount_left(record.name, job_dir)
            with contextlib.suppress(Exception):
                spec = parse_request(record.request, validate=False)
                from trainport.runners.sandbox import remove_left_containers

                hosts = [job_dir / "hosts" / h for h in spec.hosts]
                # Their training ended with the supervisor (runc's parent-death signal);
                # what is left is the runtime's record of them.
                for left in remove_left_containers(hosts):
                    log.warning("job %s: removed its sandbox %s", record.name, left)
                    killed = True
                roots = [(h, job_dir / "hosts" / h) for h in spec.hosts]
                model_uri, _ = upload_merged(
                    self.store,
                    spec.output_path,
                    spec.name,
                    [(h, root / "model") for h, root in roots],
                    [(h, root / "output" / "data") for h, root in roots],
                    scratch=scratch_dir(job_dir),
                )
            # Half-made archives of the dead supervisor's own upload, and ours.
            shutil.rmtree(scratch_dir(job_dir), ignore_errors=True)
        if record.supervisor is not None:
            what = (
                f"trainport's supervisor of this job (pid {record.supervisor[0]}) ended "
                "without finishing it (it was killed or crashed)"
                + ("; its training processes were stopped" if killed else "")
            )
        else:
            starter = f" (pid {record.launcher[0]})" if record.launcher else ""
            what = (
                f"the process starting this job{starter} ended before the job's supervisor "
                "ran, so the job never ran"
            )
        reason = (
            f"InternalServerError: {what}. Run the job again under a new name; with "
            "CheckpointConfig it resumes from the last synced checkpoint."
        )
        ended = [False]

        def end(r: JobRecord) -> JobRecord:
            ended[0] = False  # update() may retry; only the applied call counts
            # Decided again inside the update: a supervisor may have claimed the job
            # since it was read.
            if not is_orphan(r, time.time(), liveness.is_alive):
                return r
            ended[0] = True
            done = advance(r, Finished(None, reason), time.time())
            return dataclasses.replace(done, model_artifacts=model_uri or r.model_artifacts)

        self.db.update(record.name, end)
        if ended[0]:
            log.warning("job %s: %s", record.name, reason)
        return ended[0]

    # -- logs -----------------------------------------------------------------------------

    def log_path(self, name: str, host: str = "algo-1") -> Path:
        # The host comes from a caller (--host): a name, never a path.
        if not _HOST.fullmatch(host):
            raise ValidationError(f"host {host!r} is not a host name such as algo-1 or algo-12")
        return self.settings.jobs_dir / name / "logs" / f"{host}.log"

    def logs(
        self, name: str, *, follow: bool = False, poll: float = 0.1, host: str = "algo-1"
    ) -> Iterator[LogLine]:
        """One host's log lines with their timestamps; ``follow`` waits for more until the
        job has ended and every line is read."""
        self.db.get(name)
        path = self.log_path(name, host)
        offset = 0
        buffer = b""
        while True:
            try:
                ended = Status(self.get(name).status).terminal if follow else True
            except DatabaseError as exc:
                # A full disk, say: the job's supervisor makes room to record its end.
                log.debug("job %s: %s; reading its log on", name, exc)
                ended = False
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    stamp, _, text = raw.partition(b"\t")
                    try:
                        ts = float(stamp)
                    except ValueError:
                        ts, text = 0.0, raw
                    yield ts, text.decode("utf-8", "replace")
            if ended:
                return
            time.sleep(poll)


def _never_started(record: JobRecord) -> bool:
    """A job stopped while it waited in the queue: Pending, then Stopping, nothing else."""
    return [t.status for t in record.transitions] == [PENDING, "Stopping"]


def _unmount_left(name: str, job_dir: Path) -> None:
    """Unmount the FastFile views a dead supervisor served: their FUSE daemon died with it,
    and the mounts would stay, answering "Transport endpoint is not connected"."""
    from trainport.host.fastfile import unmount_under

    for mountpoint in unmount_under(job_dir):
        log.warning("job %s: unmounted its FastFile view %s", name, mountpoint)


def _remove_containers(record: JobRecord) -> bool:
    """Stop and remove a dead supervisor's containers (found by their job-folder label);
    whether there were any. Only a job whose TrainingImage is no local folder may have
    run in a container engine."""
    from trainport.config import container_engine_setting
    from trainport.runners import container

    image = (record.request.get("AlgorithmSpecification") or {}).get("TrainingImage")
    if not isinstance(image, str) or not image or os.path.isdir(os.path.expanduser(image)):
        return False
    try:
        engine = container.find_engine(container_engine_setting())
    except ValidationError as exc:
        log.warning("job %s: cannot look for its containers: %s", record.name, exc)
        return False
    return engine is not None and bool(container.remove_job_containers(engine, record.job_dir))


def _stop_group(pgid: int | None, arn: str) -> bool:
    """Kill what is left of a job's training process group, if it is still that job's."""
    if not pgid:
        return False
    members = []
    marker = f"TRAINING_JOB_ARN={arn}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            environ = (entry / "environ").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        if marker in environ.split(b"\0"):
            members.append(int(entry.name))
    if not members:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return True


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _fork_supervisor(name: str, settings: Settings, log_path: Path) -> int:
    """Start the supervisor as a forked copy of this (single-threaded) process."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pid = os.fork()
    if pid:
        os.close(fd)
        return pid
    code = 1
    try:
        os.setsid()  # its own session: a Ctrl-C in the terminal does not reach it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from trainport.jobs.supervisor import main

        code = main([name], settings)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


OPT_ML = "/opt/ml"


def _refuse_host_paths(request: dict[str, Any]) -> None:
    """Refuse a request that names files of this machine the sandbox would show its job.

    The sandbox shows the system folders to every job anyway; anything else an entry point,
    an argument or the image names would be mounted read-only for the job to read. Decided
    by each path's form alone, whether or not it exists: an answer that differed would tell
    a client which files this machine has.
    """
    from trainport.runners.plan import SYSTEM_DIRS

    algo = request.get("AlgorithmSpecification") or {}
    if not isinstance(algo, dict):
        return  # not a request's shape: parse_request says what is wrong
    named: list[tuple[str, str]] = []
    for field_name in ("ContainerEntrypoint", "ContainerArguments"):
        items = algo.get(field_name)
        for i, item in enumerate(items if isinstance(items, list) else []):
            if isinstance(item, str) and item.startswith("/"):
                named.append((f"AlgorithmSpecification.{field_name}[{i}]", item))
    image = algo.get("TrainingImage")
    if isinstance(image, str) and image.startswith(("/", ".", "~")):
        named.append(("AlgorithmSpecification.TrainingImage", image))
    for field_name, path in named:
        full = os.path.normpath(os.path.expanduser(path))
        if full == OPT_ML or full.startswith(OPT_ML + "/"):
            continue  # the job's own tree
        if any(full == d or full.startswith(d + "/") for d in SYSTEM_DIRS):
            continue  # shown to every job anyway
        raise ValidationError(
            f"{field_name}: {path!r} names a path of the server's machine outside /opt/ml and "
            "the system folders; this server does not show its files to jobs. Put the code "
            "in the job's source archive (script mode) or ask the operator to set "
            "TRAINPORT_SERVER_ALLOW_HOST_PATHS=1"
        )
