"""Following a job at the terminal: its status lines (stderr) and its log (stdout), in the
order they happened, until it ends.

Below the CLI, so the commands (``trainport run``, ``jobs logs``) and the demo follow a job
the same way without importing each other.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import click

from trainport.errors import DatabaseError

__all__ = ["echo_err", "follow_job", "summary"]

# How often the job's record is read while its log is followed.
_STATUS_EVERY = 0.2
# How long a line of the job's own output waits for the record to say Training: the host
# reports its phase through the supervisor, which may record it a moment after the job's
# first line is in the log. Bounded, and spent at most once in each phase: lines that come
# before Training (a requirements build's) are held back once, not each.
_TRAINING_WAIT = 3.0


def echo_err(text: str) -> None:
    sys.stdout.flush()  # keep log lines (stdout) and status lines (stderr) in order when piped
    click.echo(text, err=True)


def summary(record: Any) -> str:
    lines = [f"Job {record.name}: {record.status} ({record.secondary_status})"]
    if record.failure_reason:
        lines.append(f"  FailureReason: {record.failure_reason}")
    for m in record.final_metrics:
        lines.append(f"  {m.name} = {m.value:g}")
    if record.model_artifacts:
        lines.append(f"  Model artifact: {record.model_artifacts}")
        local = local_path(record.model_artifacts)
        if local:
            lines.append(f"    (on disk: {local})")
    return "\n".join(lines)


def local_path(uri: str) -> str | None:
    from trainport.config import load_settings

    settings = load_settings()
    if settings.store_kind != "local" or not uri.startswith("s3://"):
        return None
    return str(settings.store_root / uri[len("s3://") :])


def _training_reached(record: Any) -> bool:
    from trainport.jobs.status import Status

    return Status(record.status).terminal or any(t.status == "Training" for t in record.transitions)


class _StatusLines:
    """Prints each new transition, and news within a phase, once."""

    def __init__(self, service: Any, name: str) -> None:
        self.service = service
        self.name = name
        self.seen = 0
        self.last_message = ""
        self.record: Any = None
        self.checked = 0.0
        self.waited_in: str | None = None  # the phase a line last waited in
        # On a terminal, news within a phase (a download's or a pull's progress) redraws
        # one line in place instead of adding a line each time.
        self.in_place = sys.stderr.isatty()
        self.open_line = False

    def end_line(self) -> None:
        """End a line drawn in place, before anything else is printed."""
        if self.open_line:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.open_line = False

    def refresh(self) -> None:
        try:
            record = self.service.get(self.name)
        except DatabaseError:
            # A full disk, say: the job's supervisor makes room to record its end, and the
            # log goes on meanwhile.
            self.checked = time.monotonic()
            return
        for t in record.transitions[self.seen :]:
            self.end_line()
            echo_err(f"[trainport] {t.status}: {t.message}")
            self.last_message = t.message
        self.seen = len(record.transitions)
        if record.status_message != self.last_message:  # progress within a phase
            news = f"[trainport] {record.secondary_status}: {record.status_message}"
            if self.in_place:
                sys.stdout.flush()
                sys.stderr.write(f"\r\x1b[K{news}")  # back to the line's start, cleared
                sys.stderr.flush()
                self.open_line = True
            else:
                echo_err(news)
            self.last_message = record.status_message
        self.record = record
        self.checked = time.monotonic()

    def before_output(self) -> None:
        """Make sure the Training line is out before a line of the job's own output."""
        if self.record is not None and (
            _training_reached(self.record) or self.waited_in == self.record.secondary_status
        ):
            return
        if self.record is not None:
            self.waited_in = self.record.secondary_status
        deadline = time.monotonic() + _TRAINING_WAIT
        while True:
            self.refresh()
            if (self.record is not None and _training_reached(self.record)) or (
                time.monotonic() > deadline
            ):
                return
            time.sleep(0.02)


def follow_job(service: Any, name: str, *, stop_on_interrupt: bool = True) -> Any:
    """Stream a job's status changes (stderr) and log lines (stdout) until it ends; the
    status lines of a phase come before the lines the job printed in it."""
    from trainport.jobs.status import Status

    status = _StatusLines(service, name)
    interrupted = 0
    original = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted += 1
        if interrupted == 1 and stop_on_interrupt:
            status.end_line()
            echo_err(f"[trainport] stopping {name} (Ctrl-C again to leave it running)")
            service.stop(name)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        lines = service.logs(name, follow=True, poll=0.05)
        while True:
            if time.monotonic() - status.checked > _STATUS_EVERY:
                status.refresh()
            try:
                _, text = next(lines)
            except StopIteration:
                break
            if not text.startswith("[trainport]"):  # trainport's own lines come earlier
                status.before_output()
            status.end_line()
            click.echo(text)
        status.refresh()
        record = status.record if status.record is not None else service.get(name)
        assert Status(record.status).terminal  # the log ends only once the job has
        return record
    finally:
        status.end_line()
        signal.signal(signal.SIGINT, original)
