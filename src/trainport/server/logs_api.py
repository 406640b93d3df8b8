"""The part of the CloudWatch Logs API that SageMaker log tailers use.

Log group ``/aws/sagemaker/TrainingJobs`` holds one stream per job host, named as SageMaker
names them: ``<job>/<host>-<epoch seconds of the job's creation>``. A stream's events are
the lines of the host's log file (``<timestamp>\\t<line>``). Tokens are byte offsets into
that file: ``f/<offset>`` reads forward from it, ``b/<offset>`` reads the events that end
there. As in CloudWatch, a forward read that finds nothing new returns the token it was
given, which is how tailers (``sagemaker.logs_for_job``, ``aws logs tail``) know to wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainport.errors import NotFoundError, ValidationError
from trainport.jobs.db import ListQuery
from trainport.jobs.service import JobService
from trainport.server.protocol import ApiError, Operation

__all__ = ["LOG_GROUP", "LogsApi"]

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_MAX_EVENTS = 10_000
_MAX_BYTES = 1024 * 1024


def _not_found(message: str) -> ApiError:
    return ApiError("ResourceNotFoundException", message)


@dataclass(frozen=True)
class Stream:
    job: str
    host: str
    created: float
    path: Path

    @property
    def name(self) -> str:
        return f"{self.job}/{self.host}-{int(self.created)}"


Event = tuple[int, int, int, str]  # start offset, end offset, timestamp (ms), message


def _events(raw: bytes, base: int) -> list[Event]:
    """Each complete line of ``raw`` (which starts at file offset ``base``)."""
    out: list[Event] = []
    pos = 0
    while True:
        nl = raw.find(b"\n", pos)
        if nl < 0:
            return out
        line = raw[pos:nl]
        stamp, tab, text = line.partition(b"\t")
        try:
            ts = int(float(stamp) * 1000) if tab else 0
        except ValueError:
            ts, text = 0, line
        out.append((base + pos, base + nl + 1, ts, text.decode("utf-8", "replace")))
        pos = nl + 1


class LogsApi:
    def __init__(self, service: JobService) -> None:
        self.service = service

    def operations(self) -> dict[str, Operation]:
        return {
            "Logs_20140328.DescribeLogStreams": self.describe_log_streams,
            "Logs_20140328.GetLogEvents": self.get_log_events,
        }

    # -- streams ---------------------------------------------------------------------------

    def _check_group(self, params: dict[str, Any]) -> None:
        group = params.get("logGroupName") or params.get("logGroupIdentifier")
        if group != LOG_GROUP:
            raise _not_found(
                f"The specified log group does not exist: {group!r} (this server has {LOG_GROUP})"
            )

    def _streams_of(self, job: str, created: float) -> list[Stream]:
        folder = self.service.log_path(job).parent
        hosts = sorted(p.stem for p in folder.glob("*.log")) if folder.is_dir() else []
        return [Stream(job, h, created, folder / f"{h}.log") for h in hosts]

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
        prefix = params.get("logStreamNamePrefix") or ""
        if not isinstance(prefix, str):
            raise ValidationError("logStreamNamePrefix: expected a string")
        limit = params.get("limit", 50)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 50:
            raise ValidationError("limit: expected an integer from 1 to 50")
        token = params.get("nextToken")
        offset = int(token) if isinstance(token, str) and token.isdigit() else 0
        job_part = prefix.split("/", 1)[0]
        records = self.service.list(
            ListQuery(name_contains=job_part or None, sort_by="Name", sort_order="Ascending")
        )
        streams = [
            s
            for r in records
            if r.name.startswith(job_part)
            for s in self._streams_of(r.name, r.creation_time)
            if s.name.startswith(prefix)
        ]
        if params.get("descending"):
            streams.reverse()
        page = streams[offset : offset + limit]
        out: dict[str, Any] = {"logStreams": [self._describe(s) for s in page]}
        if offset + limit < len(streams):
            out["nextToken"] = str(offset + limit)
        return out

    def _describe(self, stream: Stream) -> dict[str, Any]:
        created = int(stream.created * 1000)
        info: dict[str, Any] = {
            "logStreamName": stream.name,
            "creationTime": created,
            "arn": f"arn:aws:logs:{self.service.settings.region}:"
            f"{self.service.settings.account_id}:log-group:{LOG_GROUP}:log-stream:{stream.name}",
            "storedBytes": 0,
        }
        try:
            st = stream.path.stat()
        except OSError:
            return info
        info["lastIngestionTime"] = int(st.st_mtime * 1000)
        info["lastEventTimestamp"] = int(st.st_mtime * 1000)
        with open(stream.path, "rb") as f:
            first = _events(f.readline(), 0)
        if first:
            info["firstEventTimestamp"] = first[0][2]
        return info

    # -- events ----------------------------------------------------------------------------

    def get_log_events(self, params: dict[str, Any]) -> dict[str, Any]:
        self._check_group(params)
        name = params.get("logStreamName")
        if not isinstance(name, str) or not name:
            raise ValidationError("logStreamName: a value is required")
        stream = self._stream(name)
        limit = params.get("limit", _MAX_EVENTS)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_EVENTS:
            raise ValidationError(f"limit: expected an integer from 1 to {_MAX_EVENTS}")
        start_ms = params.get("startTime")
        end_ms = params.get("endTime")
        token = params.get("nextToken")
        try:
            size = stream.path.stat().st_size
        except OSError:
            size = 0
        if isinstance(token, str) and token:
            direction, _, raw = token.partition("/")
            if direction not in ("f", "b") or not raw.isdigit():
                raise ValidationError(f"nextToken: {token!r} is not a token this server gave")
            forward, offset = direction == "f", min(int(raw), size)
        else:
            forward = bool(params.get("startFromHead"))
            offset = 0 if forward else size
        if forward:
            with open(stream.path, "rb") as f:
                f.seek(offset)
                chunk = f.read(_MAX_BYTES)
            events = _events(chunk, offset)[:limit]
            first = offset
            end = events[-1][1] if events else offset
        else:
            start = max(0, offset - _MAX_BYTES)
            with open(stream.path, "rb") as f:
                f.seek(start)
                chunk = f.read(offset - start)
            if start > 0:  # drop the partial first line
                cut = chunk.find(b"\n") + 1
                chunk, start = chunk[cut:], start + cut
            events = _events(chunk, start)[-limit:]
            end = offset
            first = events[0][0] if events else offset
        selected = [
            {"timestamp": ts, "message": text, "ingestionTime": ts}
            for _, _, ts, text in events
            if (not isinstance(start_ms, int) or ts >= start_ms)
            and (not isinstance(end_ms, int) or ts < end_ms)
        ]
        return {
            "events": selected,
            "nextForwardToken": f"f/{end:020d}",
            "nextBackwardToken": f"b/{first:020d}",
        }
