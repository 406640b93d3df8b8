"""Shared fixtures: a private TRAINPORT_HOME per test, real jobs, a real S3 endpoint."""

from __future__ import annotations

import importlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trainport.config import load_settings
from trainport.jobs.records import JobRecord
from trainport.jobs.service import JobService

TERMINAL = ("Completed", "Failed", "Stopped")


def require(condition: bool, reason: str) -> None:
    """Skip when ``condition`` is false, except in CI (TRAINPORT_CI_NO_SKIP=1), where a
    missing capability is a failure: CI must not go green by skipping. Works in a test, a
    fixture or at a test module's top level (skipping, or failing, the whole module)."""
    if condition:
        return
    if os.environ.get("TRAINPORT_CI_NO_SKIP") == "1":
        pytest.fail(f"TRAINPORT_CI_NO_SKIP=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str = "") -> ModuleType:
    """Import ``name``, or :func:`require` it: where it is missing, skip (fail in CI).

    For packages ``scripts/setup.sh --test`` installs (torch, torchdata, Horovod, the
    SageMaker training toolkit), never for trainport's own modules, which a test imports.
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        require(
            False,
            f"{name} is not installed or cannot be imported ({exc}){': ' + reason if reason else ''}",
        )
        raise  # not reached: require skipped or failed


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINPORT_HOME", str(home))
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRAINPORT_STORE", "TRAINPORT_RUNNER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TRAINPORT_STOP_GRACE_SECONDS", "10")
    monkeypatch.setenv("TRAINPORT_CHECKPOINT_SYNC_SECONDS", "0.5")
    return home


@pytest.fixture
def service(home: Path) -> JobService:
    return JobService(load_settings())


def put(home: Path, bucket: str, key: str, data: bytes | str) -> None:
    path = home / "store" / bucket / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def request(name: str, **overrides: Any) -> dict[str, Any]:
    """A minimal CreateTrainingJob request; ``overrides`` replace top-level fields."""
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::000000000000:role/trainport-test",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", "-c", "print('hello')"],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://out/jobs"},
        "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }
    body.update(overrides)
    return body


_SCRIPTS = Path(tempfile.mkdtemp(prefix="trainport-test-scripts-"))


def python_job(name: str, code: str, **overrides: Any) -> dict[str, Any]:
    """A job running ``code`` with python3 (from a file: entrypoint entries are short)."""
    script = _SCRIPTS / f"{name}-{abs(hash(code))}.py"
    script.write_text(code)
    algo = {
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["python3", "-u", str(script)],
    }
    algo.update(overrides.pop("algo", {}))
    return request(name, AlgorithmSpecification=algo, **overrides)


def wait_for(service: JobService, name: str, timeout: float = 120) -> JobRecord:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.get(name)
        if record.status in TERMINAL:
            return record
        time.sleep(0.05)
    raise AssertionError(f"job {name} did not end within {timeout} s: {service.get(name)}")


def wait_until(predicate: Any, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server mode on 127.0.0.1: a real S3 endpoint over real HTTP."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_home(home: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return home


# TensorFlow's framework environment takes minutes to build: every test that runs a
# TensorFlow job shares one (a fixture here, so the whole session has one instance).
@pytest.fixture(scope="session")
def tf_envs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A TRAINPORT_ENVS_DIR already set (a developer's, between runs) is reused as it is.
    given = os.environ.get("TRAINPORT_ENVS_DIR")
    return Path(given) if given else tmp_path_factory.mktemp("tf-envs")


@pytest.fixture
def tf_envs(tf_envs_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One environments folder for every TensorFlow job of the session: the first job
    builds TensorFlow's environment (minutes), the others reuse it. Ask for it before
    ``service``."""
    monkeypatch.setenv("TRAINPORT_ENVS_DIR", str(tf_envs_root))
    return tf_envs_root
