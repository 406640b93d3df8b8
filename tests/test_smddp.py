"""SageMaker's distributed data parallel (SMDDP) through the SDK's own hyperparameters.

Real 2-host jobs through the ``trainport`` command line: mpirun over both hosts, every rank
running a script written as AWS's guide writes it (the ``smddp`` backend, or the older
``smdistributed.dataparallel.torch.distributed`` API), unchanged. The refusals and the pure
launch decisions are checked without a job.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from trainport.errors import ValidationError
from trainport.host import mpi, smddp
from trainport.spec import parse_request

TRAINPORT = [sys.executable, "-m", "trainport.cli"]

# The SDK's hyperparameters for distribution={"smdistributed": {"dataparallel": {...}}},
# JSON-encoded as it sends them.
SDK_HPS = {
    "sagemaker_distributed_dataparallel_enabled": "true",
    "sagemaker_instance_type": '"ml.c5.xlarge"',
    "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x TRAINPORT_TEST_MARK=reached"',
}

# What every rank reports: placement, an all-reduce of rank + 1, and its replica's weights
# after three DDP steps on data of its own.
REPORT = """
import hashlib, json, os, socket
def report(rank, world, local_rank, local_size, model, total):
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print("RANK " + json.dumps({
        "rank": rank, "world": world, "local_rank": local_rank, "local_size": local_size,
        "host": os.environ["SM_CURRENT_HOST"], "total": total,
        "weights": hashlib.sha256(weights).hexdigest(),
        "mark": os.environ.get("TRAINPORT_TEST_MARK"),
        "instance": os.environ.get("SAGEMAKER_INSTANCE_TYPE"),
    }), flush=True)
"""

BACKEND_STYLE = (
    REPORT
    + """
import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="smddp")
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])
torch.manual_seed(rank)  # different initial weights: DDP's broadcast makes them one
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
report(rank, world, local_rank, int(os.environ["LOCAL_WORLD_SIZE"]), model, t.item())
"""
)

OLDER_API = (
    REPORT
    + """
import torch
import smdistributed.dataparallel.torch.distributed as dist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

dist.init_process_group()
rank = dist.get_rank()
if os.environ.get("FAIL_RANK") == str(rank):
    raise ValueError(f"rank {rank} gives up")
