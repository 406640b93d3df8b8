"""Jobs on a Ray cluster beside the same jobs on this machine, measured in one run.

Starts a real Ray cluster of ``--nodes`` nodes on this machine, each node in a network
namespace of its own (as the tests do; root only), then times, interleaved over
``--repeat`` rounds:

- **first line**: from the JobService call that submits a 2-host job until the first
  statement of algo-1's user script runs (it prints ``time.time()``, read back from the
  job's log);
- **total**: from that call until the job's record says Completed, for a script that does
  nothing else;

for the ray runner and for the local sandbox runner. Then a 2-host data-parallel job
(script mode, torchrun, gloo, an MLP on synthetic data) reports samples/s on the namespace
nodes (ray) beside the same job on this machine (sandbox, two loopback hosts). Both run on
the same cores: on one machine the figure shows what placement and the namespace network
cost, not what a second machine would add.

    python benchmarks/ray_jobs.py --repeat 5

The load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.on_ray.cluster

NOOP = "import time; print(repr(time.time()), flush=True)\n"

DDP = """
import argparse, os, time
import torch, torch.distributed as dist
from torch import nn
p = argparse.ArgumentParser()
p.add_argument('--steps', type=int, default=60)
p.add_argument('--batch', type=int, default=64)
args = p.parse_args()
dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                  nn.Linear(1024, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(args.batch, 512), torch.randint(0, 10, (args.batch,))
def step():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(10):
    step()
dist.barrier()
start = time.perf_counter()
for _ in range(args.steps):
    step()
dist.barrier()
took = time.perf_counter() - start
if rank == 0:
    print(f'samples_per_s={world * args.batch * args.steps / took:.1f}', flush=True)
dist.destroy_process_group()
"""


def two_hosts(name: str, script: Path) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-benchmark",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "ContainerEntrypoint": [sys.executable, "-u", str(script)],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://out/jobs"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }


def wait_end(service: Any, name: str, timeout: float = 300) -> tuple[float, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.get(name)
        if record.status in ("Completed", "Failed", "Stopped"):
            return time.time(), record.status
        time.sleep(0.01)
    raise RuntimeError(f"job {name} did not end in {timeout} s")


def noop_round(service: Any, name: str, script: Path, runner: str) -> tuple[float, float]:
    start = time.time()
    service.create(two_hosts(name, script), runner=runner)
    end, status = wait_end(service, name)
    if status != "Completed":
        raise RuntimeError(f"{name}: {status} {service.get(name).failure_reason}")
    first = min(float(t) for _, t in service.logs(name, host="algo-1") if t[:1].isdigit())
    return first - start, end - start


def ddp_job(home: Path, name: str, src: Path) -> dict[str, Any]:
    from trainport.host.script_mode import pack_sourcedir

    key = home / "store" / "code" / name / "sourcedir.tar.gz"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(pack_sourcedir(src, "ddp.py"))
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-benchmark",
        "AlgorithmSpecification": {"TrainingImage": "pytorch", "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": '"ddp.py"',
            "sagemaker_submit_directory": f'"s3://code/{name}/sourcedir.tar.gz"',
            "sagemaker_torch_distributed_enabled": "true",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://out/jobs"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }


def ddp_round(service: Any, home: Path, name: str, src: Path, runner: str) -> float:
    service.create(ddp_job(home, name, src), runner=runner)
    _, status = wait_end(service, name)
    if status != "Completed":
        raise RuntimeError(f"{name}: {status} {service.get(name).failure_reason}")
    for _, text in service.logs(name, host="algo-1"):
        if text.startswith("samples_per_s="):
            return float(text.split("=")[1])
    raise RuntimeError(f"{name}: no samples_per_s line")


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} (min {min(values):.3f}, max {max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()

    from tests.on_ray.cluster import NamespaceCluster

    work = Path(tempfile.mkdtemp(prefix="trainport-bench-ray-"))
    home = work / "home"
    os.environ.update(
        TRAINPORT_HOME=str(home),
        TRAINPORT_STOP_GRACE_SECONDS="10",
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
    )
    print(f"load average at start: {os.getloadavg()}, {os.cpu_count()} CPUs")
    started = time.monotonic()
    cluster = NamespaceCluster(work / "cluster", nodes=args.nodes, cpus=2).start()
    print(f"cluster of {args.nodes} namespace nodes up in {time.monotonic() - started:.1f} s")
    try:
        os.environ["RAY_ADDRESS"] = cluster.address
        from trainport.config import load_settings
        from trainport.jobs.service import JobService

        service = JobService(load_settings())
        script = work / "noop.py"
        script.write_text(NOOP)
        src = work / "src"
        src.mkdir()
        (src / "ddp.py").write_text(DDP)
        runners = ("sandbox", "ray")
        first: dict[str, list[float]] = {r: [] for r in runners}
        total: dict[str, list[float]] = {r: [] for r in runners}
        samples: dict[str, list[float]] = {r: [] for r in runners}
        for k in range(args.repeat):
            for runner in runners:
                f, t = noop_round(service, f"noop-{runner}-{k}", script, runner)
                first[runner].append(f)
                total[runner].append(t)
        for k in range(max(1, args.repeat // 2)):
            for runner in runners:
                samples[runner].append(ddp_round(service, home, f"ddp-{runner}-{k}", src, runner))
    finally:
        import ray

        ray.shutdown()  # this process's own connection: submitting checks the cluster's size
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n2-host no-op job, seconds, median of {args.repeat} (interleaved):")
    print(f"{'runner':<10} {'submit -> first line':<36} {'submit -> Completed':<36}")
    for runner in runners:
        print(f"{runner:<10} {summary(first[runner]):<36} {summary(total[runner]):<36}")
    ratio = statistics.median(total["ray"]) / statistics.median(total["sandbox"])
    print(f"ray total / local total: {ratio:.2f}x")
    print(
        f"\n2-host DDP (torchrun, gloo, 1 process per host), samples/s, median of "
        f"{len(samples['ray'])}:"
    )
    for runner in runners:
        where = "two namespace nodes (ray)" if runner == "ray" else "this machine (sandbox)"
        print(f"{where:<30} {statistics.median(samples[runner]):9.1f}  {samples[runner]}")
    ddp_ratio = statistics.median(samples["ray"]) / statistics.median(samples["sandbox"])
    print(f"ray / local: {ddp_ratio:.2f}x")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
