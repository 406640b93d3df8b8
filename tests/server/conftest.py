"""Fixtures for the server tests: a real server on 127.0.0.1 in a thread, boto3 clients
signed with its key, and tiny real training jobs."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.conftest import require
from trainport.config import load_settings
from trainport.server.app import ServerConfig, TrainportServer, build_server

KEY_ID = "TPAKTESTKEY000000001"
SECRET = "test-secret-for-the-server-tests"
TERMINAL = ("Completed", "Failed", "Stopped")
CHROMIUM = "/usr/bin/chromium"


def require_chromium() -> str:
    path = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    require(path is not None, "Debian's chromium is not installed (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        require(False, "the Python package playwright is not installed (pip install playwright)")
    assert path is not None
    return path


@pytest.fixture
def server_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINPORT_HOME", str(home))
    for var in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "TRAINPORT_STORE",
        "TRAINPORT_RUNNER",
        "TRAINPORT_ENDPOINT",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRAINPORT_SERVER_KEYS", f"{KEY_ID}:{SECRET}")
    monkeypatch.setenv("TRAINPORT_STOP_GRACE_SECONDS", "5")
    # Where this machine has no sandbox the server would refuse every job ("auto" falls
    # back to the process runner); these tests are about the API, not confinement.
    monkeypatch.setenv("TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER", "1")
    put(home, "data", "train/part-0.txt", "one\ntwo\n")
    return home


def put(home: Path, bucket: str, key: str, data: str | bytes) -> None:
    path = home / "store" / bucket / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def start_server(**config: Any) -> TrainportServer:
    options: dict[str, Any] = {"port": 0, "max_concurrent_jobs": 4, "scheduler_interval": 0.2}
    options.update(config)
    server = build_server(ServerConfig(**options), load_settings())
    server.start_background()
    return server


@pytest.fixture
def server(server_home: Path) -> Iterator[TrainportServer]:
    srv = start_server()
    yield srv
    srv.close()


def client(server: TrainportServer, service: str = "sagemaker", secret: str = SECRET) -> Any:
    return boto3.client(
        service,
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )


@pytest.fixture
def sm(server: TrainportServer) -> Any:
    return client(server)


def job(name: str, code: str, **overrides: Any) -> dict[str, Any]:
    """A CreateTrainingJob request whose training process is ``python3 -c code``."""
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-test",
        "AlgorithmSpecification": {
            "TrainingImage": "trainport/python",
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", "-c", code],
            "MetricDefinitions": [{"Name": "loss", "Regex": r"loss=([0-9.]+)"}],
        },
        "HyperParameters": {"epochs": "3", "lr": "0.1"},
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://data/train/",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://out/models"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 120},
    }
    body.update(overrides)
    return body


# ContainerEntrypoint items are at most 256 characters: hence the terse script.
TRAIN = (  # copies the channel's file into the model
    "import os,time\n"
    "b=os.environ.get('SAGEMAKER_BASE_DIR','/opt/ml')\n"
    "for i in range(4):print('epoch %d loss=%.3f'%(i,1/(i+1)),flush=True);time.sleep(.1)\n"
    "open(b+'/model/w.txt','w').write(open(b+'/input/data/train/part-0.txt').read())"
)
SLEEP = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"


def wait_for(sm: Any, name: str, statuses: tuple[str, ...] = TERMINAL, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        d = sm.describe_training_job(TrainingJobName=name)
        if d["TrainingJobStatus"] in statuses or d["SecondaryStatus"] in statuses:
            return d
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} still {d['TrainingJobStatus']}/{d['SecondaryStatus']}")
        time.sleep(0.1)
