"""The job database: lists read off indexes, pages by keyset, damage reported not hidden."""

from __future__ import annotations

import dataclasses
import itertools
import sqlite3
from pathlib import Path

import pytest

from trainport.jobs import listing
from trainport.jobs.db import JobDB, ListQuery, PageKey
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


def _plan(db: JobDB, select: listing.Select) -> tuple[list[str], list[str]]:
    """The steps of ``select``'s plan: those that choose the jobs (the subquery of rowids),
    and those that read the chosen rows."""
    with sqlite3.connect(db.path) as conn:
        rows = conn.execute("EXPLAIN QUERY PLAN " + select.sql, select.args).fetchall()
    parents = {node: parent for node, parent, _, _ in rows}
    subqueries = {node for node, _, _, detail in rows if detail.startswith("LIST SUBQUERY")}

    def choosing(node: int) -> bool:
        while node:
            if node in subqueries:
                return True
            node = parents.get(node, 0)
        return False

    chosen = [detail for node, _, _, detail in rows if choosing(parents[node])]
    read = [detail for node, parent, _, detail in rows if parent == 0]
    return chosen, read


def _reads_only_indexes(steps: list[str]) -> bool:
    """Whether every table access of ``steps`` reads an index alone (or the name index)."""
    accesses = [s for s in steps if s.startswith(("SCAN", "SEARCH")) and "subquery" not in s]
    return bool(accesses) and all("COVERING INDEX" in s or "VIRTUAL TABLE" in s for s in accesses)


@pytest.mark.parametrize(("sort_by", "sort_order"), SORTS)
@pytest.mark.parametrize("status", [None, "Failed"])
@pytest.mark.parametrize("paged", [False, True])
def test_a_list_page_is_read_off_an_index_in_its_order(
    db: JobDB, sort_by: str, sort_order: str, status: str | None, paged: bool
) -> None:
    value = {"Name": "job-0100", "Status": "Failed"}.get(sort_by, 1050.0)
    query = ListQuery(
        status_equals=status,
        sort_by=sort_by,
        sort_order=sort_order,
        after=PageKey(value, "job-0100") if paged else None,
        limit=11,
    )
    assert not listing.unserved(query)
    chosen, read = _plan(db, listing.query_sql("name, doc", query))
    # The page is chosen from one index in its order: no sort of the matching jobs...
    assert _reads_only_indexes(chosen), chosen
    assert not any("TEMP B-TREE" in s for s in chosen), chosen
    if status or paged:
        assert any(step.startswith("SEARCH") for step in chosen), chosen
    # ... and only the page's own rows are read from the table.
    assert "SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)" in read, read


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
    chosen, _ = _plan(db, listing.query_sql("name", ListQuery(limit=11, **bounds)))
    [step] = [s for s in chosen if s.startswith(("SCAN", "SEARCH"))]
    assert step.startswith("SEARCH") and "creation_time" in step, chosen
    assert not any("TEMP B-TREE" in s for s in chosen), chosen


UNSERVED = [
    ListQuery(name_contains="job-01", limit=11),
    ListQuery(modified_after=1090.0, sort_order="Ascending", limit=11),
    ListQuery(creation_before=1020.0, sort_by="Status", limit=11),
    ListQuery(name_contains="0042", modified_before=1060.0, sort_by="Name", limit=11),
]


@pytest.mark.parametrize("query", UNSERVED)
def test_filters_the_sort_cannot_serve_are_read_from_indexes_alone(
    db: JobDB, query: ListQuery
) -> None:
    assert listing.unserved(query)
    selects = [listing.window_sql("doc", query), listing.query_sql("doc", query)]
    selects += [
        listing.driven_sql("doc", query, d, ["job-0142", "job-0042"])
        for d in listing.drivers(query, names_indexed=True)
    ]
    for select in selects:
        chosen, read = _plan(db, select)
        assert _reads_only_indexes(chosen), (select.sql, chosen)
        assert "SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)" in read, read


@pytest.mark.parametrize("window", [3, 50, 2000])
def test_each_way_of_reading_a_list_gives_the_same_page(
    db: JobDB, monkeypatch: pytest.MonkeyPatch, window: int
) -> None:
    """A small window sends most lists through the filters' own indexes (step 2) or the
    sort's index read to the end (step 3); a large one answers them in step 1."""
    monkeypatch.setattr(listing, "WINDOW", window)
    records = db.list(ListQuery())
    for contains, modified_after, creation_before, (by, order), status in itertools.product(
        (None, "job-01", "0042", "7"),
        (None, 1090.0),
        (None, 1020.0),
        SORTS,
        (None, "Failed"),
    ):
        matching = [
            r
            for r in records
            if (contains is None or contains in r.name)
            and (modified_after is None or r.last_modified_time > modified_after)
            and (creation_before is None or r.creation_time < creation_before)
            and (status is None or r.status == status)
        ]
        query = ListQuery(
            name_contains=contains,
            modified_after=modified_after,
            creation_before=creation_before,
            status_equals=status,
            sort_by=by,
            sort_order=order,
            limit=7,
        )

        def key(r: JobRecord, by: str = by) -> tuple[object, ...]:
            if by == "Name":
                return (r.name,)
            return (r.status, r.name) if by == "Status" else (r.creation_time, r.name)

        want = [r.name for r in sorted(matching, key=key, reverse=order == "Descending")]
        page = db.list_summaries(query)
        assert [s.name for s in page] == want[:7], query
        if len(want) > 7:
            nxt = dataclasses.replace(query, after=query.key_of(page[-1]))
            assert [s.name for s in db.list_summaries(nxt)] == want[7:14], nxt


def test_names_stored_before_the_name_index_are_indexed(tmp_path: Path) -> None:
    path = tmp_path / "trainport.db"
    JobDB(path).insert_many([_job(i) for i in range(30)])
    with sqlite3.connect(path) as conn:  # as a file of a version without the index
        for statement in (
            "DROP TRIGGER job_names_insert",
            "DROP TRIGGER job_names_delete",
            "DROP TABLE job_names",
        ):
            conn.execute(statement)
    db = JobDB(path)
    assert db.names_indexed
    select = listing.name_matches_sql(ListQuery(name_contains="job-002"))
    with sqlite3.connect(path) as conn:
        found = [row[0] for row in conn.execute(select.sql, select.args)]
    assert sorted(found) == [f"job-00{i}" for i in range(20, 30)]


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
