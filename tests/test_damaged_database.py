"""A job database that is damaged or empty: every command says which file, what is wrong
and what to do, in one line, and leaves the file as it found it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TRAINPORT = [sys.executable, "-m", "trainport.cli"]
DAMAGE = {
    "garbage": os.urandom(1) + b"this is no database, just bytes that were never one\n" * 64,
    "empty": b"",
    "truncated header": b"SQLite for",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRAINPORT, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("kind", sorted(DAMAGE))
@pytest.mark.parametrize("command", [("jobs", "list"), ("server", "--port", "0")])
def test_a_damaged_database_is_named_in_one_line_and_kept(
    home: Path, kind: str, command: tuple[str, ...]
) -> None:
    db = home / "trainport.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(DAMAGE[kind])
    done = _run(*command)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # no traceback
    [line] = lines
    assert line.startswith("error: the job database ") and str(db) in line
    assert ("empty" if kind == "empty" else "not a SQLite database") in line
    assert "Move it aside" in line and "backup" in line
    assert db.read_bytes() == DAMAGE[kind]  # never overwritten
    assert sorted(p.name for p in db.parent.iterdir()) == ["trainport.db"]


def test_a_new_home_gets_a_database_and_lists_no_jobs(home: Path) -> None:
    done = _run("jobs", "list")
    assert done.returncode == 0, done.stderr
    assert (home / "trainport.db").read_bytes().startswith(b"SQLite format 3\x00")
    assert sorted(p.name for p in home.iterdir() if p.name.startswith(".trainport.db")) == []


def test_damage_past_the_header_is_named_too(home: Path) -> None:
    assert _run("jobs", "list").returncode == 0  # a real database ...
    db = home / "trainport.db"
    raw = bytearray(db.read_bytes())
    raw[100:] = b"\xff" * (len(raw) - 100)  # ... whose pages are overwritten
    db.write_bytes(bytes(raw))
    for leftover in home.glob("trainport.db-*"):
        leftover.unlink()
    done = _run("jobs", "list")
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(db) in lines[0] and "damaged" in lines[0], done.stderr
    assert db.read_bytes() == bytes(raw)
