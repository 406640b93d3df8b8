"""Tuning job records in the job database, in a table of their own beside the jobs.

One row per tuning job holds the record as JSON beside the columns its list filters and
sorts on; the table is created the first time a store opens a database (older databases
simply gain it). The store opens its own connections to the job database's file, with the
same settings as the jobs' (WAL, a busy timeout), once the jobs' database has made the
file. Updates are read-modify-write inside ``BEGIN IMMEDIATE``, as for jobs, so the API (a
stop) and the driver (children, counters) never lose each other's changes.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainport.errors import DatabaseError, NotFoundError, ResourceInUseError
from trainport.jobs.db import JobDB
from trainport.tuning.records import TuningRecord

__all__ = ["TuningQuery", "TuningStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tuning_jobs (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    creation_time REAL NOT NULL,
    last_modified_time REAL NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tuning_jobs_by_status ON tuning_jobs (status);
"""

_SORT_COLUMNS = {"Name": "name", "CreationTime": "creation_time", "Status": "status"}


@dataclass(frozen=True)
class TuningQuery:
    name_contains: str | None = None
    status_equals: str | None = None
    creation_after: float | None = None
    creation_before: float | None = None
    modified_after: float | None = None
    modified_before: float | None = None
    sort_by: str = "Name"
    sort_order: str = "Ascending"


def _missing(name: str) -> NotFoundError:
    return NotFoundError(f"Requested resource not found: hyperparameter tuning job {name!r}")


class TuningStore:
    def __init__(self, db: JobDB) -> None:
        self.path: Path = db.path  # made whole by JobDB before this opens it
        with self._reading() as conn:
            conn.executescript(_SCHEMA)  # a database of an older trainport gains the table

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        try:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            try:
                conn.execute("PRAGMA busy_timeout=30000")
                conn.execute("PRAGMA synchronous=NORMAL")
                yield conn
            finally:
                conn.close()
        except sqlite3.IntegrityError:
            raise  # a caller's to translate (a name taken)
        except sqlite3.Error as exc:
            raise DatabaseError(
                f"the job database {self.path} cannot be read or written (tuning jobs): {exc}"
            ) from exc

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._reading() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @staticmethod
    def _row(record: TuningRecord) -> tuple[str, str, float, float, str]:
        return (
            record.name,
            record.status,
            record.creation_time,
            record.last_modified_time or record.creation_time,
            json.dumps(record.to_json()),
        )

    def insert(self, record: TuningRecord) -> None:
        with self._transaction() as conn:
            try:
                conn.execute("INSERT INTO tuning_jobs VALUES (?, ?, ?, ?, ?)", self._row(record))
            except sqlite3.IntegrityError as exc:
                raise ResourceInUseError(
                    f"Hyperparameter tuning job {record.name!r} already exists; choose another "
                    "HyperParameterTuningJobName"
                ) from exc

    def get(self, name: str) -> TuningRecord:
        with self._reading() as conn:
            row = conn.execute("SELECT doc FROM tuning_jobs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise _missing(name)
        return TuningRecord.from_json(json.loads(row[0]))

    def update(self, name: str, change: Callable[[TuningRecord], TuningRecord]) -> TuningRecord:
        """Apply ``change`` to the stored record atomically; returns the stored result."""
        with self._transaction() as conn:
            row = conn.execute("SELECT doc FROM tuning_jobs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise _missing(name)
            old = TuningRecord.from_json(json.loads(row[0]))
            new = change(old)
            if new != old:
                _, status, _, modified, doc = self._row(new)
                conn.execute(
                    "UPDATE tuning_jobs SET status = ?, last_modified_time = ?, doc = ? "
                    "WHERE name = ?",
                    (status, modified, doc, name),
                )
            return new

    def delete(self, name: str, allowed: Callable[[TuningRecord], None]) -> None:
        """Delete the record after ``allowed`` (which raises to refuse) has seen it."""
        with self._transaction() as conn:
            row = conn.execute("SELECT doc FROM tuning_jobs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise _missing(name)
            allowed(TuningRecord.from_json(json.loads(row[0])))
            conn.execute("DELETE FROM tuning_jobs WHERE name = ?", (name,))

    def names_in_status(self, statuses: builtins.list[str]) -> builtins.list[str]:
        marks = ",".join("?" * len(statuses))
        with self._reading() as conn:
            rows = conn.execute(
                f"SELECT name FROM tuning_jobs WHERE status IN ({marks}) ORDER BY creation_time",
                tuple(statuses),
            ).fetchall()
        return [r[0] for r in rows]

    def list(self, query: TuningQuery) -> builtins.list[TuningRecord]:
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
        sql = "SELECT doc FROM tuning_jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        order = "ASC" if query.sort_order == "Ascending" else "DESC"
        sql += f" ORDER BY {_SORT_COLUMNS.get(query.sort_by, 'name')} {order}, name {order}"
        with self._reading() as conn:
            rows = conn.execute(sql, args).fetchall()
        return [TuningRecord.from_json(json.loads(r[0])) for r in rows]
