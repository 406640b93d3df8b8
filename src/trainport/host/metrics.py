"""MetricDefinitions: regexes that turn training log lines into metric points.

A Regex comes from the request, so it may backtrack for ever on some line (``(a+)+$``
against ``aaaa...b``), and Python's ``re`` holds the GIL while it matches: run in the
supervisor, one such match would stall log capture, stop and MaxRuntimeInSeconds. So
:class:`MetricMatcher` matches in a child process (``python -m trainport.host.metrics``)
fed one line at a time through a pipe. The child gives each line a CPU-time budget with a
kernel timer whose default action ends the process, so a runaway match ends it even if
nobody is reading; the parent sees the pipe close, logs a warning and matches no more
lines for that job. Metrics are best-effort; logs and stop are not: :meth:`feed` never
waits, and lines arriving faster than they can be matched are left unmatched.

Pipe protocol, one JSON document per line: parent -> child the definitions
(``[[name, regex], ...]``), then each log line as a string; child -> parent ``"ready"``
once the regexes are compiled, then for each line the list of ``[name, value]`` it held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from trainport.errors import ValidationError
from trainport.jobs.records import MetricPoint

__all__ = ["MATCH_BUDGET_SECONDS", "MetricMatcher", "MetricParser"]

log = logging.getLogger(__name__)

#: CPU seconds one log line may take to match against every definition.
MATCH_BUDGET_SECONDS = 1.0
_FLUSH_EVERY = 0.5  # seconds between batches of points handed on
_BACKLOG = 10_000  # lines waiting to be matched; more are left unmatched
_SLACK = 30.0  # wall seconds over the budget before the parent gives up on a reply


class MetricParser:
    """The matching itself: pure, used inside the matcher process."""

    def __init__(self, definitions: Sequence[tuple[str, str]]) -> None:
        self._rules: list[tuple[str, re.Pattern[str]]] = []
        for name, regex in definitions:
            try:
                self._rules.append((name, re.compile(regex)))
            except re.error as exc:
                raise ValidationError(
                    f"MetricDefinitions {name!r}: the Regex {regex!r} does not compile: {exc}"
                ) from exc

    def __bool__(self) -> bool:
        return bool(self._rules)

    def values(self, line: str) -> list[tuple[str, float]]:
        """Every (metric, value) the definitions find in ``line``, in definition order."""
        found = []
        for name, rule in self._rules:
            for match in rule.finditer(line):
                raw = match.group(1) if rule.groups else match.group(0)
                try:
                    value = float(raw)
                except (TypeError, ValueError):
                    continue
                if value == value:  # NaN is not a metric value SageMaker would record
                    found.append((name, value))
        return found

    def parse(self, line: str, timestamp: float) -> list[MetricPoint]:
        return [MetricPoint(name, value, timestamp) for name, value in self.values(line)]


class _Gone(Exception):
    """The matcher process ended or stopped answering."""


class MetricMatcher:
    """Metric points from log lines, matched in a child process; see the module docstring.

    ``on_points`` receives batches of points (from a thread of this object);
    ``on_disabled`` receives one sentence when matching stops for good.
    """

    def __init__(
        self,
        definitions: Sequence[tuple[str, str]],
        *,
        on_points: Callable[[list[MetricPoint]], None],
        on_disabled: Callable[[str], None],
        budget: float = MATCH_BUDGET_SECONDS,
    ) -> None:
        self.definitions = list(definitions)
        self.on_points = on_points
        self.on_disabled = on_disabled
        self.budget = budget
        self._lines: queue.Queue[tuple[str, float] | None] = queue.Queue(_BACKLOG)
        self._disabled = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._skipped = 0

    def __bool__(self) -> bool:
        return bool(self.definitions)

    def feed(self, line: str, timestamp: float) -> None:
        """Queue ``line`` for matching; never waits."""
        if not self.definitions or self._disabled.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="metric-matcher", daemon=True)
            self._thread.start()
        try:
            self._lines.put_nowait((line, timestamp))
        except queue.Full:
            self._skipped += 1

    def close(self) -> None:
        """Match what is queued, hand on the last points, and end the matcher process."""
        if self._thread is None:
            return
        self._lines.put(None)
        self._thread.join()
        if self._skipped:
            log.warning("%d log lines came too fast to be matched for metrics", self._skipped)

    # -- the worker thread ----------------------------------------------------------------

    def _work(self) -> None:
        pending: list[MetricPoint] = []
        last_flush = time.monotonic()
        try:
            self._start()
            while (item := self._lines.get()) is not None:
                if self._disabled.is_set():
                    continue  # drain: nothing more is matched
                line, timestamp = item
                try:
                    found = self._match(line)
                except _Gone as exc:
                    self._disable(str(exc), line)
                    continue
                pending += [MetricPoint(name, value, timestamp) for name, value in found]
                if pending and time.monotonic() - last_flush > _FLUSH_EVERY:
                    self.on_points(pending)
                    pending, last_flush = [], time.monotonic()
        except _Gone as exc:
            self._disable(str(exc), None)
        finally:
            if pending:
                self.on_points(pending)
            self._stop_process()

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "trainport.host.metrics", str(self.budget)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._send(self.definitions)
        if self._reply(self.budget + _SLACK) != "ready":
            raise _Gone("the metric matcher process did not start")

    def _match(self, line: str) -> list[tuple[str, float]]:
        self._send(line)
        reply = self._reply(self.budget + _SLACK)
        if not isinstance(reply, list):
            raise _Gone(f"the metric matcher answered {reply!r}")
        return [(str(name), float(value)) for name, value in reply]

    def _send(self, doc: object) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(doc).encode() + b"\n")
            self._proc.stdin.flush()
        except OSError as exc:  # BrokenPipeError: it ended on the previous line
            raise _Gone("the metric matcher process ended") from exc

    def _reply(self, timeout: float) -> object:
        """The next reply line, waiting at most ``timeout`` seconds of wall time."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Gone(f"the metric matcher gave no answer within {timeout:.0f} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Gone("the metric matcher process ended")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(raw)

    def _disable(self, why: str, line: str | None) -> None:
        self._disabled.set()
        shown = "" if line is None else f" on the log line {line[:80]!r}"
        message = (
            f"metrics disabled for the rest of the job: a MetricDefinitions Regex took more "
            f"than {self.budget:g} s of CPU{shown} ({why}); simplify the Regex (nested "
            "repetition such as (a+)+ can take exponential time)"
        )
        log.warning("%s", message)
        self.on_disabled(message)

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # EOF: it exits on its own
        try:
            proc.wait(timeout=self.budget + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serve(budget: float, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The matcher process: answer each line, ended by the kernel if a line overruns."""
    parser = MetricParser([(str(n), str(r)) for n, r in json.loads(stdin.readline())])
    # SIGVTALRM's default action ends the process: a match that holds the CPU past the
    # budget cannot be interrupted from Python (``re`` never returns to the interpreter),
    # but the kernel can end it. CPU time, not wall time, so a loaded machine is no reason.
    signal.signal(signal.SIGVTALRM, signal.SIG_DFL)
    stdout.write(b'"ready"\n')
    stdout.flush()
    for raw in stdin:
        line = json.loads(raw)
        signal.setitimer(signal.ITIMER_VIRTUAL, budget)
        found = parser.values(line)
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        stdout.write(json.dumps(found).encode() + b"\n")
        stdout.flush()


if __name__ == "__main__":
    _serve(float(sys.argv[1]), sys.stdin.buffer, sys.stdout.buffer)
