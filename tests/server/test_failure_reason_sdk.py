"""A failing script's exception as the SageMaker Python SDK reports it: fit() raises with
the job's FailureReason, the toolkit's ExecuteUserScriptError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.server.test_sagemaker_sdk import run_session, sdk_server  # noqa: F401

pytestmark = pytest.mark.slow

FIT = """
from sagemaker.pytorch import PyTorch

estimator = PyTorch(
    entry_point="bad.py",
    source_dir="src",
    role=ROLE,
    framework_version="2.5",
    py_version="py311",
    instance_type="ml.m5.large",
    instance_count=1,
    hyperparameters={"shard": 7},
    sagemaker_session=session,
)
try:
    estimator.fit(logs="None")
except Exception as exc:
    print("RAISED", type(exc).__name__, str(exc))
"""
BAD = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--shard", type=int)
raise ValueError(f"bad shard {parser.parse_args().shard}")
"""


def test_fit_raises_with_the_scripts_exception(
    sdk_server: Any,  # noqa: F811
    moto_endpoint: str,
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    (workdir / "src").mkdir(parents=True)
    (workdir / "src" / "bad.py").write_text(BAD)
    done = run_session(sdk_server, moto_endpoint, workdir, FIT, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "RAISED UnexpectedStatusException" in done.stdout, done.stdout[-4000:]
    assert "ExecuteUserScriptError" in done.stdout
    assert 'ErrorMessage "ValueError: bad shard 7"' in done.stdout
    assert "bad.py --shard 7" in done.stdout
