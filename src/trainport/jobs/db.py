"""SQLite persistence of job records and metric series.

One row per job holds the record as JSON beside the columns lists filter and sort on.
Updates are read-modify-write inside ``BEGIN IMMEDIATE`` so the supervisor, the CLI and the
server can all write the same job without losing each other's changes. WAL mode lets readers
go on while a writer writes.

A list is read off indexes and stops at its page's size, whatever the number of jobs (see
:mod:`.listing`). The file is made whole or not at all (built aside, then linked into place),
so a file that is empty or is no SQLite database is damage to report, never to overwrite.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainport.errors import DatabaseError, NotFoundError, ResourceInUseError
from trainport.jobs import listing
from trainport.jobs.listing import ListQuery, PageKey
from trainport.jobs.records import JobRecord, MetricPoint

__all__ = ["JobDB", "JobSummary", "ListQuery", "PageKey"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    creation_time REAL NOT NULL,
    last_modified_time REAL NOT NULL,
    doc TEXT NOT NULL
);
-- The indexes of earlier versions; lists read those of listing.INDEXES.
DROP INDEX IF EXISTS jobs_by_status;
DROP INDEX IF EXISTS jobs_by_creation_name;
DROP INDEX IF EXISTS jobs_by_status_name;
DROP INDEX IF EXISTS jobs_by_status_creation_name;
DROP INDEX IF EXISTS jobs_by_modified;
CREATE TABLE IF NOT EXISTS metrics (
    job TEXT NOT NULL,
    name TEXT NOT NULL,
    ts REAL NOT NULL,
    value REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_job ON metrics (job, name, ts);
""" + "".join(
    f"CREATE INDEX IF NOT EXISTS {name} ON jobs ({columns});\n"
    for name, columns in listing.INDEXES.items()
)

# Below this much free space a failing SQLite is taken to be out of room: a connection
# needs 32 KiB for the WAL index, and a write some pages of log.
_ROOM_NEEDED = 256 << 10

# The first 16 bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


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


# Its own copy of each name (not an external-content index), so a match is looked up by
# name in an index of jobs, not by reading the jobs table.
_NAME_INDEX = (
    "CREATE VIRTUAL TABLE job_names USING fts5(name, tokenize='trigram')",
    "CREATE TRIGGER job_names_insert AFTER INSERT ON jobs BEGIN "
    "INSERT INTO job_names(rowid, name) VALUES (new.rowid, new.name); END",
    "CREATE TRIGGER job_names_delete AFTER DELETE ON jobs BEGIN "
    "DELETE FROM job_names WHERE rowid = old.rowid; END",
    # The names of the jobs stored before the index was.
    "INSERT INTO job_names(rowid, name) SELECT rowid, name FROM jobs",
)


def _index_names(conn: sqlite3.Connection) -> bool:
    """Make the trigram index of job names (NameContains finds rare names through it) if
    the file has none yet; whether it has one. A SQLite without FTS5's trigram tokenizer
    (before 3.34) does without: NameContains then reads names in the sort's order."""
    exists = "SELECT 1 FROM sqlite_master WHERE name = 'job_names'"
    if conn.execute(exists).fetchone():
        return True
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute(exists).fetchone():
            for statement in _NAME_INDEX:
                conn.execute(statement)
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if "fts5" in str(exc) or "tokenizer" in str(exc):
            log.info("job names are not indexed (this SQLite lacks FTS5 trigrams): %s", exc)
            return False
        raise
    return True


def _damaged(path: Path, what: str) -> DatabaseError:
    return DatabaseError(
        f"the job database {path} {what}; trainport leaves it as it is. Move it aside "
        f"(mv {path} {path}.damaged) to start with an empty job list, or put back a copy "
        "from a backup"
    )


def _check_file(path: Path) -> None:
    """Refuse a database file that cannot be one: SQLite takes an empty file for a new,
    empty database and would show no jobs without a word."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise DatabaseError(f"the job database {path} cannot be read: {exc}") from exc
    if not head:
        raise _damaged(path, "is empty (0 bytes) where a SQLite database should be")
    if head != _SQLITE_HEADER:
        raise _damaged(path, "is not a SQLite database (its first bytes are not SQLite's)")


class JobDB:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            self._create()
        _check_file(path)
        with self._connect() as conn:
            conn.executescript(_SCHEMA)  # a file of an older trainport gets today's indexes
            self.names_indexed = _index_names(conn)

    def _create(self) -> None:
        """Make the database file whole beside its place and link it in: a process that
        finds the file sees a complete database, never one half made."""
        new = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            conn = sqlite3.connect(new, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
            finally:
                conn.close()
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.link(new, self.path)
        except (OSError, sqlite3.Error) as exc:
            raise DatabaseError(f"the job database {self.path} cannot be created: {exc}") from exc
        finally:
            for leftover in (new, Path(f"{new}-wal"), Path(f"{new}-shm")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()

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
        except sqlite3.IntegrityError:
            raise  # a caller's to translate (a name taken)
        except sqlite3.OperationalError as exc:
            raise self._failed(exc) from exc
        except sqlite3.DatabaseError as exc:
            # "file is not a database", "database disk image is malformed": damage found
            # past the header's check.
            raise _damaged(self.path, f"is damaged (SQLite says: {exc})") from exc

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

    def insert_many(self, records: Sequence[JobRecord]) -> None:
        """Insert ``records`` in one transaction (an import, a benchmark's fill)."""
        with self._write() as conn:
            try:
                conn.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?)", map(self._row, records))
            except sqlite3.IntegrityError as exc:
                raise ResourceInUseError(f"a training job name is taken already: {exc}") from exc

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
        with self._connect() as conn:
            return listing.select_page(
                lambda select: conn.execute(select.sql, select.args).fetchall(),
                columns,
                query,
                names_indexed=self.names_indexed,
            )

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

    def created(self, prefix: str = "") -> builtins.list[tuple[str, float]]:
        """The name and creation time of every job whose name starts with ``prefix``, in
        name order (read off the primary key's index)."""
        sql = "SELECT name, creation_time FROM jobs"
        args: tuple[str, ...] = ()
        if prefix:
            # Every name that starts with the prefix sorts between it and it followed by
            # the last code point.
            sql += " WHERE name >= ? AND name < ?"
            args = (prefix, prefix + "\U0010ffff")
        with self._connect() as conn:
            return conn.execute(sql + " ORDER BY name", args).fetchall()

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
