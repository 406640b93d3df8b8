"""What a person sees at the terminal: real ``trainport`` subprocesses, real jobs, and a
real pseudo-terminal where a progress bar is meant to show."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import yaml

from tests.conftest import request
from trainport.jobs.records import JobRecord, Transition

TRAINPORT = [sys.executable, "-m", "trainport.cli"]
READABLE_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def tp(*args: str, merged: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``trainport args``; ``merged``: stderr into stdout, so their order is kept."""
    return subprocess.run(
        [*TRAINPORT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
        timeout=timeout,
    )


def job_file(tmp_path: Path, name: str, code: str, **overrides: object) -> Path:
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    body = request(name, **overrides)
    body["AlgorithmSpecification"] = {
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["python3", "-u", str(script)],
        "MetricDefinitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_busy_port_is_one_line_naming_it(home: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = tp("server", "--port", str(port))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"port {port}" in lines[0] and "--port" in lines[0]
    assert not (home / "server" / "keys.json").exists()  # refused before making anything


def test_an_address_not_of_this_machine_is_one_line(home: Path) -> None:
    done = tp("server", "--host", "203.0.113.7", "--port", "0")  # TEST-NET-3: never local
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: cannot listen on 203.0.113.7:0: Cannot assign requested address; check "
        "--host and --port"
    ]


def test_status_lines_come_before_the_jobs_output(home: Path, tmp_path: Path) -> None:
    path = job_file(tmp_path, "order", "print('first line of the job')\nprint('loss=0.5')\n")
    done = tp("run", str(path), merged=True)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    training = next(i for i, line in enumerate(lines) if line.startswith("[trainport] Training:"))
    assert training < lines.index("first line of the job"), done.stdout


def test_plain_script_mode_says_nothing_of_images(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("print('plain')\n")
    done = tp("run", "--entry-point", str(script), "--name", "plain")
    assert done.returncode == 0, done.stderr
    assert "image" not in done.stderr.split("Job plain:")[0], done.stderr
    assert "container engine" not in done.stderr


def test_list_describe_stop_and_logs_of_ended_jobs(home: Path, tmp_path: Path) -> None:
    ok = job_file(tmp_path, "good", "print('loss=0.25')\n")
    bad = job_file(
        tmp_path,
        "bad",
        "import sys\nprint('going down', file=sys.stderr)\nsys.exit(3)\n",
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
    )
    assert tp("run", str(ok)).returncode == 0
    assert tp("run", str(bad)).returncode == 1

    table = tp("jobs", "list")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "NAME", "STATUS", "SECONDARY", "CREATED", "DURATION", "METRICS", "FAILURE"
    ]  # fmt: skip
    good_row = next(r for r in rows if r.startswith("good "))
    bad_row = next(r for r in rows if r.startswith("bad "))
    assert "loss=0.25" in good_row and READABLE_TIME.search(good_row)
    assert "AlgorithmError" in bad_row and "Failed" in bad_row

    listed = tp("jobs", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    summaries = {s["TrainingJobName"]: s for s in json.loads(listed.stdout)["TrainingJobSummaries"]}
    assert summaries["good"]["FinalMetricDataList"][0]["MetricName"] == "loss"
    assert summaries["good"]["FinalMetricDataList"][0]["Value"] == 0.25
    assert "exit code: 3" in summaries["bad"]["FailureReason"]
    assert "FailureReason" not in summaries["good"]

    described = tp("jobs", "describe", "good", "--output", "table")
    assert described.returncode == 0, described.stderr
    assert re.search(r"^Created: +" + READABLE_TIME.pattern, described.stdout, re.M)
    assert re.search(r"^Ended: +" + READABLE_TIME.pattern, described.stdout, re.M)
    assert not re.search(r"\d{9,}\.\d", described.stdout), described.stdout  # no epoch floats
    assert re.search(r"^Metric loss: +0.25$", described.stdout, re.M)

    stopped = tp("jobs", "stop", "good")
    assert stopped.returncode == 0
    assert "already Completed" in stopped.stderr and "nothing to stop" in stopped.stderr

    unknown = tp("jobs", "logs", "bad", "--host", "algo-9")
    assert unknown.returncode == 2
    assert "algo-9" in unknown.stderr and "algo-1, algo-2" in unknown.stderr
    second = tp("jobs", "logs", "bad", "--host", "algo-2")
    assert second.returncode == 0 and "going down" in second.stdout


def test_bad_list_options_are_refused(home: Path) -> None:
    done = tp("jobs", "list", "--output", "yaml")
    assert done.returncode == 2 and "'yaml' is not one of 'table', 'json'" in done.stderr
    done = tp("jobs", "list", "--limit", "0")
    assert done.returncode == 2 and "--limit 0" in done.stderr


def _on_a_terminal(args: list[str], env: dict[str, str], timeout: float = 180) -> str:
    """Run ``trainport args`` with stderr on a pseudo-terminal; all it wrote there."""
    leader, follower = pty.openpty()
    # A terminal 120 columns wide (a new pseudo-terminal has none, where tqdm draws nothing).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [*TRAINPORT, *args], stdout=subprocess.DEVNULL, stderr=follower, env=env
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=timeout)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_a_local_channel_upload_shows_progress_and_no_library_warnings(
    s3_home: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(40):  # more at once than the connections of two workers
        (data / f"part-{i:02d}.bin").write_bytes(os.urandom(64 << 10))
    script = tmp_path / "count.py"
    script.write_text("import os\nprint('files', len(os.listdir('/opt/ml/input/data/train')))\n")
    env = dict(os.environ, TRAINPORT_DOWNLOAD_WORKERS="2")
    seen = _on_a_terminal(
        [
            "run",
            "--entry-point",
            str(script),
            "--name",
            "upload-bar",
            "--channel",
            f"train={data}",
            "--detach",
        ],
        env,
    )
    assert f"upload {data}" in seen and "100%" in seen, seen
    assert "2.50M" in seen, seen  # 40 x 64 KiB
    assert "Connection pool is full" not in seen, seen
    assert not re.search(r"(WARNING|Warning)(?! trainport)", seen), seen  # no library's


class _Sequence:
    """The records a job's service answers with, one per read (the last one after)."""

    def __init__(self, *records: JobRecord) -> None:
        self.records = list(records)

    def get(self, name: str) -> JobRecord:
        return self.records.pop(0) if len(self.records) > 1 else self.records[0]


def test_news_within_a_phase_redraws_one_line_on_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainport.follow import _StatusLines

    start = Transition("Downloading", 1.0, None, "Downloading input data")
    base = JobRecord("j", "arn", {}, 0.0, secondary_status="Downloading", transitions=(start,))
    news = [f"Downloading input data: channel train {p}%" for p in (10, 60)]
    training = Transition("Training", 2.0, None, "Training in progress")
    lines = _StatusLines(
        _Sequence(
            dataclasses.replace(base, status_message=start.message),
            dataclasses.replace(base, status_message=news[0]),
            dataclasses.replace(base, status_message=news[1]),
            dataclasses.replace(
                base,
                secondary_status="Training",
                status_message=training.message,
                transitions=(start, training),
            ),
        ),
        "j",
    )
    lines.in_place = True
    for _ in range(4):
        lines.refresh()
    lines.end_line()
    assert capsys.readouterr().err == (
        "[trainport] Downloading: Downloading input data\n"
        f"\r\x1b[K[trainport] Downloading: {news[0]}"
        f"\r\x1b[K[trainport] Downloading: {news[1]}\n"
        "[trainport] Training: Training in progress\n"
    )
