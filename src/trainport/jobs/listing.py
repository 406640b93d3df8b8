"""How a list of jobs is read: a query's filters, sort and page as SQL that reads indexes.

A page should cost about the same with a thousand jobs as with a hundred thousand. Every
index a list reads holds the four columns lists filter and sort on (name, status, creation
and modification time), so a list is chosen from indexes alone, and only the page's own
rows are read from the table. Every sort has an index, and so does every sort under a
status filter; a page after the first starts at the previous page's last sort key (a
keyset), never by skipping rows. A list with only those filters (and a creation range when
sorted by creation time) is one range of one index, read in order up to the page's size.

The other filters (a name substring, a modification range, a creation range under another
sort) are checked in the sort's index as it is read. Where their matches are rare in that
order, reading on until a page is full would read most of the index, so:

1. the first :data:`WINDOW` entries of the sort's index are read and filtered; if the page
   is full, or the index holds no more, that is the answer;
2. otherwise the filter with the fewest matches, if it has fewer than :data:`WINDOW`, finds
   them through an index of its own (the names' trigram index, or a time's) and only they
   are sorted;
3. only when every such filter matches more jobs than that, and few of them come early in
   the sort's order, is the sort's index read on until the page is full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainport.jobs.db import JobSummary
    from trainport.jobs.records import JobRecord

__all__ = [
    "INDEXES",
    "WINDOW",
    "ListQuery",
    "PageKey",
    "Select",
    "driven_sql",
    "driver_count_sql",
    "drivers",
    "name_matches_sql",
    "query_sql",
    "select_page",
    "unserved",
    "window_count_sql",
    "window_sql",
]

#: Entries of the sort's index read before a filter's own index is asked (step 1), and
#: the most matches of a filter counted (step 2).
WINDOW = 1000
# The trigram index finds a substring of three characters or more.
NAME_INDEX_MIN = 3

#: The indexes lists read: each holds every column a list filters or sorts on.
INDEXES = {
    "jobs_list_creation": "creation_time, name, status, last_modified_time",
    "jobs_list_name": "name, creation_time, status, last_modified_time",
    "jobs_list_status": "status, name, creation_time, last_modified_time",
    "jobs_list_status_creation": "status, creation_time, name, last_modified_time",
    "jobs_list_modified": "last_modified_time, name, creation_time, status",
}
_DRIVER_INDEXES = {"creation": "jobs_list_creation", "modified": "jobs_list_modified"}
_SORT_COLUMNS = {"Name": "name", "CreationTime": "creation_time", "Status": "status"}


@dataclass(frozen=True)
class PageKey:
    """Where a page of a list ends: the last job's value of the sort column, and its name
    (which breaks ties). The next page starts after it."""

    value: str | float
    name: str


@dataclass(frozen=True)
class ListQuery:
    name_contains: str | None = None
    status_equals: str | None = None
    creation_after: float | None = None
    creation_before: float | None = None
    modified_after: float | None = None
    modified_before: float | None = None
    sort_by: str = "CreationTime"
    sort_order: str = "Descending"
    after: PageKey | None = None
    limit: int | None = None

    def key_of(self, job: JobSummary | JobRecord) -> PageKey:
        """The key a page that ends at ``job`` hands on to the next."""
        value: str | float
        if self.sort_by == "Name":
            value = job.name
        elif self.sort_by == "Status":
            value = job.status
        else:
            value = job.creation_time
        return PageKey(value, job.name)

    @property
    def sort_column(self) -> str:
        return _SORT_COLUMNS.get(self.sort_by, "creation_time")


@dataclass(frozen=True)
class Select:
    sql: str
    args: list[object]


def _order_index(query: ListQuery) -> str:
    """The index that holds the jobs ``query`` may list in its sort order."""
    if query.sort_column == "creation_time":
        return "jobs_list_status_creation" if query.status_equals else "jobs_list_creation"
    if query.sort_column == "name" and not query.status_equals:
        return "jobs_list_name"
    return "jobs_list_status"  # (status, name): by status, or by name within one status


def _conditions(query: ListQuery, *, ordered_only: bool) -> tuple[list[str], list[object]]:
    """The WHERE terms of ``query``; with ``ordered_only`` just those the sort's index
    serves as a range (status, the keyset, a creation range when sorted by creation)."""
    where: list[str] = []
    args: list[object] = []
    column = query.sort_column
    by_creation = column == "creation_time"
    # A job is modified at or after its creation, so a bound on one time bounds the other
    # too: the implied range lets an index of either time serve the filter.
    terms: list[tuple[str, str, object, bool]] = [
        ("status", "=", query.status_equals, True),
        ("creation_time", ">", query.creation_after, by_creation),
        ("creation_time", "<", query.creation_before, by_creation),
        ("creation_time", "<=", query.modified_before, by_creation),
        ("last_modified_time", ">", query.modified_after, False),
        ("last_modified_time", "<", query.modified_before, False),
        ("last_modified_time", ">=", query.creation_after, False),
    ]
    for name, op, value, served in terms:
        if value is not None and (served or not ordered_only):
            where.append(f"{name} {op} ?")
            args.append(value)
    if query.name_contains and not ordered_only:
        where.append("instr(lower(name), lower(?)) > 0")
        args.append(query.name_contains)
    if query.after is not None:
        past = ">" if query.sort_order == "Ascending" else "<"
        # A row value compares column by column, so the index serves it as one range.
        if column == "name" or (column == "status" and query.status_equals):
            where.append(f"name {past} ?")
            args.append(query.after.name)
        else:
            where.append(f"({column}, name) {past} (?, ?)")
            args += [query.after.value, query.after.name]
    return where, args


def _order(query: ListQuery) -> str:
    order = "ASC" if query.sort_order == "Ascending" else "DESC"
    if query.sort_column == "name":
        return f"name {order}"
    return f"{query.sort_column} {order}, name {order}"


def _where(terms: list[str]) -> str:
    return " WHERE " + " AND ".join(terms) if terms else ""


def _fetch(columns: str, query: ListQuery, chosen: Select) -> Select:
    """``columns`` of the jobs ``chosen`` (a SELECT of rowids) names, in the sort's order:
    only these rows are read from the table."""
    sql = (
        f"SELECT {columns} FROM jobs NOT INDEXED WHERE rowid IN ({chosen.sql}) "
        f"ORDER BY {_order(query)}"
    )
    return Select(sql, chosen.args)


def unserved(query: ListQuery) -> bool:
    """Whether ``query`` has a filter the sort's index does not serve as a range."""
    return bool(
        query.name_contains
        or query.modified_after is not None
        or query.modified_before is not None
        or (
            query.sort_column != "creation_time"
            and (query.creation_after is not None or query.creation_before is not None)
        )
    )


