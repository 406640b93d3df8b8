"""A host's log file read as CloudWatch Logs events.

The file holds one line per line of output, ``<epoch seconds>\\t<text>\\n`` (written by the
host agent). An event is a line, or a piece of one: CloudWatch takes at most 256 KiB per
event, 26 bytes of which are the event's own overhead, so a longer line is split into
consecutive events of at most :data:`MAX_MESSAGE` bytes, cut between UTF-8 characters and
all with the line's timestamp, the way the awslogs log driver splits a container's long
lines for SageMaker.

Positions are byte offsets into the file. The first piece of a line starts where the line
starts; each further piece starts where the one before it ended. A read returns whole
events only and never reads more than :data:`MAX_READ` bytes past where it starts, so a
token made from where a read ended is always an event's start, and a read from an event's
start always returns at least one event when the file holds one (a piece fits in a read).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["MAX_MESSAGE", "MAX_READ", "LogEvent", "LogFile"]

#: CloudWatch's event size less its per-event overhead: the most bytes one message holds.
MAX_MESSAGE = 256 * 1024 - 26
#: The most bytes of the file one read takes (CloudWatch answers with at most 1 MB).
MAX_READ = 1 << 20
# A line's stamp is "1700000000.123\t"; a tab later than this is part of the text.
_STAMP_MAX = 32
_BLOCK = 1 << 16


@dataclass(frozen=True)
class LogEvent:
    start: int  # file offset where the event starts (its line's start for a first piece)
    end: int  # file offset just past it (past the newline for a line's last piece)
    timestamp: int  # milliseconds since the epoch
    message: str


def _stamp(raw: bytes, pos: int) -> tuple[int, int] | None:
    """(timestamp in ms, where the text starts) of the line starting at ``pos``; None when
    ``raw`` ends before the stamp does. A line without a stamp has timestamp 0."""
    head = raw[pos : pos + _STAMP_MAX]
    tab = head.find(b"\t")
    newline = head.find(b"\n")
    if tab < 0 or 0 <= newline < tab:
        if newline < 0 and len(head) < _STAMP_MAX:
            return None  # the stamp may still be coming
        return 0, pos
    try:
        return int(float(head[:tab]) * 1000), pos + tab + 1
    except ValueError:
        return 0, pos


def _piece_end(raw: bytes, start: int) -> int:
    """Where a full piece starting at ``start`` ends: after at most MAX_MESSAGE bytes, and
    not inside a UTF-8 character (whose continuation bytes are 0b10xxxxxx)."""
    cut = start + MAX_MESSAGE
    for back in range(4):
        if raw[cut - back] & 0xC0 != 0x80:
            return cut - back
    return cut  # not UTF-8 here: any cut will do


def split(raw: bytes, base: int, *, carry: int | None, whole: bool) -> list[LogEvent]:
    """The events in ``raw``, bytes of the file from offset ``base``.

    ``carry`` is the timestamp of the line ``raw`` starts inside of (after its stamp), or
    None when ``raw`` starts at a line's start. ``whole`` says ``raw`` ends at an event's
    end; otherwise the file may go on, and a line's unfinished tail is left for a later
    read unless it holds a full piece.
    """
    events: list[LogEvent] = []
    pos, n = 0, len(raw)
    while pos < n:
        start = pos
        if carry is not None:
            ts, text = carry, pos
            carry = None
        else:
            stamp = _stamp(raw, pos)
            if stamp is None:
                if whole:
                    stamp = (0, pos)
                else:
                    return events
            ts, text = stamp
        while True:
            newline = raw.find(b"\n", text, text + MAX_MESSAGE + 1)
            if newline >= 0:
                message = raw[text:newline].decode("utf-8", "replace")
                events.append(LogEvent(base + start, base + newline + 1, ts, message))
                pos = newline + 1
                break
            if text + MAX_MESSAGE < n:  # the line goes on past a full piece
                cut = _piece_end(raw, text)
                message = raw[text:cut].decode("utf-8", "replace")
                events.append(LogEvent(base + start, base + cut, ts, message))
                start = text = cut
                continue
            if whole and (text < n or start < text):
                message = raw[text:n].decode("utf-8", "replace")
                events.append(LogEvent(base + start, base + n, ts, message))
            return events
    return events


def _line_start(f: BinaryIO, pos: int) -> int:
    """The offset of the start of the line that ``pos`` is in."""
    end = pos
    while end > 0:
        begin = max(0, end - _BLOCK)
        f.seek(begin)
        newline = f.read(end - begin).rfind(b"\n")
        if newline >= 0:
            return begin + newline + 1
        end = begin
    return 0


def _context(f: BinaryIO, pos: int) -> tuple[int, int | None]:
    """(start of the line ``pos`` is in, the line's timestamp when ``pos`` is past the
    line's start, else None)."""
    if pos == 0:
        return 0, None
    f.seek(pos - 1)
    if f.read(1) == b"\n":
        return pos, None
    begin = _line_start(f, pos)
    f.seek(begin)
    head = f.read(_STAMP_MAX)
    stamp = _stamp(head, 0)
    return begin, stamp[0] if stamp else 0


class LogFile:
    """Reads of one host's log file as events; a file that is not there reads as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def forward(self, offset: int, limit: int) -> list[LogEvent]:
        """Up to ``limit`` events from ``offset`` (an event's start) on."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return []
        with f:
            _, carry = _context(f, offset)
            f.seek(offset)
            raw = f.read(MAX_READ)
        return split(raw, offset, carry=carry, whole=False)[:limit]

    def backward(self, offset: int, limit: int, *, at_event_end: bool) -> list[LogEvent]:
        """Up to ``limit`` events that end at or before ``offset``, the last ones first in
        file order, from the last :data:`MAX_READ` bytes before it. ``at_event_end`` says
        ``offset`` came from a token (an event's end); else it is the file's size, where
        a line may be half written."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return []
        with f:
            window = max(0, offset - MAX_READ)
            begin = _line_start(f, window)
            f.seek(begin)
            raw = f.read(offset - begin)
        events = split(raw, begin, carry=None, whole=at_event_end)
        return [e for e in events if e.end > window][-limit:]

    def events(self, offset: int = 0) -> Iterator[LogEvent]:
        """Every event from ``offset`` (an event's start) to the file's end."""
        while True:
            batch = self.forward(offset, MAX_READ)
            if not batch:
                return
            yield from batch
            offset = batch[-1].end
