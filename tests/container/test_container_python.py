"""Jobs in a real Python image (scripts/build-python-image.sh: Debian, Python 3, the
sagemaker-training toolkit and torch): script mode run by the toolkit inside the image, as
SageMaker's framework containers do; torchrun across two containers; and the contract
tests of image folders (examples/byoc) on an image."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import put, request, require, wait_for, wait_until
from tests.test_lifecycle import BYOC, SAVE_ON_TERM, byoc_job, members, transitions
from tests.test_script_mode_job import script_job
from trainport.host.command import code_to_stage, container_command
from trainport.jobs.service import JobService
from trainport.runners.api import Placement
from trainport.runners.container import container_argv, image_present
from trainport.spec import parse_request

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-python-image.sh"


@pytest.mark.parametrize(
    ("submit", "staged"),
    [("s3://code/j/sourcedir.tar.gz", True), ("/opt/ml/input/data/code/sourcedir.tar.gz", False)],
)
def test_a_source_dir_in_the_store_is_unpacked_by_the_platform_and_mounted(
    submit: str, staged: bool
) -> None:
    """Pure: which script-mode jobs get their code unpacked and mounted at /opt/ml/code (a
    path already inside the container, as the SDK sends with network isolation, does not)."""
    body = request(
        "j",
        AlgorithmSpecification={"TrainingImage": "img:1", "TrainingInputMode": "File"},
        HyperParameters={
            "sagemaker_program": '"train.py"',
            "sagemaker_submit_directory": json.dumps(submit),
        },
    )
    spec = parse_request(body)
    code = code_to_stage(spec)
    assert (str(code) if code else None) == (submit if staged else None)
    assert code_to_stage(parse_request(request("plain"))) is None
    command = container_command(spec, "/usr/bin/podman", "algo-1", "arn", (), None, staged)
    assert command.container is not None
    root = Path("/jobs/j/hosts/algo-1/opt_ml")
    argv = container_argv(command.container, Placement(root, root.parent / "hosts", (), {}, "/"))
    assert (f"{root}/code:/opt/ml/code" in argv) == staged


def python_image_tag() -> str:
    """The tag the build script gives the image for this machine (it owns the tag logic)."""
    done = subprocess.run([str(BUILD), "--tag"], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def podman() -> str:
    podman = shutil.which("podman")
    require(podman is not None, "podman is not installed (scripts/setup.sh --test)")
    require(os.geteuid() == 0, "these tests run podman as root")
    assert podman is not None
    return podman


@pytest.fixture(scope="module")
def python_image_in_podman(podman: str) -> str:
    tag = python_image_tag()
    require(
        image_present(podman, tag),
        f"the Python image {tag} is not in podman; build it with scripts/build-python-image.sh "
        "(scripts/setup.sh --test does)",
    )
    return tag


@pytest.fixture
def python_image(python_image_in_podman: str, podman: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The Python image's tag; podman is the engine the test's jobs use."""
    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", podman)
    return python_image_in_podman


def model(home: Path, uri: str) -> dict[str, bytes]:
    with tarfile.open(home / "store" / uri[len("s3://") :]) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def lines_of(service: JobService, name: str, host: str = "algo-1") -> list[str]:
    return [line for _, line in service.logs(name, host=host)]


# A script-mode entry point as a user writes it for a framework container: arguments from
# the hyperparameters, data and model folders from SM_* variables the toolkit sets.
TRAIN_SCRIPT = """
import argparse, json, os, sys
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
parser.add_argument("--label")
args = parser.parse_args()
with open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "x.csv")) as f:
    values = torch.tensor([float(v) for v in f.read().split(",")])
with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.json"), "w") as f:
    json.dump({"sum": (values.sum() * args.epochs).item(), "label": args.label,
               "host": os.environ["SM_CURRENT_HOST"]}, f)
print(f"trained by {sys.executable} with torch {torch.__version__} in {os.getcwd()}")
"""


