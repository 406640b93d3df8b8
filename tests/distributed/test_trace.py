"""Counters and Chrome traces without any process group."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from trainport.distributed import ByteCount, ByteCounter, Timeline, merge_traces


def test_counter_totals_across_threads() -> None:
    counter = ByteCounter()

    def add() -> None:
        for _ in range(1000):
            counter.add(3, 5, 1)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.snapshot() == ByteCount(sent=12000, received=20000, collectives=4000)
    assert counter.reset() == ByteCount(12000, 20000, 4000)
    assert counter.snapshot() == ByteCount()


def test_timeline_is_chrome_trace_and_merges(tmp_path: Path) -> None:
    paths = []
    for rank in range(2):
        timeline = Timeline(rank)
        timeline.instant("ready bucket 0", "backward", {"bytes": 8})
        timeline.complete("reduce bucket 0", "comm", 100, 250, {"bytes": 8})
        paths.append(timeline.write(tmp_path / f"rank{rank}.json"))
    trace = json.loads(paths[1].read_text())
    names = [(e["ph"], e["name"], e["pid"]) for e in trace["traceEvents"]]
    assert names == [
        ("M", "process_name", 1),
        ("i", "ready bucket 0", 1),
        ("X", "reduce bucket 0", 1),
    ]
    assert trace["traceEvents"][2]["dur"] == 150
    merged = json.loads(merge_traces(paths, tmp_path / "all.json").read_text())
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}


def test_timeline_keeps_the_latest_events() -> None:
    timeline = Timeline(0, max_events=3)
    for i in range(5):
        timeline.instant(f"ready bucket {i}", "backward")
    assert [e["name"] for e in timeline.events()] == [f"ready bucket {i}" for i in (2, 3, 4)]
