"""A job's end and a Stop never wait for metric matching: lines whose Regex takes long, each
within the per-line budget, are matched while the job runs, and whatever is still queued
when it ends is left unmatched with one warning in the job's log."""

from __future__ import annotations

import re

from tests.conftest import python_job, wait_for, wait_until
from trainport.host.metrics import MetricMatcher
from trainport.jobs.records import MetricPoint
from trainport.jobs.service import JobService

# Each line takes a few tenths of a second of CPU against "stall" (exponential in the run
# of a's before the b), well inside the one-second budget, so nothing disables matching;
# "n" records which lines were matched at all.
SLOW = [
    {"Name": "n", "Regex": r"n=(\d+)"},
    {"Name": "stall", "Regex": r"(a+)+$"},
]
SLOW_LINE = "a" * 21 + "b"
LINES = 200
WARNING = re.compile(
    r"\[trainport\] metrics: (\d+) log lines were not matched against MetricDefinitions "
    r"\(0 came faster than they could be matched, (\d+) were still waiting when the job ended\)"
)


def test_the_matcher_leaves_the_backlog_at_close_with_one_warning() -> None:
    batches: list[list[MetricPoint]] = []
    warnings: list[str] = []
    matcher = MetricMatcher(
        [(d["Name"], d["Regex"]) for d in SLOW],
        on_points=batches.append,
        on_warning=warnings.append,
        budget=5.0,
        end_grace=0.5,
    )
    for i in range(LINES):
        matcher.feed(f"n={i} {SLOW_LINE}", float(i))
    matcher.close()
    matched = sorted(int(p.value) for batch in batches for p in batch)
    assert len(warnings) == 1, warnings
    found = re.fullmatch(WARNING.pattern[len(r"\[trainport\] ") :] + ".*", warnings[0])
    assert found, warnings[0]
    assert found.group(1) == found.group(2)
    # Matched in order up to where the end came; the rest was left, none lost silently.
    assert matched == list(range(len(matched)))
    assert len(matched) + int(found.group(1)) == LINES
    assert len(matched) < LINES


def test_a_job_ends_without_waiting_for_its_metric_backlog(service: JobService) -> None:
    code = (
        f"for i in range({LINES}):\n"
        f"    print(f'n={{i}} {SLOW_LINE}', flush=True)\n"
        "print('loss=0.5', flush=True)\n"
    )
    service.create(python_job("backlog", code, algo={"MetricDefinitions": SLOW}), runner="process")
    record = wait_for(service, "backlog")
    assert record.status == "Completed", record.failure_reason
    warnings = [t for _, t in service.logs("backlog") if t.startswith("[trainport] metrics")]
    assert len(warnings) == 1, warnings
    found = WARNING.match(warnings[0])
    assert found, warnings[0]
    matched = service.metric_series("backlog").get("n", [])
    assert len(matched) + int(found.group(1)) == LINES + 1  # and the loss line
    assert len(matched) < LINES


def test_stop_does_not_wait_for_the_metric_backlog(service: JobService) -> None:
    code = (
        "import time\n"
        f"for i in range({LINES}):\n"
        f"    print(f'n={{i}} {SLOW_LINE}', flush=True)\n"
        "print('printed', flush=True)\n"
        "time.sleep(300)\n"
    )
    service.create(
        python_job("backlog-stop", code, algo={"MetricDefinitions": SLOW}), runner="process"
    )
    wait_until(lambda: "printed" in [t for _, t in service.logs("backlog-stop")], what="output")
    assert service.stop("backlog-stop").status == "Stopping"
    record = wait_for(service, "backlog-stop")
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    warnings = [t for _, t in service.logs("backlog-stop") if t.startswith("[trainport] metrics")]
    assert len(warnings) == 1 and WARNING.match(warnings[0]), warnings
    assert len(service.metric_series("backlog-stop").get("n", [])) < LINES
