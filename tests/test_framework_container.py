"""Script mode plays the framework container the image URI names, variables included.

The job test runs a script written the way the PyTorch training toolkit's own MNIST test
script is (its test_mnist_cpu: two hosts, gloo, no launcher): each host joins with
``init_process_group(rank=hosts.index(current_host), world_size=len(hosts))`` and nothing
else, which works only if the container's MASTER_ADDR and MASTER_PORT are set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import put, require, require_module, wait_for
from tests.test_script_mode_job import script_job
from trainport.host import frameworks
from trainport.host.frameworks import Framework, FrameworkImage, parse_image_uri
from trainport.jobs.service import JobService
from trainport.runners import netns
from trainport.runners.sandbox import sandbox_problem

ECR = "763104351884.dkr.ecr.us-east-1.amazonaws.com"
SKLEARN_ECR = "683313688378.dkr.ecr.us-east-1.amazonaws.com"


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            f"{ECR}/pytorch-training:2.3.0-cpu-py311-ubuntu20.04-sagemaker",
            (Framework.PYTORCH, "2.3.0", "3.11", "cpu"),
        ),
        (f"{ECR}/pytorch-training:2.3", (Framework.PYTORCH, "2.3", None, "cpu")),
        (
            f"{ECR}/tensorflow-training:2.14.1-gpu-py310-cu118-ubuntu20.04-sagemaker",
            (Framework.TENSORFLOW, "2.14.1", "3.10", "gpu"),
        ),
        (
            f"{SKLEARN_ECR}/sagemaker-scikit-learn:1.2-1-cpu-py3",
            (Framework.SKLEARN, "1.2-1", "3", "cpu"),
        ),
        (f"{SKLEARN_ECR}/sagemaker-xgboost:1.7-1", (Framework.XGBOOST, "1.7-1", None, "cpu")),
        ("pytorch-training:2.1.0-cpu-py310", (Framework.PYTORCH, "2.1.0", "3.10", "cpu")),
    ],
)
def test_framework_image_uris(uri: str, expected: tuple[Framework, str, str, str]) -> None:
    image = parse_image_uri(uri)
    assert image == FrameworkImage(uri, *expected)


@pytest.mark.parametrize(
    "uri",
    [
        None,
        "",
        "framework",
        "/srv/images/train-folder",
        "localhost:5000/pytorch-training",  # a registry port, no tag
        "docker.io/library/python:3.11",
        f"{ECR}/pytorch-training:latest",
    ],
)
def test_other_images_name_no_framework(uri: str | None) -> None:
    assert parse_image_uri(uri) is None


def test_pytorch_variables_as_its_toolkit_sets_them() -> None:
    contract = {
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_TRAINING_ENV": json.dumps({"master_hostname": "algo-1"}),
        "SM_NETWORK_INTERFACE_NAME": "eth0",
    }
    env = frameworks.container_variables(Framework.PYTORCH, contract, torch="2.3.0+cpu")
    assert env == {
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "7777",
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_DISABLE": "1",
        "NCCL_DEBUG": "WARN",
        "SM_DLC_TORCH_VERSION": "2.3.0+cpu",
    }
    assert frameworks.container_variables(Framework.SKLEARN, contract) == {}
    assert frameworks.framework_of(None) is Framework.PYTORCH
    assert frameworks.framework_of("pytorch") is Framework.PYTORCH  # a short name
    assert (
        frameworks.framework_of(SKLEARN_ECR + "/sagemaker-scikit-learn:1.2-1") is Framework.SKLEARN
    )


def test_the_interface_hyperparameter_wins_where_the_host_has_it() -> None:
    have = frozenset({"lo", "eth0"})
    assert frameworks.choose_interface("eth0", {}, have) == ("eth0", None)
    assert (
        frameworks.choose_interface("eth0", {"sagemaker_network_interface_name": '"lo"'}, have)[0]
        == "lo"
    )
    chosen, note = frameworks.choose_interface(
        "lo", {"sagemaker_network_interface_name": '"ethwe"'}, have
    )
    assert chosen == "lo"
    assert note is not None and "'ethwe'" in note and "eth0, lo" in note


# Written after the toolkit's mnist.py: argparse defaults from the toolkit's Environment,
# a DistributedSampler, gradients averaged by hand on CPU, the model saved to model_dir.
TOOLKIT_STYLE = """
import argparse, json, os, socket
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed
from sagemaker_training import environment

VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NCCL_IB_DISABLE", "NCCL_DEBUG",
             "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "SM_DLC_TORCH_VERSION",
             "SM_NETWORK_INTERFACE_NAME")


