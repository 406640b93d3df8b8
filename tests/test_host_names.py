"""Every name in a job's hosts resolves for every process of the job, under every runner.

The symptoms these guard against: under the process runner, a script calling
``init_process_group()`` from SageMaker's variables spent minutes failing to look up
``algo-1``, and the sagemaker-training toolkit's entry point waited 15 minutes for its
host names before failing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import put, require, require_module, wait_for
from tests.test_script_mode_job import script_job
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem

TOOLKIT_WAIT = """
import json, os, socket
from sagemaker_training import entry_point, environment
entry_point._wait_hostname_resolution()  # the toolkit's own wait: retries for 15 minutes
hosts = environment.Environment().hosts
print("NAMES " + json.dumps({h: socket.gethostbyname(h) for h in hosts}), flush=True)
"""

SAGEMAKER_GROUP = """
import json, os
import torch
import torch.distributed as dist
from trainport.distributed import init_process_group

topology = init_process_group()  # SM_HOSTS / SM_CURRENT_HOST: master algo-1:7777
total = torch.tensor([float(topology.rank + 1)])
dist.all_reduce(total)
print("GROUP " + json.dumps({"rank": topology.rank, "world": topology.world_size, "sum": total.item()}), flush=True)
dist.destroy_process_group()
"""


def two_host_job(home: Path, name: str, code: str) -> dict[str, object]:
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, name, {"probe.py": code}, "probe.py")
    body["ResourceConfig"] = {
        "InstanceType": "ml.m5.large",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    # A name that does not resolve must fail the job, not hang the test for 15 minutes.
    body["StoppingCondition"] = {"MaxRuntimeInSeconds": 90}
    return body


def lines(service: JobService, name: str, host: str, tag: str) -> list[dict[str, object]]:
    return [
        json.loads(raw)
        for _, text in service.logs(name, host=host)
        for raw in re.findall(rf"{tag} (\{{.*\}})", text)
    ]


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_the_toolkits_host_name_wait_passes(home: Path, service: JobService, runner: str) -> None:
    require_module("sagemaker_training")
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    name = f"names-{runner}"
    service.create(two_host_job(home, name, TOOLKIT_WAIT), runner=runner)
    record = wait_for(service, name, timeout=180)
    assert record.status == "Completed", record.failure_reason
    seen = {host: lines(service, name, host, "NAMES") for host in ("algo-1", "algo-2")}
    for host, (names,) in seen.items():
        assert sorted(names) == ["algo-1", "algo-2"], host
        assert names["algo-1"] != names["algo-2"]  # each host its own address


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_init_process_group_from_sagemakers_variables(
    home: Path, service: JobService, runner: str
) -> None:
    require_module("torch")
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    name = f"smgroup-{runner}"
    service.create(two_host_job(home, name, SAGEMAKER_GROUP), runner=runner)
    record = wait_for(service, name, timeout=180)
    assert record.status == "Completed", record.failure_reason
    reports = [r for h in ("algo-1", "algo-2") for r in lines(service, name, h, "GROUP")]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["world"] == 2 and r["sum"] == 3.0 for r in reports)
