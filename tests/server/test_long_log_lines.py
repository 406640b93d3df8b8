"""Log lines longer than a CloudWatch event: split into events as CloudWatch splits them,
and every read goes on past them (a tailer never stalls)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from tests.server.conftest import client, job, wait_for
from trainport.server.log_events import MAX_MESSAGE, MAX_READ, LogFile, split

GROUP = "/aws/sagemaker/TrainingJobs"
LONG = 2 * 1024 * 1024

# A 2 MiB line (longer than a read of the log takes, and than the host agent's line
# limit, so it is logged in pieces itself), then three ordinary lines.
PRINTS_LONG_LINE = (
    f"import sys\nsys.stdout.write('x' * {LONG} + '\\n')\nfor i in range(3):print('after-%d' % i)\n"
)


def _sdk_tail(logs: Any, stream: str) -> list[str]:
    """What sagemaker.logs_for_job does: read forward from the head until a read is empty."""
    messages: list[str] = []
    token = None
    while True:
        extra = {"nextToken": token} if token else {}
        page = logs.get_log_events(
            logGroupName=GROUP, logStreamName=stream, startFromHead=True, startTime=0, **extra
        )
        if not page["events"]:
            return messages
        messages += [e["message"] for e in page["events"]]
        token = page["nextForwardToken"]


def test_a_tail_reads_past_a_line_of_two_mebibytes(sm: Any, server: Any) -> None:
    sm.create_training_job(**job("long-line", PRINTS_LONG_LINE))
    assert wait_for(sm, "long-line")["TrainingJobStatus"] == "Completed"
    logs = client(server, "logs")
    [stream] = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix="long-line/")[
        "logStreams"
    ]
    messages = _sdk_tail(logs, stream["logStreamName"])
    assert messages[-3:] == ["after-0", "after-1", "after-2"]
    pieces = [m for m in messages if m.startswith("x")]
    assert "".join(pieces) == "x" * LONG
    assert all(len(p.encode()) <= MAX_MESSAGE for p in pieces)
    assert len(pieces) >= LONG // MAX_MESSAGE + 1

    # Backward from the end (no token), then on through the backward tokens, to the head.
    page = logs.get_log_events(logGroupName=GROUP, logStreamName=stream["logStreamName"])
    assert [e["message"] for e in page["events"]][-3:] == ["after-0", "after-1", "after-2"]
    backward: list[str] = []
    while page["events"]:
        backward = [e["message"] for e in page["events"]] + backward
        page = logs.get_log_events(
            logGroupName=GROUP,
            logStreamName=stream["logStreamName"],
            nextToken=page["nextBackwardToken"],
        )
    assert backward == messages

    # FilterLogEvents, one event a page: each page goes on from inside the long line.
    pages = logs.get_paginator("filter_log_events").paginate(
        logGroupName=GROUP, logStreamNamePrefix="long-line/", PaginationConfig={"PageSize": 1}
    )
    assert [e["message"] for page in pages for e in page["events"]] == messages


def _write(path: Path, lines: list[tuple[float, str]]) -> None:
    path.write_bytes(b"".join(f"{t:.3f}\t{text}\n".encode() for t, text in lines))


def test_pieces_are_cut_between_characters_and_keep_the_lines_time(tmp_path: Path) -> None:
    text = "é" * MAX_MESSAGE  # two bytes each: a cut at MAX_MESSAGE bytes may split one
    path = tmp_path / "algo-1.log"
    _write(path, [(12.5, "short"), (13.0, text), (14.0, "last")])
    events = list(LogFile(path).events())
    assert events[0].message == "short"
    pieces = events[1:-1]
    assert "".join(p.message for p in pieces) == text
    assert all(len(p.message.encode()) <= MAX_MESSAGE for p in pieces)
    assert {p.timestamp for p in pieces} == {13000}
    assert events[-1].message == "last"
    for before, after in itertools.pairwise(events):
        assert before.end == after.start  # every event starts where the one before ended


def test_every_read_from_an_event_start_advances(tmp_path: Path) -> None:
    path = tmp_path / "algo-1.log"
    _write(path, [(1.0, "a" * (MAX_READ + 10)), (2.0, "b" * 10), (3.0, "c" * (3 * MAX_MESSAGE))])
    log_file = LogFile(path)
    offset, reads = 0, 0
    while offset < path.stat().st_size:
        events = log_file.forward(offset, 10_000)
        assert events and events[0].start == offset
        offset = events[-1].end
        reads += 1
    assert reads >= 2


def test_a_half_written_line_waits_for_its_end(tmp_path: Path) -> None:
    raw = b"1.000\tdone\n2.000\tstill being wr"
    events = split(raw, 0, carry=None, whole=False)
    assert [e.message for e in events] == ["done"]
    assert events[-1].end == raw.index(b"\n") + 1
