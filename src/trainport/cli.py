"""The ``trainport`` command line: run jobs, look at them, stop them.

Every command goes through :class:`~trainport.jobs.service.JobService`. Errors trainport
raises on purpose print as one clear line (exit 2); the exit code of ``run`` is 0 only when
the job Completed.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from trainport.errors import (
    DatabaseError,
    NotFoundError,
    ResourceInUseError,
    TrainportError,
    ValidationError,
)
from trainport.tuning.cli import tune_command, tuning_group

__all__ = ["cli", "main"]

F = TypeVar("F", bound=Callable[..., Any])


def _service() -> Any:
    """The jobs service: a running server's (``--endpoint``/TRAINPORT_ENDPOINT), else local."""
    from trainport.config import load_settings

    ctx = click.get_current_context(silent=True)
    endpoint = ctx.find_root().params.get("endpoint") if ctx is not None else None
    endpoint = endpoint or load_settings().endpoint
    if endpoint:
        from trainport.client import RemoteJobService

        return RemoteJobService(endpoint)
    from trainport.jobs.service import JobService

    # The CLI is single-threaded when it submits, so supervisors can be forked from it:
    # that saves each job a whole Python start-up.
    return JobService(launch="fork")


def _echo_err(text: str) -> None:
    sys.stdout.flush()  # keep log lines (stdout) and status lines (stderr) in order when piped
    click.echo(text, err=True)


# -- following a job ------------------------------------------------------------------------


