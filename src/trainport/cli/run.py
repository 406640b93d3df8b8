"""``trainport run`` and ``trainport demo``: submit a job, follow it to its end."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

import click

from trainport.cli.common import echo_err, handle_errors, runner_option, service
from trainport.errors import NotFoundError, ResourceInUseError, TrainportError, ValidationError
from trainport.follow import follow_job, summary

__all__ = ["demo", "run"]


@click.command()
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
@runner_option
@click.option("--detach", is_flag=True, help="Return once the job is submitted.")
@handle_errors
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
    jobs = service()
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
        store=jobs.store,
        instance_count=instance_count,
        torchrun=torchrun,
        mpi=mpi,
        mpi_options=mpi_options,
        processes_per_host=processes_per_host,
        submission=submission,
        check_name=functools.partial(_refuse_taken_name, jobs),
    )
    job = request["TrainingJobName"]
    try:
        arn = jobs.create(request, runner=runner)
    except TrainportError:
        # The code and folders this run uploaded are its own (see jobfile): drop them.
        discard_uploads(jobs.store, job, submission)
        raise
    if detach:
        click.echo(arn)
        return
    count = (request.get("ResourceConfig") or {}).get("InstanceCount", 1)
    if count > 1:
        echo_err(
            f"[trainport] streaming algo-1's log; see the others with: trainport jobs logs {job} "
            "--host algo-K"
        )
    record = follow_job(jobs, job)
    echo_err(summary(record))
    sys.stdout.flush()
    sys.stderr.flush()
    # Nothing is left to clean up: skip the interpreter's teardown, which a user would
    # otherwise wait for after the job has ended.
    os._exit(0 if record.status == "Completed" else 1)


def _refuse_taken_name(jobs: Any, name: str) -> None:
    """Refuse a taken name before anything of this run is uploaded."""
    try:
        jobs.get(name)
    except NotFoundError:
        return
    raise ResourceInUseError(
        f"Training job {name!r} already exists; choose another TrainingJobName "
        "(names are unique, as in SageMaker)"
    )


@click.command()
@click.option("--epochs", default=5, show_default=True)
@runner_option
@handle_errors
def demo(epochs: int, runner: str | None) -> None:
    """Train a small PyTorch model on a generated dataset, on this machine."""
    from trainport.demo import run_demo

    sys.exit(run_demo(epochs=epochs, runner=runner))
