"""Script mode end to end: the sagemaker-training toolkit reads what trainport wrote."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import put, request, require, require_module, wait_for
from trainport.errors import ValidationError
from trainport.host.script_mode import pack_sourcedir
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem

TOOLKIT_PROBE = """
import json, sys
from sagemaker_training import environment
env = environment.Environment()
print("PROBE " + json.dumps({
    "channels": env.channel_input_dirs,
    "hyperparameters": env.hyperparameters,
    "hosts": env.hosts,
    "current_host": env.current_host,
    "model_dir": env.model_dir,
    "argv": sys.argv[1:],
}, sort_keys=True))
"""


def script_job(
    home: Path, name: str, files: dict[str, str], entry: str, **hps: str
) -> dict[str, object]:
    src = home.parent / f"src-{name}"
    src.mkdir()
    for rel, text in files.items():
        (src / rel).write_text(text)
    put(home, "code", f"{name}/sourcedir.tar.gz", pack_sourcedir(src, entry))
    return request(
        name,
        AlgorithmSpecification={
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3",
            "TrainingInputMode": "File",
        },
        HyperParameters={
            **hps,
            "sagemaker_program": json.dumps(entry),
            "sagemaker_submit_directory": json.dumps(f"s3://code/{name}/sourcedir.tar.gz"),
        },
        InputDataConfig=[
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/train/"}
                },
            }
        ],
    )


@pytest.mark.parametrize("runner", ["sandbox", "process"])
def test_toolkit_environment_reads_what_trainport_wrote(
    home: Path, service: JobService, runner: str
) -> None:
    require_module("sagemaker_training")
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    put(home, "data", "train/x.csv", "1,2\n")
    body = script_job(
        home,
        f"toolkit-{runner}",
        {"probe.py": TOOLKIT_PROBE},
        "probe.py",
        epochs="3",
        label='"abc"',
    )
    service.create(body, runner=runner)
    record = wait_for(service, f"toolkit-{runner}")
    assert record.status == "Completed", record.failure_reason
    (line,) = [text for _, text in service.logs(f"toolkit-{runner}") if text.startswith("PROBE ")]
    got = json.loads(line[len("PROBE ") :])
    base = (
        "/opt/ml"
        if runner == "sandbox"
        else str(home / "jobs" / f"toolkit-{runner}" / "hosts" / "algo-1")
    )
    assert got == {
        "channels": {"train": f"{base}/input/data/train"},
        "hyperparameters": {"epochs": 3, "label": "abc"},
        "hosts": ["algo-1"],
        "current_host": "algo-1",
        "model_dir": f"{base}/model",
        "argv": ["--epochs", "3", "--label", "abc"],
    }


def test_entry_point_missing_from_the_archive(home: Path, service: JobService) -> None:
    put(home, "data", "train/x.csv", "1,2\n")
    body = script_job(home, "no-entry", {"train.py": "print(1)"}, "train.py")
    body["HyperParameters"]["sagemaker_program"] = '"other.py"'  # type: ignore[index]
    with pytest.raises(
        ValidationError, match=r"entry point 'other\.py' is not in the source archive"
    ):
        service.create(body)


def test_source_tarball_escaping_opt_ml_code_is_refused(home: Path, service: JobService) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for member, data in (("train.py", b"print(1)"), ("../../evil.sh", b"rm -rf /")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    put(home, "code", "evil/sourcedir.tar.gz", buf.getvalue())
    body = request(
        "evil",
        AlgorithmSpecification={"TrainingImage": "framework", "TrainingInputMode": "File"},
        HyperParameters={
            "sagemaker_program": "train.py",
            "sagemaker_submit_directory": "s3://code/evil/sourcedir.tar.gz",
        },
    )
    with pytest.raises(ValidationError, match="outside"):
        service.create(body)
    assert not (home / "jobs" / "evil").exists()


def test_missing_source_archive(home: Path, service: JobService) -> None:
    body = request(
        "no-archive",
        AlgorithmSpecification={"TrainingImage": "framework", "TrainingInputMode": "File"},
        HyperParameters={
            "sagemaker_program": "train.py",
            "sagemaker_submit_directory": "s3://code/none.tar.gz",
        },
    )
    with pytest.raises(ValidationError, match="does not exist"):
        service.create(body)


def test_demo_script_trains_and_saves_a_model(home: Path, service: JobService) -> None:
    """The README's demo, through the same path: a real PyTorch job."""
    require_module("torch")
    from trainport.demo import run_demo

    assert run_demo(epochs=2, runner="process") == 0
    (record,) = service.list()
    assert record.status == "Completed"
    names = {m.name for m in record.final_metrics}
    assert names == {"train_loss", "val_accuracy"}
    accuracy = next(m.value for m in record.final_metrics if m.name == "val_accuracy")
    assert accuracy > 0.7
    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
        assert sorted(tar.getnames()) == ["config.json", "model.pt"]


PYTHON_ON_PATH_PROBE = """
import json, shutil, subprocess, sys
found = shutil.which("python")
prefix = subprocess.run([found, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True).stdout.strip()
print("PROBE " + json.dumps({"self": sys.prefix, "python_on_path": prefix}))
"""


@pytest.mark.parametrize("runner", ["sandbox", "process"])
def test_script_mode_runs_and_exposes_the_environment_trainport_runs_in(
    home: Path, service: JobService, runner: str
) -> None:
    """The entry point, and any `python` it starts from PATH, are this environment's."""
    import sys

    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    put(home, "data", "train/x.csv", "1,2\n")
    name = f"interp-{runner}"
    body = script_job(home, name, {"probe.py": PYTHON_ON_PATH_PROBE}, "probe.py")
    service.create(body, runner=runner)
    record = wait_for(service, name)
    assert record.status == "Completed", record.failure_reason
    (line,) = [text for _, text in service.logs(name) if text.startswith("PROBE ")]
    got = json.loads(line[len("PROBE ") :])
    assert got == {"self": sys.prefix, "python_on_path": sys.prefix}
