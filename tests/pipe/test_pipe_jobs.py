"""Pipe-mode jobs end to end: real supervisor, host agent, training processes and FIFOs."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import put, python_job, require, wait_for
from trainport.errors import ValidationError
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem

# Reads `epochs` epochs of every channel named in argv, alternating between channels, and
# prints one sha256 per (channel, epoch). Epoch 1 of the first channel is closed early.
_TRAIN = r"""
import hashlib, os, sys, time
base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
channels, epochs = sys.argv[1].split(","), int(sys.argv[2])
def fifo(name):
    while not os.path.exists(name):
        time.sleep(0.005)
    return open(name, "rb")
for epoch in range(epochs):
    for ch in channels:
        with fifo(f"{base}/input/data/{ch}_{epoch}") as f:
            if ch == channels[0] and epoch == 1:
                f.read(10)
                print("CLOSED-EARLY", ch, epoch)
                continue
            data = f.read()
        print("EPOCH", ch, epoch, hashlib.sha256(data).hexdigest())
"""


def pipe_channel(name: str, uri: str, **extra: Any) -> dict[str, Any]:
    source = {"S3DataType": extra.pop("data_type", "S3Prefix"), "S3Uri": uri}
    source.update(extra.pop("source", {}))
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": source},
        "InputMode": "Pipe",
        **extra,
    }


def pipe_job(name: str, code: str, args: list[str], channels: list[dict[str, Any]], **kw: Any):
    job = python_job(name, code, InputDataConfig=channels, **kw)
    job["AlgorithmSpecification"]["ContainerEntrypoint"] += args  # python3 -c CODE ARGS...
    return job


def job_log(home: Path, name: str) -> str:
    return (home / "jobs" / name / "logs" / "algo-1.log").read_text()


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_two_channels_several_epochs_byte_exact(
    home: Path, service: JobService, runner: str
) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"sandbox unavailable: {sandbox_problem()}")
    train = {f"train/part-{i}": bytes([i]) * (100_000 + i) for i in range(6)}
    valid = {f"valid/{i}.gz": f"line {i}\n".encode() * 1000 for i in range(3)}
    for key, data in train.items():
        put(home, "data", key, data)
    for key, data in valid.items():
        put(home, "data", key, gzip.compress(data))
    name = f"pipe-{runner}"
    job = pipe_job(
        name,
        _TRAIN,
        ["train,valid", "4"],
        [
            pipe_channel("train", "s3://data/train/"),
            pipe_channel("valid", "s3://data/valid/", CompressionType="Gzip"),
        ],
        Tags=[{"Key": "trainport:runner", "Value": runner}],
    )
    service.create(job)
    record = wait_for(service, name)
    log = job_log(home, name)
    assert record.status == "Completed", (record.failure_reason, log)
    want_train = hashlib.sha256(b"".join(train[k] for k in sorted(train))).hexdigest()
    want_valid = hashlib.sha256(b"".join(valid[k] for k in sorted(valid))).hexdigest()
    for epoch in range(4):
        if epoch != 1:
            assert f"EPOCH train {epoch} {want_train}" in log
        assert f"EPOCH valid {epoch} {want_valid}" in log
    assert "CLOSED-EARLY train 1" in log
    data_dir = home / "jobs" / name / "hosts" / "algo-1" / "input" / "data"
    assert not any(p.name.startswith(("train_", "valid_")) for p in data_dir.iterdir())
    config = json.loads((data_dir.parent / "config" / "inputdataconfig.json").read_text())
    assert config["train"]["TrainingInputMode"] == "Pipe"


_WORKERS = r"""
import hashlib, os, subprocess, sys, time
base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
workers = int(os.environ["TRAINPORT_PIPE_WORKERS"])
if len(sys.argv) == 1:  # the launcher: one process per worker, as torchrun would
    procs = [subprocess.Popen([sys.executable, "-c", CODE, str(w)]) for w in range(workers)]
    sys.exit(max(p.wait() for p in procs))
w = int(sys.argv[1])
for epoch in range(2):
    path = f"{base}/input/data/train_w{w}_{epoch}"
    while not os.path.exists(path):
        time.sleep(0.005)
    with open(path, "rb") as f:
        data = f.read()
    os.write(1, f"WORKER {w} {epoch} {data.decode()}\n".encode())  # one write: no interleaving
