"""The command line as a user runs it: real `trainport` subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import put, request, wait_until

TRAINPORT = [sys.executable, "-m", "trainport.cli"]


def tp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=timeout)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def write_job(tmp_path: Path, body: dict[str, object], name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(body))
    return path


def test_run_a_yaml_job_streams_logs_and_exits_zero(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("print('hello from the job')\nprint('loss=0.25')\n")
    body = request("cli-yaml")
    body["AlgorithmSpecification"] = {
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["python3", str(script)],
        "MetricDefinitions": [{"Name": "loss", "Regex": "loss=([0-9.]+)"}],
    }
    done = tp("run", str(write_job(tmp_path, body)))
    assert done.returncode == 0, done.stderr
    assert "hello from the job" in done.stdout
    assert "[trainport] Training:" in done.stderr
    assert "Job cli-yaml: Completed (Completed)" in done.stderr
    assert "loss = 0.25" in done.stderr
    assert "model.tar.gz" in done.stderr
    described = json.loads(tp("jobs", "describe", "cli-yaml").stdout)
    assert described["TrainingJobStatus"] == "Completed"
    listed = tp("jobs", "list", "--status", "Completed").stdout
    assert "cli-yaml" in listed
    assert tp("jobs", "logs", "cli-yaml").stdout.splitlines() == ["hello from the job", "loss=0.25"]


def test_failed_job_exits_non_zero(home: Path, tmp_path: Path) -> None:
    body = request("cli-fail")
    body["AlgorithmSpecification"]["ContainerEntrypoint"] = ["python3", "-c", "raise SystemExit(4)"]
    done = tp("run", str(write_job(tmp_path, body)))
    assert done.returncode == 1
    assert "AlgorithmError: , exit code: 4" in done.stderr


def test_json_job_file_and_unknown_field_path(home: Path, tmp_path: Path) -> None:
    body = request("cli-json")
    body["ResourceConfig"]["InstanceCont"] = 1
    path = tmp_path / "job.json"
    path.write_text(json.dumps(body))
    done = tp("run", str(path))
    assert done.returncode == 2
    assert 'Unknown parameter in ResourceConfig: "InstanceCont"' in done.stderr
    assert tp("jobs", "describe", "cli-json").returncode == 2


def test_malformed_yaml(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("TrainingJobName: [unclosed\n")
    done = tp("run", str(path))
    assert done.returncode == 2 and f"the job file {path} is not valid YAML" in done.stderr


def test_script_mode_flags(home: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import os, sys, json\n"
        "print('argv', sys.argv[1:])\n"
        "print('files', sorted(os.listdir(os.environ['SM_CHANNEL_TRAIN'])))\n"
        "print('hps', json.loads(os.environ['SM_HPS']))\n"
    )
    put(home, "bucket", "prefix/data.csv", "1,2\n")
    done = tp(
        "run",
        "--name",
        "cli-script",
        "--entry-point",
        "train.py",
        "--source-dir",
        str(src),
        "--hp",
        "epochs=3",
        "--hp",
        "lr=0.1",
        "--channel",
        "train=s3://bucket/prefix",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "argv ['--epochs', '3', '--lr', '0.1']" in done.stdout
    assert "files ['data.csv']" in done.stdout
    assert "hps {'epochs': 3, 'lr': 0.1}" in done.stdout
    hps = json.loads(tp("jobs", "describe", "cli-script").stdout)["HyperParameters"]
    assert hps["epochs"] == "3" and hps["sagemaker_program"] == '"train.py"'


def test_missing_entry_point(home: Path, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    done = tp("run", "--entry-point", "nope.py", "--source-dir", str(tmp_path / "src"))
    assert done.returncode == 2
    assert "nope.py" in done.stderr


def test_detach_then_stop_and_logs_follow(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(
        "import time\nfor i in range(600):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"
    )
    body = request("cli-detach")
    body["AlgorithmSpecification"]["ContainerEntrypoint"] = ["python3", str(script)]
    done = tp("run", "--detach", str(write_job(tmp_path, body)))
    assert done.returncode == 0 and done.stdout.strip().endswith(":training-job/cli-detach")
    follower = subprocess.Popen(
        [*TRAINPORT, "jobs", "logs", "cli-detach", "--follow"], stdout=subprocess.PIPE, text=True
    )
    assert follower.stdout is not None
    assert follower.stdout.readline().startswith("tick")
    stopped = tp("jobs", "stop", "cli-detach", "--wait")
    assert stopped.returncode == 0 and "Stopped" in stopped.stderr
    follower.wait(timeout=30)  # --follow ends once the job has ended
    assert follower.returncode == 0


def test_ctrl_c_stops_the_job(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    body = request("cli-int")
    body["AlgorithmSpecification"]["ContainerEntrypoint"] = ["python3", str(script)]
    proc = subprocess.Popen(
        [*TRAINPORT, "run", str(write_job(tmp_path, body))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "Job cli-int: Stopped (Stopped)" in err


def test_cli_reports_orphans_on_next_command(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    body = request("cli-orphan")
    body["AlgorithmSpecification"]["ContainerEntrypoint"] = ["python3", str(script)]
    assert tp("run", "--detach", str(write_job(tmp_path, body))).returncode == 0
    log = home / "jobs" / "cli-orphan" / "logs" / "algo-1.log"
    wait_until(lambda: log.exists() and "up" in log.read_text(), what="job start")
    described = json.loads(tp("jobs", "describe", "cli-orphan").stdout)
    assert described["TrainingJobStatus"] == "InProgress"
    from trainport.jobs.db import JobDB

    pid = JobDB(home / "trainport.db").get("cli-orphan").supervisor[0]  # type: ignore[index]
    os.kill(pid, signal.SIGKILL)
    # The signal is delivered when the kernel next runs it: on a busy machine, later.
    wait_until(lambda: not _running(pid), what=f"supervisor {pid} to die")
    listed = tp("jobs", "list").stdout
    assert "cli-orphan  Failed" in listed


@pytest.mark.parametrize("flag", ["--hp", "--channel", "--env"])
def test_bad_pairs(home: Path, flag: str) -> None:
    done = tp("run", "--entry-point", "x.py", flag, "novalue")
    assert done.returncode == 2 and "KEY=VALUE" in done.stderr


def test_demo_without_torch_says_what_to_install_before_submitting(
    home: Path, tmp_path: Path
) -> None:
    """As after `pip install trainport` without the [torch] extra: torch cannot be imported."""
    hidden = tmp_path / "no-torch"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    env = {**os.environ, "PYTHONPATH": str(hidden)}
    done = subprocess.run(
        [*TRAINPORT, "demo", "--runner", "process"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'trainport[torch]'" in done.stderr
    assert sys.executable in done.stderr
    # Refused at submission: no dataset stored, no job made.
    assert not (home / "store" / "trainport-demo").exists()
    assert not (home / "jobs").exists()


def test_a_job_file_names_an_image_folder_relative_to_where_it_runs(
    home: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "images" / "mine"
    folder.mkdir(parents=True)
    (folder / "train").write_text('#!/bin/sh\necho "ran $0 $1"\n')
    (folder / "train").chmod(0o755)
    body = request("relative-image")
    body["AlgorithmSpecification"] = {"TrainingImage": "images/mine", "TrainingInputMode": "File"}
    path = write_job(tmp_path, body)
    done = subprocess.run(
        [*TRAINPORT, "run", str(path)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert f"ran {folder}/train train" in done.stdout
    described = json.loads(tp("jobs", "describe", "relative-image").stdout)
    assert described["AlgorithmSpecification"]["TrainingImage"] == str(folder)