torch.manual_seed(rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
report(rank, dist.get_world_size(), dist.get_local_rank(), dist.get_local_size(), model, t.item())
"""
)


def tp(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=timeout)


def _needs_mpi() -> None:
    require(
        shutil.which("mpirun") is not None, "OpenMPI is not installed (apt-get install openmpi-bin)"
    )
    require(mpi.has_mpi4py(), "mpi4py is not installed")


def run_job(
    tmp_path: Path, name: str, script: str, hps: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text(script)
    args = [
        "run", "--name", name, "--entry-point", "train.py", "--source-dir", str(src),
        "--instance-count", "2", *extra,
    ]  # fmt: skip
    for key, value in hps.items():
        args += ["--hp", f"{key}={value}"]
    return tp(*args)


def rank_reports(name: str) -> list[dict[str, Any]]:
    found = []
    for host in ("algo-1", "algo-2"):
        text = tp("jobs", "logs", name, "--host", host).stdout
        found += [
            dict(json.loads(raw), logged_on=host) for raw in re.findall(r"RANK (\{.*\})", text)
        ]
    return sorted(found, key=lambda r: r["rank"])


def assert_one_job(reports: list[dict[str, Any]], per_host: int) -> None:
    world = 2 * per_host
    assert [r["rank"] for r in reports] == list(range(world)), reports
    for r in reports:
        assert r["world"] == world and r["local_size"] == per_host
        assert r["local_rank"] == r["rank"] % per_host
        assert r["host"] == r["logged_on"] == f"algo-{r['rank'] // per_host + 1}"
        assert r["total"] == world * (world + 1) / 2  # the all-reduce summed every rank
    assert len({r["weights"] for r in reports}) == 1  # replicas identical after DDP steps


@pytest.mark.slow
def test_backend_style_two_hosts_with_the_sdks_hyperparameters(home: Path, tmp_path: Path) -> None:
    _needs_mpi()
    done = run_job(
        tmp_path,
        "smddp-backend",
        BACKEND_STYLE,
        {**SDK_HPS, "sagemaker_mpi_num_of_processes_per_host": "2"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reports = rank_reports("smddp-backend")
    assert_one_job(reports, per_host=2)
    assert {r["mark"] for r in reports} == {"reached"}  # the custom MPI options
    assert {r["instance"] for r in reports} == {"ml.c5.xlarge"}


@pytest.mark.slow
def test_older_api_pytorchddp_one_process_per_cpu_host(home: Path, tmp_path: Path) -> None:
    _needs_mpi()
    # The PyTorch container's own flag for distribution={"pytorchddp": ...}; the process
    # runner here (the others take the default, a sandbox where there is one).
    hps = {"sagemaker_pytorch_ddp_enabled": "true"}
    done = run_job(tmp_path, "smddp-older", OLDER_API, hps, "--runner", "process")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert_one_job(rank_reports("smddp-older"), per_host=1)


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_job_naming_rank_and_host(home: Path, tmp_path: Path) -> None:
    _needs_mpi()
    done = run_job(
        tmp_path,
        "smddp-fails",
        OLDER_API,
        {**SDK_HPS, "sagemaker_mpi_num_of_processes_per_host": "2"},
        "--env",
        "FAIL_RANK=3",
    )
    assert done.returncode != 0
    reason = json.loads(tp("jobs", "describe", "smddp-fails").stdout)["FailureReason"]
    assert "rank 3 on host algo-2" in reason, reason
    assert "ValueError: rank 3 gives up" in reason, reason


def test_model_parallel_is_refused_at_submission(home: Path, tmp_path: Path) -> None:
    done = run_job(
        tmp_path,
        "smp",
        "print('never')\n",
        {"sagemaker_mpi_enabled": "true", "mp_parameters": '{"partitions": 2}'},
    )
    assert done.returncode != 0
    assert "smdistributed.modelparallel" in done.stderr and "mp_parameters" in done.stderr


# -- the launch's decisions, read without a job ------------------------------------------------


def _spec(hps: dict[str, str], tags: dict[str, str] | None = None, count: int = 2) -> Any:
    body: dict[str, Any] = {
        "TrainingJobName": "decide",
        "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "x"},
        "HyperParameters": {
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": '"s3://b/k.tar.gz"',
            **hps,
        },
        "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
        "ResourceConfig": {
            "InstanceType": "ml.p3.16xlarge",
            "InstanceCount": count,
            "VolumeSizeInGB": 1,
        },
        "RoleArn": "arn:aws:iam::000000000000:role/r",
        "StoppingCondition": {"MaxRuntimeInSeconds": 60},
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
    }
    return parse_request(body)


def test_launch_settings_follow_the_toolkits_runner() -> None:
    spec = _spec(
        {
            **SDK_HPS,
            "sagemaker_distributed_dataparallel_custom_mpi_options": '"--NCCL_DEBUG WARN -x A=1"',
        }
    )
    settings = smddp.mpi_settings(spec)
    assert settings is not None and settings.processes_per_host is None  # one per GPU, else 1
    options = list(settings.custom_options)
    for export in (
        "SMDATAPARALLEL_USE_HOMOGENEOUS=1", "SMDATAPARALLEL_SERVER_ADDR=algo-1",
        "SMDATAPARALLEL_SERVER_PORT=7592", "SAGEMAKER_INSTANCE_TYPE=ml.c5.xlarge",
        "NCCL_DEBUG=WARN", "A=1",
    ):  # fmt: skip
        assert options[options.index(export) - 1] == "-x", export
    one = smddp.mpi_settings(_spec({"sagemaker_pytorch_ddp_enabled": "true"}, count=1))
    assert one is not None and "SMDATAPARALLEL_USE_SINGLENODE=1" in one.custom_options
    assert "SAGEMAKER_INSTANCE_TYPE=ml.p3.16xlarge" in one.custom_options  # InstanceType's
    tagged = smddp.mpi_settings(
        _spec({}, {"trainport:distribution": "smddp", "trainport:processes-per-host": "3"})
    )
    assert tagged is not None and tagged.processes_per_host == 3
    assert smddp.mpi_settings(_spec({"sagemaker_mpi_enabled": "true"})) is None
    # One process per GPU of the host's share, at most the instance type's GPUs; 1 on CPUs.
    assert settings.processes_on(8) == 1 and settings.processes_on(0) == 1  # ml.c5.xlarge
    assert one.processes_on(8) == 8 and one.processes_on(2) == 2  # ml.p3.16xlarge: 8 GPUs
    p3 = smddp.mpi_settings(_spec({**SDK_HPS, "sagemaker_instance_type": '"ml.p3.2xlarge"'}))
    assert p3 is not None and p3.processes_on(4) == 1
    assert tagged.processes_on(8) == 3


@pytest.mark.parametrize(
    ("hps", "said"),
    [
        ({"mp_parameters": "{}"}, "smdistributed.modelparallel"),
        ({**SDK_HPS, "sagemaker_torch_distributed_enabled": "true"}, "torchrun"),
        ({**SDK_HPS, "sagemaker_mpi_enabled": "true"}, "SMDDP already launches with mpirun"),
        ({**SDK_HPS, "sagemaker_mpi_num_of_processes_per_host": "0"}, "from 1 to 64"),
        (
            {**SDK_HPS, "sagemaker_distributed_dataparallel_custom_mpi_options": '"-x \\"A"'},
            "cannot split",
        ),
    ],
)
def test_refusals_name_the_setting(hps: dict[str, str], said: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(said)):
        smddp.check(_spec(hps), "train.py")


def test_the_face_defers_to_a_real_smdistributed(tmp_path: Path) -> None:
    real = tmp_path / "real" / "smdistributed" / "dataparallel"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    probe = "import smdistributed.dataparallel as d; print(getattr(d, 'REAL', False))"
    env_path = f"{smddp.SITE}:{tmp_path / 'real'}"  # trainport's first: the real one still wins
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": env_path},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "True"
    alone = subprocess.run(
        [sys.executable, "-c", probe + "; d.REAL"],
        env={"PYTHONPATH": str(smddp.SITE)},
        capture_output=True,
        text=True,
    )
    assert alone.stdout.strip() == "False"
    assert (
        "UnsupportedFeatureError" in alone.stderr
        and "smdistributed.dataparallel.REAL" in alone.stderr
    )


CUDA_STYLE = (
    REPORT.replace("p.detach().numpy()", "p.detach().cpu().numpy()")
    + """
import torch
import torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="smddp")
rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank % torch.cuda.device_count())
torch.cuda.set_device(device)
torch.manual_seed(rank)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
model = DDP(net.to(device), device_ids=[device.index])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    opt.zero_grad()
    model(torch.randn(16, 32, device=device)).pow(2).mean().backward()
    opt.step()