def query_sql(columns: str, query: ListQuery) -> Select:
    """The jobs that answer ``query`` read in the sort's index, every filter checked on
    the way, until the page is full (step 3, and every query :func:`unserved` denies)."""
    where, args = _conditions(query, ordered_only=False)
    sql = f"SELECT rowid FROM jobs INDEXED BY {_order_index(query)}{_where(where)}"
    sql += f" ORDER BY {_order(query)}"
    if query.limit is None:
        return Select(sql.replace("SELECT rowid", f"SELECT {columns}", 1), args)
    return _fetch(columns, query, Select(sql + " LIMIT ?", [*args, query.limit]))


def window_sql(columns: str, query: ListQuery) -> Select:
    """Step 1: the first :data:`WINDOW` entries of the sort's index, filtered."""
    inner, inner_args = _conditions(query, ordered_only=True)
    outer, outer_args = _conditions(query, ordered_only=False)
    window = (
        "SELECT rowid AS rid, name, status, creation_time, last_modified_time "
        f"FROM jobs INDEXED BY {_order_index(query)}{_where(inner)} "
        f"ORDER BY {_order(query)} LIMIT ?"
    )
    chosen = f"SELECT rid FROM ({window}){_where(outer)} ORDER BY {_order(query)} LIMIT ?"
    return _fetch(columns, query, Select(chosen, [*inner_args, WINDOW, *outer_args, query.limit]))


