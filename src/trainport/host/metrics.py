"""MetricDefinitions: regexes that turn training log lines into metric points.

A Regex comes from the request, so it may backtrack for ever on some line (``(a+)+$``
against ``aaaa...b``), and Python's ``re`` holds the GIL while it matches: run in the
supervisor, one such match would stall log capture, stop and MaxRuntimeInSeconds. So
:class:`MetricMatcher` matches in a child process (``python -m trainport.host.metrics``)
fed one line at a time through a pipe. The child gives each line a CPU-time budget with a
kernel timer whose default action ends the process, so a runaway match ends it even if
nobody is reading; the parent sees the pipe close, logs a warning and matches no more
lines for that job. Metrics are best-effort; logs, stop and the job's end are not:
:meth:`feed` never waits, lines arriving faster than they can be matched are left
unmatched, and :meth:`close` gives what is still queued at most :data:`END_GRACE_SECONDS`
(lines each just under the budget would otherwise hold the job's end for as long as the
backlog takes), leaving the rest unmatched with one warning in the job's log.

Pipe protocol, one JSON document per line: parent -> child the definitions
(``[[name, regex], ...]``), then each log line as a string; child -> parent ``"ready"``
once the regexes are compiled, then for each line the list of ``[name, value]`` it held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
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
from trainport.host.phases import MetricPoint

__all__ = ["END_GRACE_SECONDS", "MATCH_BUDGET_SECONDS", "MetricMatcher", "MetricParser"]

log = logging.getLogger(__name__)

#: CPU seconds one log line may take to match against every definition.
MATCH_BUDGET_SECONDS = 1.0
#: Wall seconds the job's end leaves the matcher for the lines still queued.
END_GRACE_SECONDS = 2.0
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

    ``on_points`` receives batches of points (from a thread of this object); ``on_warning``
    receives a sentence for the job's log when lines go unmatched: once if matching stops
    for good, and once at :meth:`close` for the lines it left.
    """

    def __init__(
        self,
        definitions: Sequence[tuple[str, str]],
        *,
        on_points: Callable[[list[MetricPoint]], None],
        on_warning: Callable[[str], None],
        budget: float = MATCH_BUDGET_SECONDS,
        end_grace: float = END_GRACE_SECONDS,
    ) -> None:
        self.definitions = list(definitions)
        self.on_points = on_points
        self.on_warning = on_warning
        self.budget = budget
        self.end_grace = end_grace
        # Unbounded, so that close() can always queue its end; feed() keeps the bound.
        self._lines: queue.Queue[tuple[str, float] | None] = queue.Queue()
        self._disabled = threading.Event()
        self._closing = threading.Event()
        self._end_by = math.inf  # when close() stops matching (monotonic seconds)
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.Lock()  # the worker starts it, close() may end it
        self._abandoned = False
        self._buffer = b""
        self._too_fast = 0  # lines refused with the backlog full
        self._left = 0  # lines still queued when the job ended

    def __bool__(self) -> bool:
        return bool(self.definitions)

    def feed(self, line: str, timestamp: float) -> None:
        """Queue ``line`` for matching; never waits."""
        if not self.definitions or self._disabled.is_set() or self._closing.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="metric-matcher", daemon=True)
            self._thread.start()
        if self._lines.qsize() >= _BACKLOG:
            self._too_fast += 1
            return
        self._lines.put_nowait((line, timestamp))

    def close(self) -> None:
        """Hand on the points matched within :attr:`end_grace` seconds and end the matcher
        process; lines still queued then are left unmatched, with one warning."""
        if self._thread is None:
            return
        self._end_by = time.monotonic() + self.end_grace
        self._closing.set()
        self._lines.put_nowait(None)
        self._thread.join(self.end_grace)
        if self._thread.is_alive():
            self._abandon()  # mid-match on a slow line: its reply would come too late
            self._thread.join()
        unmatched = self._too_fast + self._left
        if unmatched and not self._disabled.is_set():
            self._warn(
                f"metrics: {unmatched} log lines were not matched against MetricDefinitions "
                f"({self._too_fast} came faster than they could be matched, {self._left} "
                "were still waiting when the job ended); simplify the Regex if each line "
                "takes long (nested repetition such as (a+)+ can take exponential time)"
            )

    # -- the worker thread ----------------------------------------------------------------

    def _work(self) -> None:
        pending: list[MetricPoint] = []
        last_flush = time.monotonic()
        try:
            self._start()
            while (item := self._lines.get()) is not None:
                if self._disabled.is_set():
                    continue  # drain: nothing more is matched
                if time.monotonic() >= self._end_by:
                    self._left += 1 + self._drop_queued()
                    break
                line, timestamp = item
                try:
                    found = self._match(line)
                except _Gone as exc:
                    if self._abandoned:  # close() ended it: this line was left, not runaway
                        self._left += 1 + self._drop_queued()
                        break
                    self._disable(str(exc), line)
                    continue
                pending += [MetricPoint(name, value, timestamp) for name, value in found]
                if pending and time.monotonic() - last_flush > _FLUSH_EVERY:
                    self.on_points(pending)
                    pending, last_flush = [], time.monotonic()
        except _Gone as exc:
            if self._abandoned:
                self._left += self._drop_queued()
            else:
                self._disable(str(exc), None)
        finally:
            if pending:
                self.on_points(pending)
            self._stop_process()

    def _drop_queued(self) -> int:
        """Empty the queue; how many lines it held."""
        dropped = 0
        with contextlib.suppress(queue.Empty):
            while True:
                if self._lines.get_nowait() is not None:
                    dropped += 1
        return dropped

    def _start(self) -> None:
        with self._proc_lock:
            if self._abandoned:
                raise _Gone("the job ended before the metric matcher started")
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "trainport.host.metrics", str(self.budget)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        self._send(self.definitions)
        if self._reply(self.budget + _SLACK) != "ready":
            raise _Gone("the metric matcher process did not start")

    def _abandon(self) -> None:
        """End the matcher process from close(): the worker's wait for a reply ends."""
        with self._proc_lock:
            self._abandoned = True
            if self._proc is not None:
                with contextlib.suppress(OSError):
                    self._proc.kill()

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
        self._warn(
            f"metrics disabled for the rest of the job: a MetricDefinitions Regex took more "
            f"than {self.budget:g} s of CPU{shown} ({why}); simplify the Regex (nested "
            "repetition such as (a+)+ can take exponential time)"
        )

    def _warn(self, message: str) -> None:
        log.warning("%s", message)
        self.on_warning(message)

    def _stop_process(self) -> None:
        with self._proc_lock:
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
