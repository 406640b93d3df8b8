"""Per-rank byte counters and a communication timeline in Chrome trace format.

The counters are the bytes each reduction algorithm puts on (and takes off) the wire for
this rank, computed from the collectives it issues; the tests check them against the
kernel's own count of bytes this process wrote to sockets (``/proc/self/io``).

The timeline records, per gradient bucket, when DDP handed it over (instant event
``ready``) and when the communication thread started and finished reducing it (complete
event ``reduce``). Timestamps are wall-clock microseconds so the files of all ranks on one
machine line up when merged with :func:`merge_traces` and opened in ``chrome://tracing`` or
Perfetto. The number of events kept is bounded: long jobs keep the most recent ones.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ByteCount", "ByteCounter", "Timeline", "merge_traces", "now_us"]


def now_us() -> int:
    """Wall-clock time in microseconds, the unit of Chrome trace timestamps."""
    return time.time_ns() // 1000


@dataclass(frozen=True)
class ByteCount:
    """Bytes this rank sent and received, over ``collectives`` collective calls."""

    sent: int = 0
    received: int = 0
    collectives: int = 0

    def __add__(self, other: ByteCount) -> ByteCount:
        return ByteCount(
            self.sent + other.sent,
            self.received + other.received,
            self.collectives + other.collectives,
        )


class ByteCounter:
    """Thread-safe running totals: the communication thread adds, the trainer reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = ByteCount()

    def add(self, sent: int, received: int, collectives: int) -> None:
        with self._lock:
            self._count += ByteCount(sent, received, collectives)

    def snapshot(self) -> ByteCount:
        with self._lock:
            return self._count

    def reset(self) -> ByteCount:
        """Zero the totals and return what they were."""
        with self._lock:
            count, self._count = self._count, ByteCount()
            return count


class Timeline:
    """Chrome trace events of one rank; ``rank`` becomes the trace's process id."""

    def __init__(self, rank: int, max_events: int = 200_000) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._events: deque[dict[str, Any]] = deque(maxlen=max_events)

    def instant(self, name: str, thread: str, args: dict[str, Any] | None = None) -> None:
        event = {"name": name, "ph": "i", "s": "t", "ts": now_us(), "pid": self.rank}
        self._append(event, thread, args)

    def complete(
        self,
        name: str,
        thread: str,
        start_us: int,
        end_us: int,
        args: dict[str, Any] | None = None,
    ) -> None:
        event = {
            "name": name,
            "ph": "X",
            "ts": start_us,
            "dur": max(0, end_us - start_us),
            "pid": self.rank,
        }
        self._append(event, thread, args)

    def _append(self, event: dict[str, Any], thread: str, args: dict[str, Any] | None) -> None:
        event["tid"] = thread
        if args:
            event["args"] = args
        with self._lock:
            self._events.append(event)

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()

    def to_chrome(self) -> dict[str, Any]:
        meta = {
            "name": "process_name",
            "ph": "M",
            "pid": self.rank,
            "args": {"name": f"rank {self.rank}"},
        }
        return {"traceEvents": [meta, *self.events()], "displayTimeUnit": "ms"}

    def write(self, path: str | Path) -> Path:
        """Write the trace as JSON (write to a temporary name, then rename into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_chrome()))
        partial.replace(path)
        return path


def merge_traces(paths: Iterable[str | Path], out: str | Path) -> Path:
    """Join per-rank trace files into one file with a row group per rank."""
    events: list[dict[str, Any]] = []
    for path in paths:
        events.extend(json.loads(Path(path).read_text())["traceEvents"])
    out = Path(out)
    out.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return out