def window_count_sql(query: ListQuery) -> Select:
    """How many entries step 1's window held (fewer than WINDOW: every one there is)."""
    inner, args = _conditions(query, ordered_only=True)
    sql = (
        f"SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY {_order_index(query)}"
        f"{_where(inner)} LIMIT ?)"
    )
    return Select(sql, [*args, WINDOW])


def drivers(query: ListQuery, *, names_indexed: bool) -> list[str]:
    """The filters of ``query`` the sort's index does not serve that have an index of
    their own: "name" (the trigram index), "creation", "modified"."""
    found = []
    if query.name_contains and names_indexed and len(query.name_contains) >= NAME_INDEX_MIN:
        found.append("name")
    creation = query.creation_after is not None or query.creation_before is not None
    if creation and query.sort_column != "creation_time":
        found.append("creation")
    if query.modified_after is not None or query.modified_before is not None:
        found.append("modified")
    return found


def _name_match(query: ListQuery) -> str:
    # One phrase of the trigram index: the substring's every three characters, in order.
    return '"' + (query.name_contains or "").replace('"', '""') + '"'


def name_matches_sql(query: ListQuery) -> Select:
    """The names the trigram index finds for ``query``'s substring, up to WINDOW of them."""
    sql = "SELECT name FROM job_names WHERE job_names MATCH ? LIMIT ?"
    return Select(sql, [_name_match(query), WINDOW])


def driver_count_sql(query: ListQuery, driver: str) -> Select:
    """How many jobs a time ``driver``'s filter alone matches, counted up to WINDOW."""
    column = "creation_time" if driver == "creation" else "last_modified_time"
    low, high = (
        (query.creation_after, query.creation_before)
        if driver == "creation"
        else (query.modified_after, query.modified_before)
    )
    where: list[str] = []
    args: list[object] = []
    if low is not None:
        where.append(f"{column} > ?")
        args.append(low)
    if high is not None:
        where.append(f"{column} < ?")
        args.append(high)
    sql = f"SELECT 1 FROM jobs INDEXED BY {_DRIVER_INDEXES[driver]}{_where(where)} LIMIT ?"
    return Select(f"SELECT count(*) FROM ({sql})", [*args, WINDOW])


def driven_sql(
    columns: str, query: ListQuery, driver: str, names: list[str] | None = None
) -> Select:
    """Step 2: the matches of ``driver``'s filter found through its index, then sorted;
    for "name", ``names`` are the names the trigram index found."""
    where, args = _conditions(query, ordered_only=False)
    if driver == "name":
        # Looked up by name in an index that holds the other columns: no table read.
        source = "jobs INDEXED BY jobs_list_name"
        found = names or []
        where.insert(0, f"name IN ({', '.join('?' * len(found)) or 'NULL'})")
        args[:0] = found
    else:
        source = f"jobs INDEXED BY {_DRIVER_INDEXES[driver]}"
    chosen = f"SELECT rowid FROM {source}{_where(where)} ORDER BY {_order(query)} LIMIT ?"
    return _fetch(columns, query, Select(chosen, [*args, query.limit]))


Rows = list[tuple[Any, ...]]


def select_page(
    execute: Callable[[Select], Rows], columns: str, query: ListQuery, *, names_indexed: bool
) -> Rows:
    """The rows of ``columns`` that answer ``query``, read in the steps the module's
    docstring tells; ``execute`` runs one SELECT."""
    if query.limit is None or not unserved(query):
        return execute(query_sql(columns, query))
    rows = execute(window_sql(columns, query))
    if len(rows) >= query.limit or execute(window_count_sql(query))[0][0] < WINDOW:
        return rows  # a full page, or the window held every job there is
    counts: dict[str, int] = {}
    names: list[str] | None = None
    for driver in drivers(query, names_indexed=names_indexed):
        if driver == "name":
            names = [row[0] for row in execute(name_matches_sql(query))]
            counts[driver] = len(names)
        else:
            counts[driver] = execute(driver_count_sql(query, driver))[0][0]
    rarest = min(counts, key=lambda d: counts[d], default=None)
    if rarest is not None and counts[rarest] < WINDOW:
        return execute(driven_sql(columns, query, rarest, names))
    return execute(query_sql(columns, query))  # common matches, late in the sort's order
