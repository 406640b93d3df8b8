"""docs/sagemaker-sdk.md, run: the SageMaker Python SDK against a real trainport server on
127.0.0.1, with moto's S3 server as the S3 endpoint both share.

Each test runs the page's session example and one more in a fresh interpreter, with the
environment the page tells users to export (every endpoint on 127.0.0.1, telemetry off),
in a folder holding the page's training scripts. v2 is this venv's; v3's ModelTrainer
example runs with the interpreter of ``.venv-sdk3`` (made by ``scripts/setup.sh --test``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.server.conftest import client, start_server
from trainport.runners.sandbox import sandbox_problem

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sagemaker-sdk.md"
SDK3_PYTHON = ROOT / ".venv-sdk3" / "bin" / "python"
S3_KEY, S3_SECRET = "testing", "testing"  # moto's; the server accepts them as extra keys


def _blocks(kind: str) -> dict[str, str]:
    """The page's code blocks marked ``<!-- KIND: NAME -->``, by name."""
    text = DOC.read_text()
    return dict(re.findall(rf"<!-- {kind}: (\S+) -->\n```\w+\n(.*?)```", text, re.DOTALL))


def _exported() -> set[str]:
    """The variables the page tells users to export for the SDK."""
    lines = re.findall(r"^\s*export (.*)$", DOC.read_text(), re.MULTILINE)
    return {name for line in lines for name in re.findall(r"\b([A-Z][A-Z0-9_]+)=", line)}


@pytest.fixture
def sdk_server(
    server_home: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    require(
        importlib.util.find_spec("sagemaker") is not None,
        "the SageMaker Python SDK is not installed (scripts/setup.sh --test installs it)",
    )
    yield from _serve(moto_endpoint, monkeypatch)


@pytest.fixture
def sdk3_server(
    server_home: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    require(
        SDK3_PYTHON.exists(),
        f"the SageMaker Python SDK v3 is not installed in {SDK3_PYTHON.parent.parent} "
        "(scripts/setup.sh --test makes it)",
    )
    # ModelTrainer's driver has its paths fixed under /opt/ml: only the sandbox has them.
    problem = sandbox_problem()
    require(problem is None, f"no sandbox for ModelTrainer's /opt/ml paths: {problem}")
    yield from _serve(moto_endpoint, monkeypatch)


def _serve(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # The server's store is the S3 endpoint the SDK uploads to, and it accepts the S3 key
    # pair the SDK signs its logs client with.
    monkeypatch.setenv("TRAINPORT_STORE", "s3")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("TRAINPORT_SERVER_EXTRA_KEYS", f"{S3_KEY}:{S3_SECRET}")
    srv = start_server()
    yield srv
    srv.close()


def _sdk_env(server: Any, moto_endpoint: str, workdir: Path) -> dict[str, str]:
    config = workdir / "sagemaker-config.yaml"
    yaml_block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert yaml_block is not None
    config.write_text(yaml_block.group(1))
    wanted = {
        "AWS_ENDPOINT_URL_SAGEMAKER": server.url,
        "AWS_ENDPOINT_URL_CLOUDWATCH_LOGS": server.url,
        "AWS_ENDPOINT_URL_S3": moto_endpoint,
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": S3_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
    }
    # What the page says to export, v3's one addition aside, is what this test sets.
    assert _exported() - {"SAGEMAKER_VALIDATE_ROLE"} == set(wanted)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_"))}
    return {**env, **wanted}


def run_session(
    server: Any, moto_endpoint: str, workdir: Path, code: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``code`` after the page's session lines, in a Python of its own in ``workdir`` with
    the environment the page says to set."""
    return subprocess.run(
        [sys.executable, "-c", _blocks("example")["session"] + code],
        cwd=workdir,
        env=_sdk_env(server, moto_endpoint, workdir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _workdir(tmp_path: Path) -> Path:
    """A folder holding the page's training scripts."""
    workdir = tmp_path / "work"
    for name, text in _blocks("file").items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    return workdir


def _run(server: Any, moto_endpoint: str, tmp_path: Path, *examples: str) -> str:
    """Run the session example and ``examples`` in one fresh interpreter; its output."""
    workdir = _workdir(tmp_path)
    code = "\n".join(_blocks("example")[name] for name in ("session", *examples))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=workdir,
        env=_sdk_env(server, moto_endpoint, workdir),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


def test_fit_with_logs_then_attach(sdk_server: Any, moto_endpoint: str, tmp_path: Path) -> None:
    out = _run(sdk_server, moto_endpoint, tmp_path, "fit", "attach")
    # The log, printed by fit(logs="All") and again by the attached estimator's .logs().
    assert out.count("epoch 2 loss=0.333") == 2, out
    assert "model: s3://sagemaker-trainport/" in out
    assert "attached: s3://sagemaker-trainport/" in out
    assert "generic: s3://sagemaker-trainport/" in out


def test_checkpoints(sdk_server: Any, moto_endpoint: str, tmp_path: Path) -> None:
    out = _run(sdk_server, moto_endpoint, tmp_path, "checkpoints")
    assert "'checkpoints/run-1/epoch-0.txt', 'checkpoints/run-1/epoch-1.txt'" in out, out


def test_pipe_input(sdk_server: Any, moto_endpoint: str, tmp_path: Path) -> None:
    out = _run(sdk_server, moto_endpoint, tmp_path, "pipe")
    assert "read 1000 bytes from train_0" in out, out


def test_attach_to_a_job_from_trainport_run(
    sdk_server: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('trained by the CLI', flush=True)\n")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "trainport.cli", "--endpoint", sdk_server.url, "run"),
            *("--name", "cli-made", "--entry-point", str(script), "--detach"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    workdir = tmp_path / "work"
    workdir.mkdir()
    code = _blocks("example")["session"] + (
        "from sagemaker.estimator import Estimator\n"
        "from sagemaker.pytorch import PyTorch\n"
        "generic = Estimator.attach('cli-made', sagemaker_session=session)\n"
        "generic.logs()\n"
        "print('attached:', generic.model_data)\n"
        "print('pytorch:', PyTorch.attach('cli-made', sagemaker_session=session).model_data)\n"
    )
    attached = subprocess.run(
        [sys.executable, "-c", code],
        cwd=workdir,
        env=_sdk_env(sdk_server, moto_endpoint, workdir),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert attached.returncode == 0, attached.stdout[-4000:] + attached.stderr[-4000:]
    assert "trained by the CLI" in attached.stdout
    assert "attached: s3://" in attached.stdout and "pytorch: s3://" in attached.stdout


def test_v3_model_trainer_prints_the_log(
    sdk3_server: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    workdir = _workdir(tmp_path)
    env = {**_sdk_env(sdk3_server, moto_endpoint, workdir), "SAGEMAKER_VALIDATE_ROLE": "false"}
    done = subprocess.run(
        [str(SDK3_PYTHON), "-c", _blocks("example")["modeltrainer"]],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-8000:]
    jobs = client(sdk3_server).list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobStatus"] for j in jobs] == ["Completed"], jobs
    name = jobs[0]["TrainingJobName"]
    # train(logs=True) logged each line of the job's log (to stderr, by the example's
    # logging.basicConfig), under the name of the job's stream, once.
    assert f"{name}/algo-1-" in done.stderr, out[-8000:]
    for line in ("epoch 0 loss=1.000", "epoch 1 loss=0.500", "epoch 2 loss=0.333"):
        assert done.stderr.count(line) == 1, out[-8000:]
    # Telemetry is off: with it on, v3 logs how to opt out the first time it reports.
    assert "opt out of telemetry" not in out
