"""The part of the CloudWatch Logs API that SageMaker log tailers and ``aws logs`` use.

Log group ``/aws/sagemaker/TrainingJobs`` holds one stream per job host, named as SageMaker
names them: ``<job>/<host>-<epoch seconds of the job's creation>``. A stream's events are
the lines of the host's log file, long lines split as CloudWatch splits them (see
:mod:`.log_events`). GetLogEvents tokens are byte offsets into that file: ``f/<offset>``
reads forward from it, ``b/<offset>`` reads the events that end there. As in CloudWatch, a
forward read that finds nothing new returns the token it was given, which is how tailers
(``sagemaker.logs_for_job``, ``aws logs tail``) know to wait. FilterLogEvents interleaves
streams by time; its token is the last event it returned, the next page starts after it.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainport.errors import NotFoundError, ValidationError
from trainport.jobs.db import ListQuery
from trainport.jobs.service import JobService
from trainport.server.log_events import MAX_READ, LogEvent, LogFile
from trainport.server.protocol import ApiError, Operation

__all__ = ["LOG_GROUP", "LogsApi"]

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_MAX_EVENTS = 10_000
_MAX_STREAMS = 50  # per DescribeLogStreams page
_MAX_NAMED_STREAMS = 100  # logStreamNames of one FilterLogEvents
# A file's last write is its last event's time; stamps are rounded to the millisecond, so a
# stream is skipped by time only with this much room.
_MTIME_SLACK_MS = 1000


def _not_found(message: str) -> ApiError:
    return ApiError("ResourceNotFoundException", message)


def _invalid(message: str) -> ApiError:
    return ApiError("InvalidParameterException", message)


@dataclass(frozen=True)
class Stream:
    job: str
    host: str
    created: float
    path: Path

    @property
    def name(self) -> str:
        return f"{self.job}/{self.host}-{int(self.created)}"

    def last_event_ms(self) -> int | None:
        try:
            return int(self.path.stat().st_mtime * 1000)
        except OSError:
            return None


def _integer(params: dict[str, Any], field: str, low: int, high: int, default: int) -> int:
    value = params.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _invalid(f"{field}: expected an integer from {low} to {high}")
    return value


def _optional_ms(params: dict[str, Any], field: str) -> int | None:
    value = params.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(f"{field}: expected milliseconds since the epoch")
    return value


def _text(params: dict[str, Any], field: str) -> str:
    value = params.get(field) or ""
    if not isinstance(value, str):
        raise _invalid(f"{field}: expected a string")
    return value


def _encode(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def _decode(token: str, field: str) -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, binascii.Error) as exc:
        raise _invalid(f"{field}: {token!r} is not a token this server gave") from exc


class LogsApi:
    def __init__(self, service: JobService) -> None:
        self.service = service

    def operations(self) -> dict[str, Operation]:
        return {
            "Logs_20140328.DescribeLogGroups": self.describe_log_groups,
            "Logs_20140328.DescribeLogStreams": self.describe_log_streams,
            "Logs_20140328.GetLogEvents": self.get_log_events,
            "Logs_20140328.FilterLogEvents": self.filter_log_events,
        }

    def _arn(self, rest: str) -> str:
        s = self.service.settings
        return f"arn:aws:logs:{s.region}:{s.account_id}:log-group:{LOG_GROUP}{rest}"

    # -- groups ----------------------------------------------------------------------------

    def describe_log_groups(self, params: dict[str, Any]) -> dict[str, Any]:
        prefix = _text(params, "logGroupNamePrefix")
        pattern = _text(params, "logGroupNamePattern")
        if prefix and pattern:
            raise _invalid("logGroupNamePrefix and logGroupNamePattern cannot both be given")
        _integer(params, "limit", 1, 50, 50)
        named = params.get("logGroupIdentifiers")
        shown = LOG_GROUP.startswith(prefix) and pattern.lower() in LOG_GROUP.lower()
        if named is not None:
            shown = shown and any(LOG_GROUP in str(n) for n in named)
        if not shown:
            return {"logGroups": []}
        oldest = self.service.db.list_summaries(
            ListQuery(sort_by="CreationTime", sort_order="Ascending", limit=1)
        )
        created = int(oldest[0].creation_time * 1000) if oldest else 0
        group = {
            "logGroupName": LOG_GROUP,
            "creationTime": created,
            "metricFilterCount": 0,
            "arn": self._arn(":*"),
            "logGroupArn": self._arn(""),
            "storedBytes": 0,
            "logGroupClass": "STANDARD",
        }
        return {"logGroups": [group]}

    def _check_group(self, params: dict[str, Any]) -> None:
        group = params.get("logGroupName") or params.get("logGroupIdentifier")
        if isinstance(group, str) and group.startswith("arn:"):
            group = group.removesuffix(":*").rpartition(":log-group:")[2]
        if group != LOG_GROUP:
            raise _not_found(
                f"The specified log group does not exist: {group!r} (this server has {LOG_GROUP})"
            )

    # -- streams ---------------------------------------------------------------------------

    def _streams_of(self, job: str, created: float) -> list[Stream]:
        folder = self.service.log_path(job).parent
        hosts = sorted(p.stem for p in folder.glob("*.log")) if folder.is_dir() else []
        return [Stream(job, h, created, folder / f"{h}.log") for h in hosts]

    def _streams(self, prefix: str) -> list[Stream]:
        """Every stream whose name starts with ``prefix``, in name order."""
        job_part = prefix.split("/", 1)[0]
        streams = [
            s
            for name, created in self.service.db.created(job_part)
            for s in self._streams_of(name, created)
            if s.name.startswith(prefix)
        ]
        return sorted(streams, key=lambda s: s.name)

    def _stream(self, name: str) -> Stream:
        job = name.rpartition("/")[0]
        try:
            record = self.service.get(job) if job else None
        except NotFoundError:
            record = None
        if record is not None:
            for stream in self._streams_of(job, record.creation_time):
                if stream.name == name:
                    return stream
        raise _not_found(f"The specified log stream does not exist: {name!r}")

    def describe_log_streams(self, params: dict[str, Any]) -> dict[str, Any]:
        self._check_group(params)
        prefix = _text(params, "logStreamNamePrefix")
        limit = _integer(params, "limit", 1, _MAX_STREAMS, _MAX_STREAMS)
        order_by = params.get("orderBy", "LogStreamName")
        if order_by not in ("LogStreamName", "LastEventTime"):
            raise _invalid(f"orderBy: {order_by!r} is not one of LogStreamName, LastEventTime")
        if order_by == "LastEventTime" and prefix:
            # CloudWatch refuses this pair: its streams are indexed by name or by time.
            raise _invalid("Cannot order by LastEventTime with a logStreamNamePrefix.")
        descending = bool(params.get("descending"))
        token = params.get("nextToken")
        after = _decode(token, "nextToken") if isinstance(token, str) and token else None
        if after is not None and not _stream_key_of(after, order_by):
            raise _invalid(f"nextToken: not a token of a listing ordered by {order_by}")

        def key(stream: Stream) -> list[Any]:
            if order_by == "LogStreamName":
                return [stream.name]
            return [stream.last_event_ms() or 0, stream.name]

        keyed = sorted(((key(s), s) for s in self._streams(prefix)), reverse=descending)
        if after is not None:
            keyed = [(k, s) for k, s in keyed if (k < after if descending else k > after)]
        page = keyed[:limit]
        out: dict[str, Any] = {"logStreams": [self._describe(s) for _, s in page]}
        if len(keyed) > limit:
            out["nextToken"] = _encode(page[-1][0])
        return out

    def _describe(self, stream: Stream) -> dict[str, Any]:
        info: dict[str, Any] = {
            "logStreamName": stream.name,
            "creationTime": int(stream.created * 1000),
            "arn": self._arn(f":log-stream:{stream.name}"),
            "storedBytes": 0,
        }
        last = stream.last_event_ms()
        if last is None:
            return info
        info["lastIngestionTime"] = last
        info["lastEventTimestamp"] = last
        first = LogFile(stream.path).forward(0, 1)
        if first:
            info["firstEventTimestamp"] = first[0].timestamp
        return info

    # -- events of one stream --------------------------------------------------------------

    def get_log_events(self, params: dict[str, Any]) -> dict[str, Any]:
        self._check_group(params)
        name = params.get("logStreamName")
        if not isinstance(name, str) or not name:
            raise ValidationError("logStreamName: a value is required")
        log_file = LogFile(self._stream(name).path)
        limit = params.get("limit", _MAX_EVENTS)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_EVENTS:
            raise ValidationError(f"limit: expected an integer from 1 to {_MAX_EVENTS}")
        start_ms = params.get("startTime")
        end_ms = params.get("endTime")
        token = params.get("nextToken")
        size = log_file.size()
        given = isinstance(token, str) and bool(token)
        if isinstance(token, str) and token:
            direction, _, raw = token.partition("/")
            if direction not in ("f", "b") or not raw.isdigit():
                raise ValidationError(f"nextToken: {token!r} is not a token this server gave")
            forward, offset = direction == "f", min(int(raw), size)
        else:
            forward = bool(params.get("startFromHead"))
            offset = 0 if forward else size
        if forward:
            events = log_file.forward(offset, limit)
            first, end = offset, events[-1].end if events else offset
        else:
            events = log_file.backward(offset, limit, at_event_end=given)
            first = events[0].start if events else offset
            end = offset if given or not events else events[-1].end
        selected = [
            {"timestamp": e.timestamp, "message": e.message, "ingestionTime": e.timestamp}
            for e in events
            if (not isinstance(start_ms, int) or e.timestamp >= start_ms)
            and (not isinstance(end_ms, int) or e.timestamp < end_ms)
        ]
        return {
            "events": selected,
            "nextForwardToken": f"f/{end:020d}",
            "nextBackwardToken": f"b/{first:020d}",
        }

    # -- events of many streams ------------------------------------------------------------

    def filter_log_events(self, params: dict[str, Any]) -> dict[str, Any]:
        self._check_group(params)
        names = params.get("logStreamNames")
        prefix = _text(params, "logStreamNamePrefix")
        if names is not None and prefix:
            raise _invalid("logStreamNames and logStreamNamePrefix cannot both be given")
        if names is not None and (
            not isinstance(names, list)
            or not 1 <= len(names) <= _MAX_NAMED_STREAMS
            or not all(isinstance(n, str) for n in names)
        ):
            raise _invalid(f"logStreamNames: expected 1 to {_MAX_NAMED_STREAMS} stream names")
        limit = _integer(params, "limit", 1, _MAX_EVENTS, _MAX_EVENTS)
        start_ms = _optional_ms(params, "startTime")
        end_ms = _optional_ms(params, "endTime")
        matches = FilterPattern(_text(params, "filterPattern"))
        token = params.get("nextToken")
        page = _Page.of(_decode(token, "nextToken")) if isinstance(token, str) and token else None

        streams = self._named_streams(names) if names is not None else self._streams(prefix)
        streams = [s for s in streams if _may_hold(s, start_ms, end_ms)]
        merged = heapq.merge(*(_ordered(s, page) for s in streams))
        events: list[dict[str, Any]] = []
        size = 0
        read = _Page((0, "", 0), dict(page.resume) if page else {})
        for keyed in merged:
            if len(events) == limit or size >= MAX_READ:
                return _filtered(events, streams, read)
            read.last = (keyed.order, keyed.stream, keyed.start)
            read.resume[keyed.stream] = (keyed.event.end, keyed.order)
            event = keyed.event
            if start_ms is not None and event.timestamp < start_ms:
                continue
            if end_ms is not None and event.timestamp > end_ms:
                continue
            if not matches(event.message):
                continue
            size += len(event.message) + 26
            events.append(
                {
                    "logStreamName": keyed.stream,
                    "timestamp": event.timestamp,
                    "message": event.message,
                    "ingestionTime": event.timestamp,
                    "eventId": _event_id(keyed),
                }
            )
        return _filtered(events, streams, None)

    def _named_streams(self, names: list[str]) -> list[Stream]:
        found: dict[str, Stream] = {}
        for name in names:
            try:
                found[name] = self._stream(name)
            except ApiError:
                continue  # CloudWatch searches the streams that exist
        return sorted(found.values(), key=lambda s: s.name)


def _stream_key_of(doc: Any, order_by: str) -> bool:
    """Whether ``doc`` is the key of a stream in an ``order_by`` listing."""
    if order_by == "LogStreamName":
        return isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], str)
    return (
        isinstance(doc, list)
        and len(doc) == 2
        and isinstance(doc[0], int)
        and isinstance(doc[1], str)
    )


def _filtered(
    events: list[dict[str, Any]], streams: list[Stream], read: _Page | None
) -> dict[str, Any]:
    """The response; ``read`` is where the page ended, None when every stream was read."""
    out: dict[str, Any] = {
        "events": events,
        "searchedLogStreams": [
            {"logStreamName": s.name, "searchedCompletely": read is None} for s in streams
        ],
    }
    if read is not None:
        out["nextToken"] = _encode(read.to_json())
    return out


def _may_hold(stream: Stream, start_ms: int | None, end_ms: int | None) -> bool:
    """Whether ``stream`` may hold events from ``start_ms`` to ``end_ms``: none is older
    than its job, none newer than its file's last write."""
    if end_ms is not None and stream.created * 1000 > end_ms + _MTIME_SLACK_MS:
        return False
    last = stream.last_event_ms()
    if last is None:
        return False
    return start_ms is None or last + _MTIME_SLACK_MS >= start_ms


