"""SIGKILL of the server mid-tuning loses nothing and runs no child twice: the children
running go on under their own supervisors, and the server started again takes the tuning
job up where it was."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.server.conftest import KEY_ID, SECRET
from tests.server.test_restart import _free_port, _start
from tests.server.tuning_support import children, put_source, tuning_request, wait_tuning
from trainport.tuning.spec import parse_tuning_request
from trainport.tuning.strategies import RandomSearch

pytestmark = pytest.mark.slow


def test_sigkill_mid_tuning_resumes_without_running_a_child_twice(
    server_home: Path, tmp_path: Path
) -> None:
    put_source(server_home, tmp_path)
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
    request = tuning_request(
        "resumed", "Random", max_jobs=4, parallel=2, RandomSeed=9, static={"pause": "1"}
    )
    proc = _start(port, log)
    try:
        sm.create_hyper_parameter_tuning_job(**request)
        deadline = time.monotonic() + 60
        while len(children(sm, "resumed")) < 2:
            assert time.monotonic() < deadline, "no children started"
            time.sleep(0.1)
        before = {k["TrainingJobName"] for k in children(sm, "resumed")}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = _start(port, log)
    try:
        d = wait_tuning(sm, "resumed")
        assert d["HyperParameterTuningJobStatus"] == "Completed", d
        kids = children(sm, "resumed")
        names = [k["TrainingJobName"] for k in kids]
        assert len(names) == 4 and len(set(names)) == 4
        assert before <= set(names)
        # The children the killed server started finished under their own supervisors.
        assert {k["TrainingJobStatus"] for k in kids} == {"Completed"}, kids
        # Each child ran once: one start of its training, each epoch once in its log.
        jobs = sm.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]
        assert sorted(j["TrainingJobName"] for j in jobs) == sorted(names)
        for name in names:
            text = (server_home / "jobs" / name / "logs" / "algo-1.log").read_text()
            assert [text.count(f"epoch={e} ") for e in range(3)] == [1, 1, 1], text
        # The values are those the seed gives, whichever server proposed them.
        search = RandomSearch(parse_tuning_request(request).definitions, 9)
        by_number = sorted(kids, key=lambda k: k["TrainingJobName"])
        assert [k["TunedHyperParameters"] for k in by_number] == [
            search.propose(i, [])[1] for i in range(4)
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
