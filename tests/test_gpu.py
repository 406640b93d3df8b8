"""On a machine with CUDA: the hook on GPU gradients, NCCL jobs, GPUs split between hosts.

Every test here needs a CUDA device and skips without one, in CI too (CI machines have no
GPU); run them with ``pytest -m gpu`` on a machine that has one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import put, require_module, wait_for
from tests.distributed.support import launch
from tests.test_script_mode_job import script_job
from trainport.jobs.service import JobService

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

torch = require_module("torch")


def gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def cuda() -> int:
    count = gpus()
    if count == 0:
        pytest.skip("no CUDA device")
    return count


def test_balanced_hook_on_cuda_gradients_over_gloo_equals_ddp(cuda: int, tmp_path: Path) -> None:
    """Two ranks share one GPU on gloo: buckets go through pinned host memory."""
    reports = launch(
        2,
        "gradients,traffic",
        tmp_path,
        timeout=300,
        args={
            "device": "cuda:0",
            "backend": "gloo",
            "algorithms": ["balanced", "ring", "balanced:collectives"],
        },
    )
    for report in reports:
        diffs = report["gradients"]["diff"]
        assert max(diffs.values()) <= 1e-6, diffs
        traffic = report["traffic"]
        expected = 2 * (2 - 1) / 2 * traffic["bucket_bytes"]
        for measured in ("sent", "received", "kernel_written"):
            assert traffic[measured] == pytest.approx(expected, rel=0.05), (measured, traffic)


def test_balanced_hook_on_nccl_equals_ddp(cuda: int, tmp_path: Path) -> None:
    """With NCCL (one GPU per rank) the reduction stays on the GPUs."""
    if cuda < 2:
        pytest.skip("NCCL needs a GPU per rank: this machine has one")
    reports = launch(
        2,
        "gradients",
        tmp_path,
        timeout=300,
        args={"device": "cuda", "algorithms": ["balanced", "ring"]},
    )
    for report in reports:
        assert max(report["gradients"]["diff"].values()) <= 1e-6, report["gradients"]


NCCL_TRAIN = """
import json, os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from trainport.distributed import init_process_group

topology = init_process_group()
device = torch.device("cuda", torch.cuda.current_device())
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[device.index])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(64, 16, device=device)
y = x.sum(dim=1, keepdim=True)
first = None
for step in range(50):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    first = loss.item() if first is None else first
on_gpu = torch.ones(1, device=device)
dist.all_reduce(on_gpu)  # NCCL
on_cpu = torch.ones(1)
dist.all_reduce(on_cpu)  # gloo, in the same default group
print("RESULT " + json.dumps({
    "backend": str(dist.get_backend()),
    "world": dist.get_world_size(),
    "gpu_sum": on_gpu.item(), "cpu_sum": on_cpu.item(),
    "first": first, "last": loss.item(),
}), flush=True)
"""


def test_script_mode_job_trains_on_cuda_with_nccl(
    cuda: int, home: Path, service: JobService
) -> None:
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, "nccl-job", {"train.py": NCCL_TRAIN}, "train.py")
    body["ResourceConfig"] = {
        "InstanceType": "ml.p4d.24xlarge",
        "InstanceCount": 1,
        "VolumeSizeInGB": 1,
    }
    body["Tags"] = [{"Key": "trainport:distribution", "Value": "torchrun"}]
    service.create(body, runner="process")
    record = wait_for(service, "nccl-job", timeout=600)
    assert record.status == "Completed", record.failure_reason
    results = [
        json.loads(raw)
        for _, text in service.logs("nccl-job")
        for raw in re.findall(r"RESULT (\{[^}]*\})", text)
    ]
    assert len(results) == cuda  # one rank per GPU
    for result in results:
        assert "cuda:nccl" in result["backend"] and "cpu:gloo" in result["backend"]
        assert result["gpu_sum"] == result["cpu_sum"] == result["world"] == cuda
        assert result["last"] < result["first"]


SPLIT_PROBE = """
import json, os, torch
print("PROBE " + json.dumps({
    "host": os.environ["SM_CURRENT_HOST"],
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "devices": torch.cuda.device_count(),
    "names": [torch.cuda.get_device_properties(i).uuid.hex for i in range(torch.cuda.device_count())],
    "sm_num_gpus": int(os.environ["SM_NUM_GPUS"]),
}), flush=True)
"""


def test_two_hosts_split_the_machines_gpus(cuda: int, home: Path, service: JobService) -> None:
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, "gpu-split", {"probe.py": SPLIT_PROBE}, "probe.py")
    body["ResourceConfig"] = {
        "InstanceType": "ml.p3.8xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    service.create(body, runner="process")
    record = wait_for(service, "gpu-split", timeout=300)
    assert record.status == "Completed", record.failure_reason
    docs = {}
    for host in ("algo-1", "algo-2"):
        (raw,) = [
            m
            for _, t in service.logs("gpu-split", host=host)
            for m in re.findall(r"PROBE (\{.*\})", t)
        ]
        docs[host] = json.loads(raw)
    if cuda >= 2:
        each = cuda // 2
        for doc in docs.values():
            assert doc["devices"] == doc["sm_num_gpus"] == each
        assert not set(docs["algo-1"]["names"]) & set(docs["algo-2"]["names"])
    else:
        # One GPU, two hosts: each host gets it, in turn, and the status says so.
        for doc in docs.values():
            assert doc["devices"] == doc["sm_num_gpus"] == 1
        assert any("share 1 GPU" in t.message for t in record.transitions), record.transitions
