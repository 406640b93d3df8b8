"""SMDDP through the SageMaker Python SDK's own ``PyTorch`` estimator against a real
trainport server: ``distribution={"smdistributed": {"dataparallel": ...}}`` and
``{"pytorchddp": ...}``, 2 hosts each, the scripts as AWS's guide writes them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.server.test_sagemaker_sdk import run_session, sdk_server  # noqa: F401
from tests.test_smddp import BACKEND_STYLE, OLDER_API, assert_one_job
from trainport.host import mpi

pytestmark = pytest.mark.slow

FIT = """
from sagemaker.pytorch import PyTorch

for entry, distribution in [
    ("backend.py", {"smdistributed": {"dataparallel": {
        "enabled": True, "custom_mpi_options": "-x TRAINPORT_TEST_MARK=reached"}}}),
    ("older.py", {"pytorchddp": {"enabled": True}}),
]:
    estimator = PyTorch(
        entry_point=entry,
        source_dir="src",
        role=ROLE,
        framework_version="2.0.1",
        py_version="py310",
        instance_type="ml.c5.xlarge",
        instance_count=2,
        distribution=distribution,
        sagemaker_session=session,
    )
    estimator.fit(logs="All")
    print("JOB", estimator.latest_training_job.name, flush=True)
"""


def test_pytorch_estimator_smdistributed_and_pytorchddp(
    sdk_server: Any,  # noqa: F811
    moto_endpoint: str,
    tmp_path: Path,
) -> None:
    require(
        shutil.which("mpirun") is not None, "OpenMPI is not installed (apt-get install openmpi-bin)"
    )
    require(mpi.has_mpi4py(), "mpi4py is not installed")
    workdir = tmp_path / "work"
    (workdir / "src").mkdir(parents=True)
    (workdir / "src" / "backend.py").write_text(BACKEND_STYLE)
    (workdir / "src" / "older.py").write_text(OLDER_API)
    done = run_session(sdk_server, moto_endpoint, workdir, FIT, timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    jobs = done.stdout.split("\nJOB ")
    assert len(jobs) == 3, done.stdout[-4000:]
    for part in jobs[:2]:
        # The SDK prints every host's stream; each report names its own host.
        reports = [json.loads(raw) for raw in re.findall(r"RANK (\{.*\})", part)]
        for report in reports:
            report["logged_on"] = report["host"]
        assert_one_job(sorted(reports, key=lambda r: r["rank"]), per_host=1)
    assert '"mark": "reached"' in jobs[0]  # the custom MPI options reached the ranks