def test_script_mode_runs_through_the_toolkit_in_the_image(
    home: Path, service: JobService, python_image: str
) -> None:
    put(home, "data", "train/x.csv", "1,2,4")
    body = script_job(
        home, "py-script", {"train.py": TRAIN_SCRIPT}, "train.py", epochs="3", label='"abc"'
    )
    body["AlgorithmSpecification"]["TrainingImage"] = python_image  # type: ignore[index]
    service.create(body)
    record = wait_for(service, "py-script", timeout=300)
    lines = lines_of(service, "py-script")
    assert record.status == "Completed", (record.failure_reason, lines)
    assert json.loads(model(home, str(record.model_artifacts))["model.json"]) == {
        "sum": 21.0,
        "label": "abc",
        "host": "algo-1",
    }
    # The image's own Python and torch ran it, from /opt/ml/code, started by the toolkit.
    assert "trained by /usr/bin/python3 with torch 2.13.0+cpu in /opt/ml/code" in lines
    assert any("Reporting training SUCCESS" in line for line in lines), lines
    # The platform had unpacked the code: the toolkit downloaded nothing.
    assert any("/opt/ml/code is not empty" in line for line in lines), lines
    assert any(f"running image {python_image} in" in t.message for t in record.transitions)


# torchrun on each host, as a user's launcher script for a framework container starts it:
# the node rank from the toolkit's SM_HOSTS and SM_CURRENT_HOST, algo-1 the rendezvous.
LAUNCH = """#!/bin/sh
set -e
rank=$(python3 -c 'import json, os; print(json.loads(os.environ["SM_HOSTS"]).index(os.environ["SM_CURRENT_HOST"]))')
exec torchrun --nnodes 2 --nproc_per_node 1 --node_rank "$rank" \\
  --master_addr algo-1 --master_port 29500 allreduce.py
"""
ALLREDUCE = """
import socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"{socket.gethostname()}: rank {dist.get_rank()} of {dist.get_world_size()}, "
      f"sum {value.item()}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_all_reduce_across_two_containers(
    home: Path, service: JobService, python_image: str
) -> None:
    from trainport.runners.netns import netns_problem

    require(netns_problem() is None, f"no network namespaces: {netns_problem()}")
    put(home, "data", "train/x.csv", "1")
    body = script_job(
        home, "py-torchrun", {"launch.sh": LAUNCH, "allreduce.py": ALLREDUCE}, "launch.sh"
    )
    body["AlgorithmSpecification"]["TrainingImage"] = python_image  # type: ignore[index]
    body["ResourceConfig"] = {
        "InstanceType": "ml.m5.large",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    body["Tags"] = [{"Key": "trainport:network", "Value": "namespaces"}]
    service.create(body)
    record = wait_for(service, "py-torchrun", timeout=300)
    lines, other = lines_of(service, "py-torchrun"), lines_of(service, "py-torchrun", "algo-2")
    assert record.status == "Completed", (record.failure_reason, lines, other)
    # ranks 0 and 1 add 1 + 2, each in its own container
    assert "algo-1: rank 0 of 2, sum 3.0" in lines, lines
    assert "algo-2: rank 1 of 2, sum 3.0" in other, other


# -- the contract tests of image folders, on an image ----------------------------------------


@pytest.fixture
def byoc_image(python_image: str, podman: str) -> str:
    """examples/byoc's ``train`` (it hard-codes /opt/ml) as the ENTRYPOINT of an image on
    the Python one: the BYO contract tests of image folders, run on an image."""
    train = (BYOC / "train").read_bytes()
    key = hashlib.sha256(train + python_image.encode()).hexdigest()[:12]
    tag = f"localhost/trainport-test-byoc-python:{key}"
    if image_present(podman, tag):
        return tag
    context = Path.home() / ".cache" / "trainport" / "images" / f"byoc-python-{key}"
    context.mkdir(parents=True, exist_ok=True)
    (context / "train").write_bytes(train)
    (context / "train").chmod(0o755)
    (context / "Containerfile").write_text(
        f'FROM {python_image}\nCOPY train /opt/byoc/train\nENTRYPOINT ["/opt/byoc/train"]\n'
    )
    containerfile = ["-f", str(context / "Containerfile")]
    subprocess.run(
        [podman, "build", "--runtime", "runc", "-q", *containerfile, "-t", tag, str(context)],
        check=True,
        capture_output=True,
    )
    return tag


def byoc_image_job(name: str, image: str, **hps: str) -> dict[str, object]:
    """test_lifecycle's request with the image for the folder: nothing else changes (its
    runner tag too goes: an image runs in the engine whichever runner is asked for)."""
    body = byoc_job(name, **hps)
    body["AlgorithmSpecification"]["TrainingImage"] = image  # type: ignore[index]
    del body["Tags"]
    return body


def test_two_concurrent_byoc_jobs_in_an_image_each_see_only_their_own_opt_ml(
    home: Path, service: JobService, byoc_image: str
) -> None:
    put(home, "data", "job-a/one.txt", "aaaa")
    put(home, "data", "job-a/deep/two.txt", "aa")
    put(home, "data", "job-b/three.txt", "bbbbbbbbb")
    service.create(byoc_image_job("job-a", byoc_image, sleep="1", lr="0.1"))
    service.create(byoc_image_job("job-b", byoc_image, sleep="1"))
    a, b = wait_for(service, "job-a"), wait_for(service, "job-b")
    assert (a.status, b.status) == ("Completed", "Completed"), (a.failure_reason, b.failure_reason)
    log_a = lines_of(service, "job-a")
    assert 'hyperparameters={"lr": "0.1", "sleep": "1"}' in log_a
    assert 'host=algo-1 files=["deep/two.txt", "one.txt"]' in log_a
    assert json.loads(members(home, str(a.model_artifacts))["model.json"]) == {
        "job": "job-a",
        "bytes": 6,
        "files": ["deep/two.txt", "one.txt"],
    }
    assert json.loads(members(home, str(b.model_artifacts))["model.json"])["files"] == ["three.txt"]
    assert transitions(a) == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    for before, after in zip(a.transitions, a.transitions[1:], strict=False):
        assert before.end_time == after.start_time


def test_failure_file_in_an_image_becomes_the_failure_reason(
    home: Path, service: JobService, byoc_image: str
) -> None:
    put(home, "data", "fails/x.txt", "x")
    service.create(byoc_image_job("fails", byoc_image, fail="yes"))
    record = wait_for(service, "fails")
    assert record.status == "Failed"
    assert record.failure_reason == "RuntimeError: asked to fail by the 'fail' hyperparameter"
    assert transitions(record)[-1] == "Failed"
    assert record.model_artifacts  # uploaded after failure too


def test_stop_in_an_image_sigterm_grace_and_the_model_saved_in_grace_is_uploaded(
    home: Path, service: JobService, python_image: str
) -> None:
    """test_lifecycle's handler, run by the image's Python from a channel
    (SAGEMAKER_BASE_DIR is trainport's own variable, given here as the request's)."""
    put(home, "data", "stop-me/job.py", SAVE_ON_TERM)
    body = request(
        "stop-me",
        AlgorithmSpecification={
            "TrainingImage": python_image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", "-u", "/opt/ml/input/data/code/job.py"],
        },
        Environment={"SAGEMAKER_BASE_DIR": "/opt/ml"},
        InputDataConfig=[
            {
                "ChannelName": "code",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/stop-me/"}
                },
            }
        ],
    )
    service.create(body)
    wait_until(lambda: "ready" in lines_of(service, "stop-me"), what="ready")
    assert service.stop("stop-me").status == "Stopping"
    record = wait_for(service, "stop-me")
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    # It uploaded what it saved in its grace, so it says Uploading, as SageMaker does.
    assert transitions(record)[-3:] == ["Stopping", "Uploading", "Stopped"]
    assert members(home, str(record.model_artifacts)) == {"saved-in-grace.txt": b"grace"}
    assert record.failure_reason is None
