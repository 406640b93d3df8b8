"""An image is pulled when its job starts, with its progress in the job's status, never
while the job is submitted; a pull that fails fails the job, naming the image."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import request, require
from trainport.runners.container import PullProgress

TRAINPORT = [sys.executable, "-m", "trainport.cli"]
REGISTRY_IMAGE = "registry.invalid.example/team/trainer:1"

DOCKER_PULL = """\
1: Pulling from team/trainer
0a1b2c3d4e5f: Pulling fs layer
1a1b2c3d4e5f: Pulling fs layer
0a1b2c3d4e5f: Downloading  1.2MB/3.4MB
0a1b2c3d4e5f: Pull complete
1a1b2c3d4e5f: Already exists
Digest: sha256:00
Status: Downloaded newer image for registry.example.com/team/trainer:1
"""

PODMAN_PULL = """\
Trying to pull registry.example.com/team/trainer:1...
Getting image source signatures
Copying blob sha256:0a1b2c3d4e5f00000000
Copying blob sha256:1a1b2c3d4e5f00000000
Copying config sha256:2a1b2c3d4e5f00000000
Writing manifest to image destination
"""


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        (
            DOCKER_PULL,
            ["1: Pulling from team/trainer", "0/1 layers", "0/2 layers", "0/2 layers",
             "1/2 layers", "2/2 layers", "2/2 layers", "2/2 layers"],
        ),
        (
            PODMAN_PULL,
            [f"Trying to pull {'registry.example.com/team/trainer:1'}...",
             "Getting image source signatures", "0/1 layers", "1/2 layers", "1/2 layers",
             "2/2 layers"],
        ),
    ],
)  # fmt: skip
def test_pull_progress_counts_layers(said: str, expected: list[str]) -> None:
    progress = PullProgress()
    assert [progress.line(line) for line in said.splitlines()] == expected


def test_a_failed_pull_fails_the_job_at_its_start_naming_the_image(
    home: Path, tmp_path: Path
) -> None:
    docker = shutil.which("docker")
    require(docker is not None, "the docker client is not installed (scripts/setup.sh --test)")
    body = request("pull-fails")
    body["AlgorithmSpecification"] = {"TrainingInputMode": "File", "TrainingImage": REGISTRY_IMAGE}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(body))
    # A docker whose daemon is not there: any pull fails, and fast.
    env = {
        "TRAINPORT_CONTAINER_ENGINE": str(docker),
        "DOCKER_HOST": f"unix://{tmp_path / 'no-daemon.sock'}",
    }
    done = subprocess.run(
        [*TRAINPORT, "run", str(job)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 1, done.stderr  # submitted (2 would be a refusal), then Failed
    assert f"[trainport] pulling image {REGISTRY_IMAGE} with {docker}" in done.stdout
    assert "Job pull-fails: Failed" in done.stderr
    reason = next(line for line in done.stderr.splitlines() if "FailureReason" in line)
    assert repr(REGISTRY_IMAGE) in reason and "could not be pulled" in reason, reason


def test_a_source_dir_inside_the_image_waits_for_the_start_where_an_engine_may_have_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import wait_for
    from trainport.config import load_settings
    from trainport.errors import ValidationError
    from trainport.jobs.service import JobService

    docker = shutil.which("docker")
    require(docker is not None, "the docker client is not installed (scripts/setup.sh --test)")
    body = request("inside-image")
    body["AlgorithmSpecification"] = {"TrainingInputMode": "File", "TrainingImage": "team/img:1"}
    body["HyperParameters"] = {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"/opt/ml/input/data/code/sourcedir.tar.gz"',
    }
    # No engine: only script mode could run it, which needs the code in the store.
    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", "none")
    with pytest.raises(ValidationError, match="sagemaker_submit_directory"):
        JobService(load_settings()).create(body)
    # An engine that may hold the image: submission asks it nothing; the start finds it
    # lacks the image (no daemon here), plays it in script mode, and says why it cannot.
    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", str(docker))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{home / 'no-daemon.sock'}")
    service = JobService(load_settings())
    service.create(body)
    record = wait_for(service, "inside-image")
    assert record.status == "Failed"
    assert "sagemaker_submit_directory" in str(record.failure_reason), record.failure_reason
