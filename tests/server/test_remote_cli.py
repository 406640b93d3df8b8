"""The CLI against a running server (``--endpoint``): real ``trainport`` subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.server.conftest import TRAIN, job, wait_for

TRAINPORT = [sys.executable, "-m", "trainport.cli"]


def tp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=120)


def test_describe_through_the_server_prints_json(server: Any, sm: Any) -> None:
    sm.create_training_job(**job("remote-describe", TRAIN))
    wait_for(sm, "remote-describe")
    done = tp("--endpoint", server.url, "jobs", "describe", "remote-describe")
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert described["TrainingJobStatus"] == "Completed"
    # Timestamps print as epoch seconds, as they do without a server.
    assert isinstance(described["CreationTime"], float)
    assert isinstance(described["SecondaryStatusTransitions"][0]["StartTime"], float)
