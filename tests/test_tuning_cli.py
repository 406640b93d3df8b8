"""``trainport tune`` and ``trainport tuning``, as a user runs them: real subprocesses, the
tuning job driven from the command (no server), or by a server given with --endpoint."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import wait_until
from tests.server.tuning_support import put_source, tuning_request
from tests.test_cli import TRAINPORT, tp
from trainport.config import load_settings
from trainport.errors import NotFoundError
from trainport.jobs.db import JobDB

pytestmark = pytest.mark.slow


def _file(tmp_path: Path, name: str, **options: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tuning_request(name, "Random", **options)))  # type: ignore[arg-type]
    return path


def test_tune_drives_a_tuning_job_to_its_end(home: Path, tmp_path: Path) -> None:
    put_source(home, tmp_path)
    done = tp("tune", str(_file(tmp_path, "cli-tune", max_jobs=3, parallel=2, RandomSeed=1)))
    assert done.returncode == 0, done.stderr
    assert "cli-tune: Completed; 3 completed, 0 stopped, 0 failed; best loss=" in done.stdout
    assert "best values: {" in done.stdout
    listed = tp("tuning", "list").stdout
    assert "cli-tune" in listed and "Completed" in listed and "3 completed" in listed
    described = tp("tuning", "describe", "cli-tune").stdout.splitlines()
    assert sum(line.startswith("  cli-tune-") for line in described) == 3, described


def test_a_killed_tune_resumes_without_running_a_child_twice(home: Path, tmp_path: Path) -> None:
    put_source(home, tmp_path)
    path = _file(tmp_path, "cli-resume", max_jobs=4, parallel=2, static={"pause": "1"})
    proc = subprocess.Popen(
        [*TRAINPORT, "tune", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    db = JobDB(load_settings().db_path) if False else None  # the file appears with the job
    del db

    def two_children() -> bool:
        """Two children training: the command is waiting for a slot, not creating one."""
        jobs = home / "jobs"
        if not jobs.exists():
            return False
        db = JobDB(load_settings().db_path)
        training = 0
        for folder in jobs.iterdir():
            with contextlib.suppress(NotFoundError):
                training += db.get(folder.name).secondary_status == "Training"
        return training >= 2

    try:
        wait_until(two_children, timeout=60, what="two children started")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    done = tp("tune", "--resume", "cli-resume", timeout=240)
    assert done.returncode == 0, done.stderr
    assert "cli-resume: Completed; 4 completed" in done.stdout, done.stdout
    names = sorted(p.name for p in (home / "jobs").iterdir() if p.name.startswith("cli-resume-"))
    assert len(names) == 4
    for name in names:
        text = (home / "jobs" / name / "logs" / "algo-1.log").read_text()
        assert [text.count(f"epoch={e} ") for e in range(3)] == [1, 1, 1], text


def test_tuning_stop_from_the_command_line(home: Path, tmp_path: Path) -> None:
    put_source(home, tmp_path)
    path = _file(
        tmp_path, "cli-stop", max_jobs=4, parallel=2, static={"epochs": "1000", "pause": "1"}
    )
    proc = subprocess.Popen(
        [*TRAINPORT, "tune", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(
            lambda: "2 running" in tp("tuning", "list").stdout, timeout=60, what="two children"
        )
        stopped = tp("tuning", "stop", "cli-stop", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert "cli-stop: Stopped" in stopped.stdout
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1
        assert "cli-stop: Stopped; 0 completed, 2 stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
