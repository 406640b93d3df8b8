"""Smaller parts of the in-job contract: manifests that weight objects, Pipe worker
channels in inputdataconfig.json, /opt/ml under the process runner, and images that no
engine here has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import put, python_job, wait_for
from trainport.host.channels import resolve_channel
from trainport.jobs.service import JobService
from trainport.spec import ChannelSpec
from trainport.store.local import LocalStore

WEIGHTED = '[{"prefix": "s3://bkt/d/"}, "rare.txt", "common.txt", "rare.txt"]'


@pytest.mark.parametrize(("mode", "keys"), [("Pipe", 3), ("File", 2), ("FastFile", 2)])
def test_a_manifest_may_list_an_object_twice(home: Path, mode: str, keys: int) -> None:
    put(home, "bkt", "d/rare.txt", "r")
    put(home, "bkt", "d/common.txt", "c")
    put(home, "bkt", "m.json", WEIGHTED)
    channel = ChannelSpec("train", "ManifestFile", "s3://bkt/m.json", "FullyReplicated", mode)
    got = [o.key for o in resolve_channel(LocalStore(home / "store"), channel)]
    assert got == ["d/rare.txt", "d/common.txt", "d/rare.txt"][:keys]


READ_PIPE = """
import os
base = os.environ["SAGEMAKER_BASE_DIR"]
with open(f"{base}/input/data/train_0", "rb") as f:
    print("READ", f.read().decode(), flush=True)
"""


def test_a_pipe_channel_streams_a_weighted_object_as_often_as_listed(
    home: Path, service: JobService
) -> None:
    put(home, "bkt", "d/rare.txt", "r")
    put(home, "bkt", "d/common.txt", "c")
    put(home, "bkt", "m.json", WEIGHTED)
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "ManifestFile", "S3Uri": "s3://bkt/m.json"}},
        "InputMode": "Pipe",
    }
    service.create(python_job("weighted", READ_PIPE, InputDataConfig=[channel]), runner="process")
    record = wait_for(service, "weighted")
    assert record.status == "Completed", record.failure_reason
    assert [t for _, t in service.logs("weighted") if t.startswith("READ")] == ["READ rcr"]


# What PipeModeDataset does before it opens a FIFO: look its channel up in
# inputdataconfig.json and insist on Pipe mode; then it reads <channel>_<epoch>.
WORKER_READER = """
import json, os
base = os.environ["SAGEMAKER_BASE_DIR"]
config = json.load(open(f"{base}/input/config/inputdataconfig.json"))
got = {}
for channel in ("train_w0", "train_w1"):
    if config.get(channel, {}).get("TrainingInputMode") != "Pipe":
        raise SystemExit(f"channel {channel} is not a Pipe channel in inputdataconfig.json")
    with open(f"{base}/input/data/{channel}_0", "rb") as f:
        got[channel] = f.read().decode()
print("WORKERS " + json.dumps({"got": got, "channels": sorted(config)}), flush=True)
"""


def test_pipe_worker_channels_are_in_inputdataconfig(home: Path, service: JobService) -> None:
    for i in range(4):
        put(home, "bkt", f"d/{i}.txt", str(i))
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bkt/d/"}},
        "InputMode": "Pipe",
    }
    body = python_job(
        "workers",
        WORKER_READER,
        InputDataConfig=[channel],
        Tags=[{"Key": "trainport:pipe-workers", "Value": "2"}],
    )
    service.create(body, runner="process")
    record = wait_for(service, "workers")
    assert record.status == "Completed", record.failure_reason
    (line,) = [t for _, t in service.logs("workers") if t.startswith("WORKERS ")]
    seen = json.loads(line[len("WORKERS ") :])
    assert seen == {
        "got": {"train_w0": "02", "train_w1": "13"},
        "channels": ["train", "train_w0", "train_w1"],
    }


@pytest.mark.parametrize(
    ("image", "plays"),
    [
        (None, True),
        ("763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3", True),
        ("pytorch", True),  # a short name: nothing an engine could pull as such
        ("team/trainer:1", True),
        ("registry.example.com/team/trainer:1", False),
        ("localhost:5000/trainer", False),
        ("localhost/trainer:1", False),
    ],
)
def test_which_images_script_mode_stands_for(image: str | None, plays: bool) -> None:
    from trainport.host import command

    assert command.plays_image(image) is plays


REGISTRY_IMAGE = "registry.invalid.example/team/trainer:1"


def _entry_point_job(home: Path, image: str) -> dict[str, object]:
    from tests.test_script_mode_job import script_job

    put(home, "data", "train/x.csv", "1\n")
    body = script_job(home, "byo-image", {"train.py": "print('ran on the host')"}, "train.py")
    body["AlgorithmSpecification"]["TrainingImage"] = image  # type: ignore[index]
    return body


def test_an_image_of_a_registry_is_pulled_not_played(
    home: Path, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import require
    from trainport.config import container_engine_setting
    from trainport.runners import container

    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", "auto")
    require(container.find_engine(container_engine_setting()) is not None, "no container engine")
    service.create(_entry_point_job(home, REGISTRY_IMAGE))  # the job's start pulls it
    record = wait_for(service, "byo-image")
    assert record.status == "Failed"
    assert f"{REGISTRY_IMAGE!r}" in str(record.failure_reason)
    assert "could not be pulled" in str(record.failure_reason)


def test_an_image_of_a_registry_without_an_engine_is_named(
    home: Path, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainport.errors import ValidationError

    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", "none")
    with pytest.raises(ValidationError, match=rf"{REGISTRY_IMAGE!r} is not a framework image"):
        service.create(_entry_point_job(home, REGISTRY_IMAGE))