def _fmt_time(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _summary(record: Any) -> str:
    lines = [f"Job {record.name}: {record.status} ({record.secondary_status})"]
    if record.failure_reason:
        lines.append(f"  FailureReason: {record.failure_reason}")
    for m in record.final_metrics:
        lines.append(f"  {m.name} = {m.value:g}")
    if record.model_artifacts:
        lines.append(f"  Model artifact: {record.model_artifacts}")
        local = _local_path(record.model_artifacts)
        if local:
            lines.append(f"    (on disk: {local})")
    return "\n".join(lines)


def _local_path(uri: str) -> str | None:
    from trainport.config import load_settings

    settings = load_settings()
    if settings.store_kind != "local" or not uri.startswith("s3://"):
        return None
    return str(settings.store_root / uri[len("s3://") :])


def follow_job(service: Any, name: str, *, stop_on_interrupt: bool = True) -> Any:
    """Stream a job's status changes (stderr) and log lines (stdout) until it ends."""
    from trainport.jobs.status import Status

    seen_transitions = 0
    last_message = ""
    interrupted = 0
    original = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted += 1
        if interrupted == 1 and stop_on_interrupt:
            _echo_err(f"[trainport] stopping {name} (Ctrl-C again to leave it running)")
            service.stop(name)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        lines = service.logs(name, follow=True, poll=0.05)
        last_check = 0.0
        while True:
            now = time.monotonic()
            if now - last_check > 0.2:
                try:
                    record = service.get(name)
                except DatabaseError:
                    # A full disk, say: the job's supervisor makes room to record its
                    # end, and the log goes on meanwhile.
                    last_check = now
                    continue
                for t in record.transitions[seen_transitions:]:
                    _echo_err(f"[trainport] {t.status}: {t.message}")
                    last_message = t.message
                seen_transitions = len(record.transitions)
                if record.status_message != last_message:  # progress within a phase
                    _echo_err(f"[trainport] {record.secondary_status}: {record.status_message}")
                    last_message = record.status_message
                last_check = now
            try:
                _, text = next(lines)
            except StopIteration:
                break
            click.echo(text)
        record = service.get(name)
        for t in record.transitions[seen_transitions:]:
            _echo_err(f"[trainport] {t.status}: {t.message}")
        assert Status(record.status).terminal
        return record
    finally:
        signal.signal(signal.SIGINT, original)


# -- commands -------------------------------------------------------------------------------


def _handle_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainportError as exc:
            _echo_err(f"error: {exc}")
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log what trainport does.")
@click.option(
    "--endpoint",
    metavar="URL",
    help="Send run/jobs commands to a running `trainport server` (or TRAINPORT_ENDPOINT).",
)
@click.version_option(package_name="trainport")
def cli(verbose: bool, endpoint: str | None) -> None:
    """Run SageMaker-style training jobs on this machine."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# Where the job's code runs; said the same way by every command that starts a job.
_runner_option = click.option(
    "--runner",
    type=click.Choice(["auto", "sandbox", "process", "ray"]),
    default=None,
    help="sandbox: the job sees only its own /opt/ml; process: NO isolation, the job can read "
    "and change all that you can (TRAINPORT_HOME included), for trusted code only; auto: the "
    "sandbox where this machine can make one; ray: each host on its own node of the Ray "
    "cluster RAY_ADDRESS names, contained as auto would there.",
)


@cli.command()
@click.argument("job_file", required=False, type=click.Path(path_type=Path))
@click.option("--name", help="TrainingJobName (default: from the file, or generated).")
@click.option("--entry-point", help="Script mode: the training script.")
@click.option("--source-dir", help="Script mode: folder packed as sourcedir.tar.gz.")
@click.option("--image", help="A local folder with an executable 'train' (BYOC shape).")
@click.option("--hp", multiple=True, metavar="KEY=VALUE", help="A hyperparameter (repeatable).")
@click.option("--channel", multiple=True, metavar="NAME=S3URI|DIR", help="An input channel.")
@click.option("--output", metavar="S3URI", help="OutputDataConfig.S3OutputPath.")
@click.option("--metric", multiple=True, metavar="NAME=REGEX", help="A MetricDefinition.")
@click.option("--env", multiple=True, metavar="KEY=VALUE", help="An Environment variable.")
@click.option(
    "--tag",
    multiple=True,
    metavar="KEY=VALUE",
    help="A tag (repeatable); trainport:* tags set trainport's extensions.",
)
@click.option("--checkpoint", metavar="S3URI", help="CheckpointConfig.S3Uri.")
@click.option("--max-run", type=int, help="StoppingCondition.MaxRuntimeInSeconds.")
@click.option("--stop-grace", type=float, help="Seconds between SIGTERM and SIGKILL.")
@click.option("--instance-count", type=int, help="Hosts of the job (algo-1..N on this machine).")
@click.option(
    "--torchrun", is_flag=True, help="Script mode: run the entry with torchrun on every host."
)
@click.option(
    "--mpi", is_flag=True, help="Script mode: launch the entry with mpirun over every host."
)
@click.option("--mpi-options", metavar="OPTIONS", help="Extra mpirun options (with --mpi).")
@click.option("--processes-per-host", type=int, help="Processes per host for --torchrun or --mpi.")
@_runner_option
@click.option("--detach", is_flag=True, help="Return once the job is submitted.")
@_handle_errors
def run(
    job_file: Path | None,
    name: str | None,
    entry_point: str | None,
    source_dir: str | None,
    image: str | None,
    hp: tuple[str, ...],
    channel: tuple[str, ...],
    output: str | None,
    metric: tuple[str, ...],
    env: tuple[str, ...],
    tag: tuple[str, ...],
    checkpoint: str | None,
    max_run: int | None,
    stop_grace: float | None,
    instance_count: int | None,
    torchrun: bool,
    mpi: bool,
    mpi_options: str | None,
    processes_per_host: int | None,
    runner: str | None,
    detach: bool,
) -> None:
    """Submit a training job (a CreateTrainingJob request in YAML/JSON, or flags), stream
    its logs, and exit 0 if it Completed."""
    if job_file is None and not (entry_point or image):
        raise ValidationError("give a job file, or --entry-point (script mode) or --image")
    service = _service()
    from trainport.jobfile import build_request, discard_uploads, new_submission

    submission = new_submission()
    request = build_request(
        job_file,
        name=name,
        entry_point=entry_point,
        source_dir=source_dir,
        image=image,
        hps=hp,
        channels=channel,
        output=output,
        metrics=metric,
        env=env,
        tags=tag,
        checkpoint=checkpoint,
        max_run=max_run,
        stop_grace=stop_grace,
        store=service.store,
        instance_count=instance_count,
        torchrun=torchrun,
        mpi=mpi,
        mpi_options=mpi_options,
        processes_per_host=processes_per_host,
        submission=submission,
        check_name=functools.partial(_refuse_taken_name, service),
    )
    job = request["TrainingJobName"]
    try:
        arn = service.create(request, runner=runner)
    except TrainportError:
        # The code and folders this run uploaded are its own (see jobfile): drop them.
        discard_uploads(service.store, job, submission)
        raise
    if detach:
        click.echo(arn)
        return
    count = (request.get("ResourceConfig") or {}).get("InstanceCount", 1)
    if count > 1:
        _echo_err(
            f"[trainport] streaming algo-1's log; see the others with: trainport jobs logs {job} "
            "--host algo-K"
        )
    record = follow_job(service, job)
    _echo_err(_summary(record))
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing is left to clean up: skip the interpreter's teardown, which a user would
    # otherwise wait for after the job has ended.
    os._exit(0 if record.status == "Completed" else 1)


def _refuse_taken_name(service: Any, name: str) -> None:
    """Refuse a taken name before anything of this run is uploaded."""
    try:
        service.get(name)
    except NotFoundError:
        return
    raise ResourceInUseError(
        f"Training job {name!r} already exists; choose another TrainingJobName "
        "(names are unique, as in SageMaker)"
    )


@cli.group()
def jobs() -> None:
    """List, describe, stop and read the logs of jobs."""


@jobs.command("list")
@click.option(
    "--status", type=click.Choice(["InProgress", "Completed", "Failed", "Stopping", "Stopped"])
)
@click.option("--name-contains", help="Only jobs whose name contains this.")
@click.option("--limit", type=int, default=50, show_default=True)
@_handle_errors
def list_jobs(status: str | None, name_contains: str | None, limit: int) -> None:
    """Jobs, newest first."""
    from trainport.jobs.db import ListQuery

    records = _service().list(
        ListQuery(name_contains=name_contains, status_equals=status, limit=limit)
    )
    rows = [("NAME", "STATUS", "SECONDARY", "CREATED", "DURATION")]
    for r in records:
        end = r.training_end_time or (time.time() if not r.training_end_time else 0)
        rows.append(
            (
                r.name,
                r.status,
                r.secondary_status,
                _fmt_time(r.creation_time),
                f"{end - r.creation_time:.1f}s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@jobs.command()
@click.argument("name")
@_handle_errors
def describe(name: str) -> None:
    """Print the DescribeTrainingJob JSON."""
    click.echo(json.dumps(_service().describe(name), indent=2))


@jobs.command()
@click.argument("name")
@click.option("--wait/--no-wait", default=False, help="Wait until the job has stopped.")
@_handle_errors
def stop(name: str, wait: bool) -> None:
    """Stop a job: SIGTERM, the grace period, then SIGKILL."""
    service = _service()
    record = service.stop(name)
    _echo_err(f"{name}: {record.status} ({record.secondary_status})")
    while wait and record.status not in ("Completed", "Failed", "Stopped"):
        time.sleep(0.2)
        record = service.get(name)
    if wait:
        _echo_err(_summary(record))


@jobs.command()
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@click.option("--timestamps", is_flag=True, help="Prefix each line with its time.")
@click.option("--host", default="algo-1", show_default=True, help="Which host's log.")
@_handle_errors
def logs(name: str, follow: bool, timestamps: bool, host: str) -> None:
    """Print a job's log (one host's)."""
    for ts, text in _service().logs(name, follow=follow, host=host):
        click.echo(f"{_fmt_time(ts)} {text}" if timestamps else text)


@cli.command()
@click.option("--epochs", default=5, show_default=True)
@_runner_option
@_handle_errors
def demo(epochs: int, runner: str | None) -> None:
    """Train a small PyTorch model on a generated dataset, on this machine."""
    from trainport.demo import run_demo

    sys.exit(run_demo(epochs=epochs, runner=runner))


class _LazySelect(click.Command):
    """``trainport select``, imported only when used: model selection pulls in torch and
    its backends, which every other command would otherwise pay for at start-up."""

    def _real(self) -> click.Command:
        from trainport.select.cli import select_command

        return select_command

    def get_help(self, ctx: click.Context) -> str:
        return self._real().get_help(ctx)

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> click.Context:
        return self._real().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        return self._real().invoke(ctx)


cli.add_command(_LazySelect("select", help="Model selection with model hopper parallelism."))
cli.add_command(tune_command)
cli.add_command(tuning_group)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port (0: any free port).")
@click.option("--max-jobs", type=int, help="Concurrent jobs (TRAINPORT_MAX_CONCURRENT_JOBS).")
@click.option("--no-auth", is_flag=True, help="Accept unsigned requests (NOT for shared hosts).")
@_handle_errors
def server(host: str, port: int, max_jobs: int | None, no_auth: bool) -> None:
    """Serve the SageMaker training API (boto3: endpoint_url=...) and a dashboard."""
    from trainport.server.app import ServerConfig, build_server

    logging.getLogger("trainport").setLevel(logging.INFO)
    config = ServerConfig(host=host, port=port, auth=not no_auth, max_concurrent_jobs=max_jobs)
    srv = build_server(config)
    if srv.created_key is not None:
        _echo_err(
            "Created an access key for this server (shown once; kept in "
            f"{srv.service.settings.server_keys_path}):\n"
            f"  AWS_ACCESS_KEY_ID={srv.created_key.key_id}\n"
            f"  AWS_SECRET_ACCESS_KEY={srv.created_key.secret}"
        )
    _echo_err(f"trainport server on {srv.url} (boto3: endpoint_url='{srv.url}')")
    _echo_err(f"dashboard: {srv.dashboard_url()}")
    srv.scheduler.start()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        srv.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        _echo_err("trainport server: shutting down (running jobs keep running)")
    finally:
        srv.server_close()
        srv.scheduler.close()


def main() -> None:
    cli(prog_name="trainport")


if __name__ == "__main__":
    main()
