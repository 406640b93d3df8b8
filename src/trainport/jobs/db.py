"""SQLite persistence of job records and metric series.

One row per job holds the record as JSON beside the columns lists filter and sort on.
Updates are read-modify-write inside ``BEGIN IMMEDIATE`` so the supervisor, the CLI and the
server can all write the same job without losing each other's changes. WAL mode lets readers
go on while a writer writes.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainport.errors import DatabaseError, NotFoundError, ResourceInUseError
from trainport.jobs.records import JobRecord, MetricPoint

__all__ = ["JobDB", "JobSummary", "ListQuery"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    creation_time REAL NOT NULL,
    last_modified_time REAL NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
-- One index per ListTrainingJobs order (ties broken by name), so a page is read off the
-- index and stops at LIMIT instead of sorting every row with its JSON.
CREATE INDEX IF NOT EXISTS jobs_by_creation_name ON jobs (creation_time, name);
CREATE INDEX IF NOT EXISTS jobs_by_status_name ON jobs (status, name);
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT NOT NULL,
    name TEXT NOT NULL,
    ts REAL NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics (job, name, ts);
"""

# Below this much free space a failing SQLite is taken to be out of room: a connection
# needs 32 KiB for the WAL index, and a write some pages of log.
_ROOM_NEEDED = 256 << 10

_SORT_COLUMNS = {"Name": "name", "CreationTime": "creation_time", "Status": "status"}


@dataclass(frozen=True)
class JobSummary:
    """One job as a list shows it (the fields of a TrainingJobSummary)."""

    name: str
    arn: str
    status: str
    secondary_status: str
    creation_time: float
    last_modified_time: float
    training_end_time: float | None


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
    offset: int = 0
    limit: int | None = None


class JobDB:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout=30000")
                # WAL stays consistent after a crash of trainport with NORMAL; only a power
                # loss can drop the last commits. FULL would fsync every status change.
                conn.execute("PRAGMA synchronous=NORMAL")
                yield conn
            finally:
                conn.close()
        except sqlite3.OperationalError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: sqlite3.OperationalError) -> DatabaseError:
        """SQLite's error as ours; on a full disk it reports only "disk I/O error", since
        even a read needs room for the write-ahead log's index: say what is wrong."""
        message = f"the job database {self.path} cannot be read or written: {exc}"
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return DatabaseError(message)
        if st.f_bavail * st.f_frsize < _ROOM_NEEDED:
            message += f"; no space is left on the device that holds {self.path.parent}"
        return DatabaseError(message)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # SQLite may have rolled back already
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @staticmethod
    def _row(record: JobRecord) -> tuple[str, str, float, float, str]:
        return (
            record.name,
            record.status,
            record.creation_time,
            record.last_modified_time or record.creation_time,
            json.dumps(record.to_json()),
        )

    def insert(self, record: JobRecord) -> None:
        with self._write() as conn:
            try:
                conn.execute("INSERT INTO jobs VALUES (?, ?, ?, ?, ?)", self._row(record))
            except sqlite3.IntegrityError as exc:
                raise ResourceInUseError(
                    f"Training job {record.name!r} already exists; choose another "
                    "TrainingJobName (names are unique, as in SageMaker)"
                ) from exc

    def exists(self, name: str) -> bool:
        with self._connect() as conn:
            return conn.execute("SELECT 1 FROM jobs WHERE name = ?", (name,)).fetchone() is not None

    def get(self, name: str) -> JobRecord:
        with self._connect() as conn:
            row = conn.execute("SELECT doc FROM jobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFoundError(f"Requested resource not found: training job {name!r}")
        return JobRecord.from_json(json.loads(row[0]))

    def update(self, name: str, change: Callable[[JobRecord], JobRecord]) -> JobRecord:
        """Apply ``change`` to the stored record atomically; returns the stored result."""
        with self._write() as conn:
            row = conn.execute("SELECT doc FROM jobs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFoundError(f"Requested resource not found: training job {name!r}")
            old = JobRecord.from_json(json.loads(row[0]))
            new = change(old)
            if new != old:
                _, status, _, modified, doc = self._row(new)
                conn.execute(
                    "UPDATE jobs SET status = ?, last_modified_time = ?, doc = ? WHERE name = ?",
                    (status, modified, doc, name),
                )
            return new

    def _select(self, columns: str, query: ListQuery) -> builtins.list[tuple[Any, ...]]:
        where: builtins.list[str] = []
        args: builtins.list[object] = []
        if query.name_contains:
            where.append("instr(lower(name), lower(?)) > 0")
            args.append(query.name_contains)
        for column, op, value in (
            ("status", "=", query.status_equals),
            ("creation_time", ">", query.creation_after),
            ("creation_time", "<", query.creation_before),
            ("last_modified_time", ">", query.modified_after),
            ("last_modified_time", "<", query.modified_before),
        ):
            if value is not None:
                where.append(f"{column} {op} ?")
                args.append(value)
        column = _SORT_COLUMNS.get(query.sort_by, "creation_time")
        order = "ASC" if query.sort_order == "Ascending" else "DESC"
        sql = f"SELECT {columns} FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {column} {order}, name {order}"
        if query.limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args += [query.limit, query.offset]
        with self._connect() as conn:
            return conn.execute(sql, args).fetchall()

    def list(self, query: ListQuery) -> builtins.list[JobRecord]:
        return [JobRecord.from_json(json.loads(r[0])) for r in self._select("doc", query)]

    def list_summaries(self, query: ListQuery) -> builtins.list[JobSummary]:
        """What ListTrainingJobs shows, read without decoding each whole record."""
        rows = self._select(
            "name, json_extract(doc, '$.arn'), status, json_extract(doc, '$.secondary_status'), "
            "creation_time, last_modified_time, json_extract(doc, '$.training_end_time')",
            query,
        )
        return [JobSummary(*row) for row in rows]

    def names_in_status(self, statuses: Sequence[str]) -> builtins.list[str]:
        marks = ",".join("?" * len(statuses))
        with self._connect() as conn:
            rows = conn.execute(f"SELECT name FROM jobs WHERE status IN ({marks})", tuple(statuses))
            return [r[0] for r in rows.fetchall()]

    def add_metrics(self, job: str, points: Sequence[MetricPoint]) -> None:
        if not points:
            return
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO metrics VALUES (?, ?, ?, ?)",
                [(job, p.name, p.timestamp, p.value) for p in points],
            )

    def metric_series(self, job: str) -> dict[str, builtins.list[tuple[float, float]]]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT name, ts, value FROM metrics WHERE job = ? ORDER BY ts, rowid", (job,)
            ).fetchall()
        series: dict[str, builtins.list[tuple[float, float]]] = {}
        for name, ts, value in rows:
            series.setdefault(name, []).append((ts, value))
        return series