t = torch.tensor([float(rank + 1)], device=device)
dist.all_reduce(t)  # a CUDA tensor, over the smddp backend
report(rank, dist.get_world_size(), local_rank, int(os.environ["LOCAL_WORLD_SIZE"]), model, t.item())
"""
)


@pytest.mark.gpu
@pytest.mark.slow
def test_cuda_gradients_two_hosts(home: Path, tmp_path: Path) -> None:
    """On a machine with CUDA: buckets of CUDA gradients reduced through pinned host memory."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    _needs_mpi()
    hps = {**SDK_HPS, "sagemaker_instance_type": '"ml.p3.8xlarge"'}  # up to 4 GPUs a host
    done = run_job(tmp_path, "smddp-cuda", CUDA_STYLE, hps)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # One process per GPU of each host's share (hosts share a single GPU in turn).
    reports = rank_reports("smddp-cuda")
    per_host = len(reports) // 2
    assert per_host >= 1
    assert_one_job(reports, per_host=per_host)


# -- how smddp reduces a DDP model -------------------------------------------------------------


def test_the_reduction_follows_the_hosts() -> None:
    from trainport.distributed import torchrun_topology
    from trainport.distributed.reduction import Algorithm
    from trainport.distributed.smddp.api import reduction_for

    def on(hosts: int, per_host: int, on_world: bool = True) -> Algorithm | None:
        return reduction_for(torchrun_topology(hosts, per_host, 0, 0, "h", 1), on_world)

    # Several ranks on each of several hosts: sum within the host first.
    assert on(2, 2) is Algorithm.HIERARCHICAL and on(4, 8) is Algorithm.HIERARCHICAL
    # One rank per host, or one host: the group's own ring, no hook.
    assert on(4, 1) is None and on(1, 4) is None
    assert on(2, 2, on_world=False) is None  # the hierarchy's groups span the whole job


def test_the_fusion_buffer_is_sized_to_the_model() -> None:
    from trainport.distributed.smddp.api import fusion_bucket_mb

    assert fusion_bucket_mb(16 * 2**20) == 2.0  # an eighth of the gradients
    assert fusion_bucket_mb(1000) == 1.0  # never below DDP's first bucket, 1 MiB
    assert fusion_bucket_mb(10 * 2**30) == 25.0  # nor above DDP's own default


FUSION_PROBE = """
import os, torch, torch.distributed as dist
import smdistributed.dataparallel.torch.torch_smddp
from torch.nn.parallel import DistributedDataParallel as DDP
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group(backend="smddp")
net = torch.nn.Sequential(*(torch.nn.Linear(512, 512, bias=False) for _ in range(16)))  # 16 MiB
mine = DDP(net)
given = DDP(net, None, None, 0, None, True, None, 4)  # bucket_cap_mb by position
gloo = DDP(net, process_group=dist.new_group(backend="gloo"))
print(mine.bucket_bytes_cap, given.bucket_bytes_cap, gloo.bucket_bytes_cap)
print(getattr(mine, "_trainport_reducer", None))
"""


def test_ddp_on_smddp_gets_the_fusion_buffer_unless_the_script_sets_one() -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", FUSION_PROBE],
        env={"PYTHONPATH": str(smddp.SITE), "PORT": str(port), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sizes, reducer = done.stdout.splitlines()
    # smddp's own size (2 MiB for 16 MiB of gradients); the script's 4 MiB; plain DDP's 25.
    assert sizes.split() == [str(2 * 2**20), str(4 * 2**20), str(25 * 2**20)]
    assert reducer == "None"  # one host of one rank: the ring inside the backend
