"""The job database: lists read off indexes, pages by keyset, damage reported not hidden."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

import pytest

from trainport.jobs.db import JobDB, ListQuery, PageKey, list_sql
from trainport.jobs.records import JobRecord

SORTS = [
    (by, order)
    for by in ("Name", "CreationTime", "Status")
    for order in ("Ascending", "Descending")
]


def _job(i: int) -> JobRecord:
    status = ("Completed", "Failed", "Stopped", "InProgress")[i % 4]
    return JobRecord(
        name=f"job-{i:04d}",
        arn=f"arn:aws:sagemaker:us-east-1:000000000000:training-job/job-{i:04d}",
        request={},
        creation_time=1000.0 + i // 2,  # pairs share a creation time: names break the tie
        last_modified_time=1000.0 + i // 2 + 5,
        status=status,
        secondary_status=status,
    )


@pytest.fixture
def db(tmp_path: Path) -> JobDB:
    jobs = JobDB(tmp_path / "trainport.db")
    jobs.insert_many([_job(i) for i in range(200)])
    return jobs


def _plan(db: JobDB, query: ListQuery) -> list[str]:
    sql, args = list_sql("name", query)
    with sqlite3.connect(db.path) as conn:
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]


@pytest.mark.parametrize(("sort_by", "sort_order"), SORTS)
@pytest.mark.parametrize("status", [None, "Failed"])
@pytest.mark.parametrize("paged", [False, True])
def test_a_list_page_is_read_off_an_index_in_its_order(
    db: JobDB, sort_by: str, sort_order: str, status: str | None, paged: bool
) -> None:
    after = PageKey(
        "job-0100" if sort_by == "Name" else ("Failed" if sort_by == "Status" else 1050.0),
        "job-0100",
    )
    query = ListQuery(
        status_equals=status,
        sort_by=sort_by,
        sort_order=sort_order,
        after=after if paged else None,
        limit=11,
    )
    plan = _plan(db, query)
    # No sort of the matching rows (a temporary B-tree), no scan of the table itself.
    assert not any("TEMP B-TREE" in step for step in plan), plan
    assert all("INDEX" in step for step in plan), plan
    if status or paged:
        assert any(step.startswith("SEARCH") for step in plan), plan


@pytest.mark.parametrize(
    "bounds",
    [
        {"creation_after": 1080.0},
        {"creation_before": 1020.0},
        {"modified_before": 1020.0},  # implies a creation bound: jobs change after creation
    ],
)
def test_a_time_filter_sorted_by_creation_is_a_range_of_the_index(
    db: JobDB, bounds: dict[str, float]
) -> None:
    plan = _plan(db, ListQuery(limit=11, **bounds))
    assert len(plan) == 1 and plan[0].startswith("SEARCH"), plan
    assert "creation_time" in plan[0] and "TEMP" not in plan[0], plan


@pytest.mark.parametrize(("sort_by", "sort_order"), SORTS)
@pytest.mark.parametrize("status", [None, "Stopped"])
def test_keyset_pages_list_every_job_once_in_order(
    db: JobDB, sort_by: str, sort_order: str, status: str | None
) -> None:
    whole = db.list_summaries(
        ListQuery(status_equals=status, sort_by=sort_by, sort_order=sort_order)
    )
    seen = []
    query = ListQuery(status_equals=status, sort_by=sort_by, sort_order=sort_order, limit=7)
    while True:
        page = db.list_summaries(query)
        seen += page
        if len(page) < 7:
            break
        query = ListQuery(
            status_equals=status,
            sort_by=sort_by,
            sort_order=sort_order,
            limit=7,
            after=query.key_of(page[-1]),
        )
    assert [s.name for s in seen] == [s.name for s in whole]
    assert len({s.name for s in seen}) == len(whole) == (50 if status else 200)
    keys = [(query.key_of(s).value, s.name) for s in seen]
    assert keys == sorted(keys, reverse=sort_order == "Descending")


def test_modified_filters_match_what_they_say(db: JobDB) -> None:
    names = {s.name for s in db.list_summaries(ListQuery(modified_before=1010.0))}
    assert names == {f"job-{i:04d}" for i in range(200) if 1000 + i // 2 + 5 < 1010}
    names = {
        s.name for s in db.list_summaries(ListQuery(modified_after=1100.0, creation_before=1098.0))
    }
    assert names == {
        f"job-{i:04d}" for i in range(200) if 1000 + i // 2 + 5 > 1100 and 1000 + i // 2 < 1098
    }


def test_every_combination_of_filters_agrees_with_a_plain_reading(db: JobDB) -> None:
    records = db.list(ListQuery())
    for status, after, before in itertools.product(
        (None, "Completed"), (None, 1030.0), (None, 1070.0)
    ):
        query = ListQuery(status_equals=status, modified_after=after, creation_before=before)
        want = [
            r.name
            for r in records
            if (status is None or r.status == status)
            and (after is None or r.last_modified_time > after)
            and (before is None or r.creation_time < before)
        ]
        assert [s.name for s in db.list_summaries(query)] == want
