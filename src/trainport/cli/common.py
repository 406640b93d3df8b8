"""What every command of the ``trainport`` CLI shares: the jobs service it talks to, how an
error prints, and how a time reads."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from trainport.errors import TrainportError

__all__ = ["echo_err", "fmt_time", "handle_errors", "runner_option", "service"]

F = TypeVar("F", bound=Callable[..., Any])


def service() -> Any:
    """The jobs service: a running server's (``--endpoint``/TRAINPORT_ENDPOINT), else local."""
    from trainport.config import load_settings

    ctx = click.get_current_context(silent=True)
    root = ctx.find_root().params if ctx is not None else {}
    settings = load_settings()
    endpoint = root.get("endpoint") or settings.endpoint
    if endpoint:
        from trainport.client import RemoteJobService

        return RemoteJobService(
            endpoint, settings, aws_credentials=bool(root.get("aws_credentials"))
        )
    from trainport.jobs.service import JobService

    # The CLI is single-threaded when it submits, so supervisors can be forked from it:
    # that saves each job a whole Python start-up.
    return JobService(settings, launch="fork")


def echo_err(text: str) -> None:
    sys.stdout.flush()  # keep log lines (stdout) and status lines (stderr) in order when piped
    click.echo(text, err=True)


def fmt_time(ts: float | None) -> str:
    """A time as people read it, in this machine's zone; "-" for none."""
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h01m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def handle_errors(fn: F) -> F:
    """Errors trainport raises on purpose print as one line, exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TrainportError as exc:
            echo_err(f"error: {exc}")
            sys.exit(2)

    return wrapper  # type: ignore[return-value]


# Where the job's code runs; said the same way by every command that starts a job.
runner_option = click.option(
    "--runner",
    type=click.Choice(["auto", "sandbox", "process", "ray"]),
    default=None,
    help="sandbox: the job sees only its own /opt/ml; process: NO isolation, the job can read "
    "and change all that you can (TRAINPORT_HOME included), for trusted code only; auto: the "
    "sandbox where this machine can make one; ray: each host on its own node of the Ray "
    "cluster RAY_ADDRESS names, contained as auto would there.",
)