"""


def test_per_worker_pipes_from_a_tag(home: Path, service: JobService) -> None:
    for i in range(10):
        put(home, "data", f"train/{i:02d}", f"[{i}]")
    code = "CODE = " + repr(_WORKERS) + "\n" + _WORKERS
    job = python_job(
        "pipe-workers",
        code,
        InputDataConfig=[
            pipe_channel(
                "train",
                "s3://data/train/",
                ShuffleConfig={"Seed": 11},
            )
        ],
        Tags=[
            {"Key": "trainport:runner", "Value": "process"},
            {"Key": "trainport:pipe-workers", "Value": "2"},
        ],
    )
    service.create(job)
    record = wait_for(service, "pipe-workers")
    log = job_log(home, "pipe-workers")
    assert record.status == "Completed", (record.failure_reason, log)
    for epoch in range(2):
        seen = []
        for w in range(2):
            found = [ln for ln in log.splitlines() if f"WORKER {w} {epoch} " in ln]
            assert len(found) == 1, log
            line = found[0]
            items = line.split(f"WORKER {w} {epoch} ", 1)[1].strip("[]").split("][")
            assert len(items) == 5  # balanced
            seen += items
        assert sorted(seen, key=int) == [str(i) for i in range(10)]  # disjoint, complete


def test_augmented_manifest_line_missing_attribute_fails_the_job(
    home: Path, service: JobService
) -> None:
    put(home, "data", "img/a", b"A")
    lines = [{"source-ref": "s3://data/img/a", "label": 1}, {"source-ref": "s3://data/img/a"}]
    put(home, "data", "m/aug.jsonl", "\n".join(json.dumps(x) for x in lines))
    job = python_job(
        "aug-bad",
        "print('never')",
        InputDataConfig=[
            pipe_channel(
                "train",
                "s3://data/m/aug.jsonl",
                data_type="AugmentedManifestFile",
                source={"AttributeNames": ["source-ref", "label"]},
            )
        ],
        Tags=[{"Key": "trainport:runner", "Value": "process"}],
    )
    service.create(job)
    record = wait_for(service, "aug-bad")
    assert record.status == "Failed"
    assert "s3://data/m/aug.jsonl line 2 lacks attribute(s) 'label'" in (
        record.failure_reason or ""
    )


def test_a_missing_object_fails_the_job_with_its_name(home: Path, service: JobService) -> None:
    put(home, "data", "img/a", b"A")
    put(home, "data", "m/aug.jsonl", json.dumps({"source-ref": "s3://data/img/missing"}))
    code = (
        "import os, time\n"
        "print(open(os.environ['SAGEMAKER_BASE_DIR'] + '/input/data/train_0', 'rb').read())\n"
        "time.sleep(60)\n"
    )
    job = python_job(
        "aug-missing",
        code,
        InputDataConfig=[
            pipe_channel(
                "train",
                "s3://data/m/aug.jsonl",
                data_type="AugmentedManifestFile",
                source={"AttributeNames": ["source-ref"]},
            )
        ],
        Tags=[
            {"Key": "trainport:runner", "Value": "process"},
            {"Key": "trainport:stop-grace-seconds", "Value": "2"},
        ],
    )
    service.create(job)
    record = wait_for(service, "aug-missing")
    assert record.status == "Failed"
    assert "s3://data/img/missing" in (record.failure_reason or "")


@pytest.mark.parametrize(
    ("channel", "tags", "message"),
    [
        (
            {**pipe_channel("t", "s3://d/t/"), "InputMode": "File", "CompressionType": "Gzip"},
            [],
            "CompressionType Gzip is only supported in Pipe mode",
        ),
        (
            pipe_channel("t", "s3://d/t/", source={"AttributeNames": ["a"]}),
            [],
            "AttributeNames needs S3DataType AugmentedManifestFile",
        ),
        (
            {**pipe_channel("t", "s3://d/m", data_type="ManifestFile"), "InputMode": "FastFile"},
            [],
            "FastFile mode serves S3Prefix channels only",
        ),
        (
            pipe_channel("t", "s3://d/t/"),
            [{"Key": "trainport:pipe-workers", "Value": "0"}],
            "trainport:pipe-workers='0'",
        ),
    ],
)
def test_validation_errors(
    service: JobService, channel: dict[str, Any], tags: list[dict[str, str]], message: str
) -> None:
    job = python_job("bad", "print(1)", InputDataConfig=[channel], Tags=tags or None)
    if not tags:
        del job["Tags"]
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace("[", r"\[")):
        service.create(job)


def test_channel_named_like_a_fifo_is_refused(service: JobService) -> None:
    job = python_job(
        "clash",
        "print(1)",
        InputDataConfig=[pipe_channel("train", "s3://d/a/"), pipe_channel("train_1", "s3://d/b/")],
    )
    with pytest.raises(ValidationError, match="has the name of a FIFO of Pipe channel 'train'"):
        service.create(job)