def train(args):
    distributed = len(args.hosts) > 1 and args.backend is not None
    seen = {k: os.environ.get(k) for k in VARIABLES}
    seen.update(hostname=socket.gethostname(), torch=torch.__version__)
    print("VARS " + json.dumps(seen), flush=True)
    if distributed:
        rank = args.hosts.index(args.current_host)
        dist.init_process_group(backend=args.backend, rank=rank, world_size=len(args.hosts))
    rows = [list(map(float, line.split(","))) for line in open(os.path.join(args.data_dir, "rows.csv"))]
    data = torch.tensor(rows)
    dataset = torch.utils.data.TensorDataset(data[:, :-1], data[:, -1].long())
    sampler = torch.utils.data.distributed.DistributedSampler(dataset) if distributed else None
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if distributed:
                for p in model.parameters():
                    dist.all_reduce(p.grad.data, op=dist.ReduceOp.SUM)
                    p.grad.data /= dist.get_world_size()
            optimizer.step()
    total = sum(float(p.sum()) for p in model.parameters())
    print("RESULT " + json.dumps({"world": dist.get_world_size() if distributed else 1,
                                  "checksum": round(total, 6)}), flush=True)
    torch.save(model.state_dict(), os.path.join(args.model_dir, "model.pth"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", type=str, default=None)
    parser.add_argument("--epochs", type=int, default=1)
    env = environment.Environment()
    parser.add_argument("--hosts", type=list, default=env.hosts)
    parser.add_argument("--current-host", type=str, default=env.current_host)
    parser.add_argument("--model-dir", type=str, default=env.model_dir)
    parser.add_argument("--data-dir", type=str, default=env.channel_input_dirs["training"])
    train(parser.parse_args())
"""


def tagged(service: JobService, name: str, host: str, tag: str) -> list[dict[str, object]]:
    return [
        json.loads(raw)
        for _, text in service.logs(name, host=host)
        for raw in re.findall(rf"{tag} (\{{.*\}})", text)
    ]


def job_interface() -> str:
    """The interface a job's hosts talk over on this machine (see runners.netns)."""
    bridge = netns.netns_problem() is None and netns.firewall_problem() is None
    return "eth0" if bridge else "lo"


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["sandbox", "process"])
def test_toolkit_style_two_host_gloo_job_without_a_launcher(
    home: Path, service: JobService, runner: str
) -> None:
    torch = require_module("torch")
    require_module("sagemaker_training")
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    rows = "".join(f"{i % 3},{i % 5},{i % 7},{i % 2},{i % 2}\n" for i in range(64))
    put(home, "data", "training/rows.csv", rows)
    name = f"toolkit-mnist-{runner}"
    body = script_job(home, name, {"mnist.py": TOOLKIT_STYLE}, "mnist.py", backend='"gloo"')
    body["InputDataConfig"][0]["ChannelName"] = "training"  # type: ignore[index]
    body["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = "s3://data/training/"  # type: ignore[index]
    body["ResourceConfig"] = {
        "InstanceType": "ml.m5.large",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    body["StoppingCondition"] = {"MaxRuntimeInSeconds": 300}
    service.create(body, runner=runner)
    record = wait_for(service, name, timeout=300)
    assert record.status == "Completed", record.failure_reason
    interface = job_interface()
    results = []
    for host in ("algo-1", "algo-2"):
        (seen,) = tagged(service, name, host, "VARS")
        expected = {
            "MASTER_ADDR": "algo-1",
            "MASTER_PORT": "7777",
            "NCCL_IB_DISABLE": "1",
            "NCCL_DEBUG": "WARN",
            "NCCL_SOCKET_IFNAME": interface,
            "GLOO_SOCKET_IFNAME": interface,
            "SM_NETWORK_INTERFACE_NAME": interface,
            "SM_DLC_TORCH_VERSION": torch.__version__,
            "torch": torch.__version__,
        }
        assert {k: seen[k] for k in expected} == expected, host
        if runner == "sandbox":  # a UTS namespace of the host's own
            assert seen["hostname"] == host
        results += tagged(service, name, host, "RESULT")
    assert [r["world"] for r in results] == [2, 2]
    # Gradients averaged over both hosts: both ended with the same model.
    assert results[0]["checksum"] == results[1]["checksum"]


INTERFACE_PROBE = """
import json, os
print("IFACE " + json.dumps({k: os.environ.get(k) for k in
      ("SM_NETWORK_INTERFACE_NAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}), flush=True)
"""


@pytest.mark.parametrize("wanted", ["lo", "ethwe"])
def test_the_interface_hyperparameter_is_honoured_where_the_network_has_it(
    home: Path, service: JobService, wanted: str
) -> None:
    put(home, "data", "train/x.csv", "1\n")
    name = f"iface-{wanted}"
    body = script_job(
        home,
        name,
        {"probe.py": INTERFACE_PROBE},
        "probe.py",
        sagemaker_network_interface_name=json.dumps(wanted),
    )
    service.create(body, runner="process")
    record = wait_for(service, name)
    assert record.status == "Completed", record.failure_reason
    (seen,) = tagged(service, name, "algo-1", "IFACE")
    chosen = wanted if wanted == "lo" else job_interface()
    assert set(seen.values()) == {chosen}
    messages = [t.message for t in record.transitions]
    told = any(f"sagemaker_network_interface_name '{wanted}'" in m for m in messages)
    assert told is (wanted != "lo")


def test_tensorflow_variables_as_its_toolkit_sets_them() -> None:
    from trainport.host.script_mode import script_invocation

    def contract(host: str, **hps: str) -> dict[str, str]:
        _, env = script_invocation(
            base_dir=Path("/opt/ml"),
            hyperparameters={
                "sagemaker_program": '"train.py"',
                "sagemaker_submit_directory": '"s3://code/src.tar.gz"',
                "sagemaker_region": '"eu-west-1"',
                **hps,
            },
            resource_config={"hosts": ["algo-1", "algo-2"], "current_host": host},
            input_data_config={},
            python="python3",
            num_gpus=0,
            num_cpus=2,
        )
        return env

    plain = frameworks.container_variables(Framework.TENSORFLOW, contract("algo-1"))
    assert plain == {"TF_CPP_MIN_LOG_LEVEL": "1", "S3_USE_HTTPS": "1", "S3_REGION": "eu-west-1"}
    mwms = {"sagemaker_multi_worker_mirrored_strategy_enabled": "true"}
    second = frameworks.container_variables(Framework.TENSORFLOW, contract("algo-2", **mwms))
    assert json.loads(second["TF_CONFIG"]) == {
        "cluster": {"worker": ["algo-1:8890", "algo-2:8890"]},
        "environment": "cloud",
        "task": {"index": 1, "type": "worker"},
    }