@dataclass(frozen=True, order=True)
class _Keyed:
    """An event with where it sorts among every stream's: by time, then stream, then place.
    ``order`` is the latest timestamp of its stream so far, never less than the one before
    it, so each stream's events come in order and a merge of streams is a sort."""

    order: int
    stream: str
    start: int
    event: LogEvent


@dataclass
class _Page:
    """Where a page of FilterLogEvents ended: the last event it read, and for each stream
    it read from, where that stream's next event starts and its running order there, so
    the next page reads each stream on from there instead of from its start."""

    last: tuple[int, str, int]
    resume: dict[str, tuple[int, int]]

    def to_json(self) -> dict[str, Any]:
        # A search over many streams keeps its token short and reads them from the start.
        resume = self.resume if len(self.resume) <= _MAX_NAMED_STREAMS else {}
        return {"last": list(self.last), "resume": {k: list(v) for k, v in resume.items()}}

    @classmethod
    def of(cls, doc: Any) -> _Page:
        invalid = _invalid("nextToken: not a token this server gave")
        if not isinstance(doc, dict):
            raise invalid
        last, resume = doc.get("last"), doc.get("resume")
        if not (
            isinstance(last, list)
            and [type(v) for v in last] == [int, str, int]
            and isinstance(resume, dict)
            and all(
                isinstance(v, list) and [type(x) for x in v] == [int, int] for v in resume.values()
            )
        ):
            raise invalid
        return cls((last[0], last[1], last[2]), {k: (v[0], v[1]) for k, v in resume.items()})


