"""A failed script's exception in FailureReason, as boto3 reads it from the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.server.conftest import job, put, wait_for
from trainport.host.script_mode import pack_sourcedir

PYTORCH_IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.3.0-cpu-py311"
BAD_SHARD = 'def load(shard):\n    raise ValueError(f"bad shard {shard}")\n\nload(7)\n'


def test_describe_gives_the_scripts_exception(sm: Any, server_home: Path, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text(BAD_SHARD)
    put(server_home, "code", "bad/sourcedir.tar.gz", pack_sourcedir(tmp_path / "src", "train.py"))
    request = job("bad-shard-api", "print(1)")
    # Script mode as the SageMaker SDK sends it: the framework's image, no entrypoint.
    del request["AlgorithmSpecification"]["ContainerEntrypoint"]
    request["AlgorithmSpecification"]["TrainingImage"] = PYTORCH_IMAGE
    request["HyperParameters"] = {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"s3://code/bad/sourcedir.tar.gz"',
    }
    sm.create_training_job(**request)
    described = wait_for(sm, "bad-shard-api")
    assert described["TrainingJobStatus"] == "Failed"
    reason = described["FailureReason"]
    assert reason.startswith(
        'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "ValueError: bad shard 7"'
    ), reason
    assert reason.endswith(' train.py", exit code: 1'), reason
