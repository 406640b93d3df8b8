"""SIGKILL of the server loses nothing: the running job goes on under its own supervisor,
the queued job starts once a server is back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tests.server.conftest import KEY_ID, SECRET, TRAIN, job, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainport.cli", "server", "--port", str(port), "--max-jobs", "1"],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)


def test_sigkill_of_the_server_loses_nothing(server_home: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "server.log"
    sm: Any = boto3.client(
        "sagemaker",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        config=Config(retries={"max_attempts": 1}),
    )
    slow = "import time\nprint('started', flush=True)\ntime.sleep(4)\nprint('loss=0.5')"
    proc = _start(port, log)
    try:
        sm.create_training_job(**job("survivor", slow))
        sm.create_training_job(**job("queued", TRAIN))
        wait_for(sm, "survivor", ("Training",))
        assert sm.describe_training_job(TrainingJobName="queued")["SecondaryStatus"] == "Pending"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(1)
    proc = _start(port, log)
    try:
        survivor = wait_for(sm, "survivor")
        queued = wait_for(sm, "queued")
        assert survivor["TrainingJobStatus"] == "Completed", survivor.get("FailureReason")
        assert queued["TrainingJobStatus"] == "Completed", queued.get("FailureReason")
        assert queued["TrainingStartTime"] >= survivor["TrainingEndTime"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