def _ordered(stream: Stream, page: _Page | None) -> Iterator[_Keyed]:
    """``stream``'s events after ``page``, each with its place in the merge of streams."""
    offset, order = page.resume.get(stream.name, (0, 0)) if page else (0, 0)
    for event in LogFile(stream.path).events(offset):
        order = max(order, event.timestamp)
        if page is None or (order, stream.name, event.start) > page.last:
            yield _Keyed(order, stream.name, event.start, event)


def _event_id(keyed: _Keyed) -> str:
    """A number unique to the event, as CloudWatch's event ids are."""
    return f"{keyed.order:015d}{zlib.crc32(keyed.stream.encode()):010d}{keyed.start:020d}"


class FilterPattern:
    """CloudWatch's filter pattern of terms: every plain term must be in the message, no
    ``-term`` may be, and of the ``?term`` ones at least one. A term in double quotes may
    hold spaces; terms match case-sensitively. An empty pattern matches every event."""

    def __init__(self, pattern: str) -> None:
        stripped = pattern.strip()
        if stripped[:1] in ("{", "[") or (stripped.startswith("%") and stripped.endswith("%")):
            raise _invalid(
                f"filterPattern: {pattern!r}: this server matches terms and quoted phrases "
                '(ERROR, "out of memory", ?WARN, -DEBUG); JSON, space-delimited and '
                "regular-expression patterns are not served"
            )
        self.required: list[str] = []
        self.excluded: list[str] = []
        self.any_of: list[str] = []
        for term in _terms(stripped):
            if term.startswith("?") and len(term) > 1:
                self.any_of.append(_unquote(term[1:]))
            elif term.startswith("-") and len(term) > 1:
                self.excluded.append(_unquote(term[1:]))
            else:
                self.required.append(_unquote(term))

    def __call__(self, message: str) -> bool:
        return (
            all(t in message for t in self.required)
            and not any(t in message for t in self.excluded)
            and (not self.any_of or any(t in message for t in self.any_of))
        )


def _terms(pattern: str) -> list[str]:
    terms: list[str] = []
    current = ""
    quoted = False
    for char in pattern:
        if char == '"':
            quoted = not quoted
            current += char
        elif char.isspace() and not quoted:
            if current:
                terms.append(current)
            current = ""
        else:
            current += char
    if quoted:
        raise _invalid(f"filterPattern: {pattern!r} has a quote that is not closed")
    if current:
        terms.append(current)
    return terms


def _unquote(term: str) -> str:
    if len(term) >= 2 and term[0] == term[-1] == '"':
        return term[1:-1]
    return term
