"""``trainport tune job.yaml`` and ``trainport tuning list|describe|stop``.

A tuning job file holds a CreateHyperParameterTuningJob body (YAML or JSON), as a job file
holds a CreateTrainingJob body for ``trainport run``. With ``--endpoint`` (or
TRAINPORT_ENDPOINT) the commands talk to a server, whose driver runs the tuning job;
without, ``tune`` drives it from this process until it ends, with a progress bar (Ctrl-C
stops it), and a later ``tune --resume NAME`` or a server on the same TRAINPORT_HOME takes
over one whose driver was killed. Both sides answer in the API's shapes, so the printing
is shared.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import click

from trainport.errors import TrainportError, ValidationError

__all__ = ["tune_command", "tuning_group"]

_TERMINAL = ("Completed", "Failed", "Stopped")
_RECONCILE_EVERY = 1.0  # seconds


class _Tunings(Protocol):
    def create(self, request: dict[str, Any]) -> str: ...
    def describe(self, name: str) -> dict[str, Any]: ...
    def children(self, name: str) -> list[dict[str, Any]]: ...
    def list(self, status: str | None, limit: int) -> list[dict[str, Any]]: ...
    def stop(self, name: str) -> None: ...
    def advance(self, name: str) -> None: ...


class _Local:
    """Tuning jobs of this machine's TRAINPORT_HOME, driven from this process."""

    def __init__(self) -> None:
        from trainport.jobs.service import JobService
        from trainport.tuning.driver import TuningDriver
        from trainport.tuning.service import TuningService

        # Single-threaded: each child's supervisor may be forked from this process.
        jobs = JobService(launch="fork")
        self.service = TuningService(jobs)
        self.driver = TuningDriver(self.service)
        self._reconciled = 0.0

    def create(self, request: dict[str, Any]) -> str:
        return self.service.create(request)

    def describe(self, name: str) -> dict[str, Any]:
        return self.service.describe(name)

    def children(self, name: str) -> list[dict[str, Any]]:
        record = self.service.get(name)
        views = self.service.views(record, planned=False)
        return [self.service.child_summary(record, v) for v in views]

    def list(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        from trainport.tuning.store import TuningQuery

        query = TuningQuery(status_equals=status, sort_by="CreationTime", sort_order="Descending")
        return [self.service.summary(r) for r in self.service.list_jobs(query)[:limit]]

    def stop(self, name: str) -> None:
        self.service.stop(name)

    def advance(self, name: str) -> None:
        # No scheduler runs here to end the jobs whose supervisor died (a child whose
        # creation a killed `tune` left half done): reconcile as a server's does.
        if time.monotonic() - self._reconciled > _RECONCILE_EVERY:
            self.service.jobs.reconcile()
            self._reconciled = time.monotonic()
        self.driver.step(only=name)
        time.sleep(self.driver.interval)


class _Remote:
    """Tuning jobs of a server, driven by it."""

    def __init__(self, endpoint: str) -> None:
        from trainport.client import RemoteJobService

        self.remote = RemoteJobService(endpoint)

    def create(self, request: dict[str, Any]) -> str:
        response = self.remote.sagemaker("create_hyper_parameter_tuning_job", **request)
        return str(response["HyperParameterTuningJobArn"])

    def describe(self, name: str) -> dict[str, Any]:
        return self.remote.sagemaker(
            "describe_hyper_parameter_tuning_job", HyperParameterTuningJobName=name
        )

    def children(self, name: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        extra: dict[str, Any] = {}
        while True:
            page = self.remote.sagemaker(
                "list_training_jobs_for_hyper_parameter_tuning_job",
                HyperParameterTuningJobName=name,
                MaxResults=100,
                **extra,
            )
            out += page["TrainingJobSummaries"]
            if not page.get("NextToken"):
                return out
            extra = {"NextToken": page["NextToken"]}

    def list(self, status: str | None, limit: int) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"MaxResults": limit, "SortBy": "CreationTime"}
        params["SortOrder"] = "Descending"
        if status:
            params["StatusEquals"] = status
        page = self.remote.sagemaker("list_hyper_parameter_tuning_jobs", **params)
        summaries: list[dict[str, Any]] = page["HyperParameterTuningJobSummaries"]
        return summaries

    def stop(self, name: str) -> None:
        self.remote.sagemaker("stop_hyper_parameter_tuning_job", HyperParameterTuningJobName=name)

    def advance(self, name: str) -> None:
        time.sleep(0.5)


def _tunings() -> _Tunings:
    from trainport.config import load_settings

    ctx = click.get_current_context(silent=True)
    endpoint = ctx.find_root().params.get("endpoint") if ctx is not None else None
    endpoint = endpoint or load_settings().endpoint
    return _Remote(endpoint) if endpoint else _Local()


def _fail(exc: TrainportError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


def _load(path: Path) -> dict[str, Any]:
    from trainport.yamldoc import load_yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise ValidationError(f"cannot read the tuning job file {path}: {exc.strerror}") from exc
    try:
        doc = json.loads(text) if path.suffix == ".json" else load_yaml(text, str(path))
    except ValueError as exc:
        raise ValidationError(f"the tuning job file {path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValidationError(
            f"the tuning job file {path} must hold a mapping of CreateHyperParameterTuningJob "
            "fields (HyperParameterTuningJobName, HyperParameterTuningJobConfig, ...)"
        )
    return doc


def _best_text(d: dict[str, Any]) -> str:
    best = d.get("BestTrainingJob")
    if not best:
        return "no objective yet"
    metric = best["FinalHyperParameterTuningJobObjectiveMetric"]
    return f"best {metric['MetricName']}={metric['Value']:g} ({best['TrainingJobName']})"


def _follow(tunings: _Tunings, name: str) -> dict[str, Any]:
    """Drive or watch the tuning job until it ends, with a progress bar of its children;
    the first Ctrl-C stops it, a second leaves it."""
    from tqdm import tqdm

    interrupted = 0

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted += 1
        if interrupted > 1:
            raise KeyboardInterrupt
        click.echo(f"\n[trainport] stopping {name} (Ctrl-C again to leave it)", err=True)
        tunings.stop(name)

    original = signal.signal(signal.SIGINT, on_interrupt)
    d = tunings.describe(name)
    total = d["HyperParameterTuningJobConfig"]["ResourceLimits"].get("MaxNumberOfTrainingJobs")
    bar = tqdm(total=total, desc=name, unit="job", file=sys.stderr, dynamic_ncols=True)
    try:
        while d["HyperParameterTuningJobStatus"] not in _TERMINAL:
            tunings.advance(name)
            d = tunings.describe(name)
            counters = d["TrainingJobStatusCounters"]
            ended = sum(v for k, v in counters.items() if k != "InProgress")
            bar.update(ended - bar.n)
            bar.set_postfix_str(f"{counters['InProgress']} running, {_best_text(d)}")
    finally:
        bar.close()
        signal.signal(signal.SIGINT, original)
    return d


def _print_outcome(d: dict[str, Any]) -> None:
    c = d["TrainingJobStatusCounters"]
    click.echo(
        f"{d['HyperParameterTuningJobName']}: {d['HyperParameterTuningJobStatus']}; "
        f"{c['Completed']} completed, {c['Stopped']} stopped, {c['NonRetryableError']} failed; "
        f"{_best_text(d)}"
    )
    best = d.get("BestTrainingJob")
    if best:
        click.echo(f"  best values: {json.dumps(best['TunedHyperParameters'], sort_keys=True)}")
    if d.get("FailureReason"):
        click.echo(f"  {d['FailureReason']}")


@click.command("tune")
@click.argument("job_file", required=False, type=click.Path(path_type=Path))
@click.option("--name", help="HyperParameterTuningJobName (default: from the file).")
@click.option("--resume", metavar="NAME", help="Drive an unfinished tuning job again.")
@click.option("--detach", is_flag=True, help="Return once it is created (needs a server).")
def tune_command(job_file: Path | None, name: str | None, resume: str | None, detach: bool) -> None:
    """Run a hyperparameter tuning job from a CreateHyperParameterTuningJob file."""
    try:
        tunings = _tunings()
        if resume:
            name = resume
        else:
            if job_file is None:
                raise ValidationError("give a tuning job file, or --resume NAME")
            request = _load(job_file)
            if name:
                request["HyperParameterTuningJobName"] = name
            name = str(request.get("HyperParameterTuningJobName", ""))
            if detach and isinstance(tunings, _Local):
                raise ValidationError(
                    "--detach needs a server to drive the tuning job (--endpoint URL); "
                    "without one, trainport tune drives it until it ends"
                )
            arn = tunings.create(request)
            click.echo(f"[trainport] created {arn}", err=True)
            if detach:
                return
        d = _follow(tunings, name)
    except TrainportError as exc:
        _fail(exc)
        return
    _print_outcome(d)
    sys.exit(0 if d["HyperParameterTuningJobStatus"] == "Completed" else 1)


@click.group("tuning")
def tuning_group() -> None:
    """Look at hyperparameter tuning jobs, and stop them."""


@tuning_group.command("list")
@click.option(
    "--status", type=click.Choice(["InProgress", "Completed", "Failed", "Stopping", "Stopped"])
)
@click.option("--limit", type=int, default=50, show_default=True)
def list_command(status: str | None, limit: int) -> None:
    """Tuning jobs, newest first."""
    try:
        summaries = _tunings().list(status, limit)
    except TrainportError as exc:
        _fail(exc)
        return
    for s in summaries:
        c = s["TrainingJobStatusCounters"]
        click.echo(
            f"{s['HyperParameterTuningJobName']:<34} {s['HyperParameterTuningJobStatus']:<11} "
            f"{s['Strategy']:<10} {c['Completed']} completed, {c['InProgress']} running, "
            f"{c['Stopped']} stopped, {c['NonRetryableError']} failed"
        )


@tuning_group.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="The whole DescribeHyperParameterTuningJob.")
def describe_command(name: str, as_json: bool) -> None:
    """A tuning job, its best child, and each child's values and objective."""
    try:
        tunings = _tunings()
        d = tunings.describe(name)
        kids = tunings.children(name)
    except TrainportError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps({**d, "TrainingJobSummaries": kids}, indent=2, default=str))
        return
    _print_outcome(d)
    for k in sorted(kids, key=lambda k: k["TrainingJobName"]):
        metric = k.get("FinalHyperParameterTuningJobObjectiveMetric")
        value = f"{metric['Value']:g}" if metric else "-"
        click.echo(
            f"  {k['TrainingJobName']:<46} {k['TrainingJobStatus']:<10} {value:>12}  "
            f"{json.dumps(k['TunedHyperParameters'], sort_keys=True)}"
        )


@tuning_group.command("stop")
@click.argument("name")
@click.option("--wait/--no-wait", default=True, help="Wait until every child has stopped.")
def stop_command(name: str, wait: bool) -> None:
    """Stop a tuning job and every child it runs."""
    try:
        tunings = _tunings()
        tunings.stop(name)
        d = _follow(tunings, name) if wait else tunings.describe(name)
    except TrainportError as exc:
        _fail(exc)
        return
    click.echo(f"{name}: {d['HyperParameterTuningJobStatus']}")
