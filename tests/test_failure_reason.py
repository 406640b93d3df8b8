"""A failed job's FailureReason says why, as SageMaker's would.

Script mode: the toolkit's ExecuteUserScriptError with the exit code, the exception the
script raised last and the command. MPI: the failing rank and its error. An image or
entrypoint of the user's own: its failure file, else its last lines of output.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import put, python_job, require, wait_for
from tests.test_script_mode_job import script_job
from trainport.host import failure, mpi
from trainport.jobs.service import JobService

TRAINPORT = [sys.executable, "-m", "trainport.cli"]

CHAINED = [
    "epoch 1 loss=0.5",
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in load',
    "    raise KeyError('shard')",
    "KeyError: 'shard'",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "train.py", line 9, in <module>',
    "    load(7)",
    "    ^^^^^^^",
    "ValueError: bad shard 7",
    "[trainport] a line of the agent's own",
]


def test_the_last_exception_of_a_chain_is_the_one_that_ended_the_script() -> None:
    assert failure.last_exception(CHAINED) == "ValueError: bad shard 7"
    assert failure.last_exception(["just output", "error: no"]) is None
    tagged = ["[1,2]<stderr>:Traceback (most recent call last):", "[1,2]<stderr>:  File x"]
    tagged.append("[1,2]<stderr>:RuntimeError: rank two")
    assert failure.last_exception(tagged) == "RuntimeError: rank two"


def test_script_failure_is_the_toolkits_execute_user_script_error() -> None:
    reason = failure.script_failure(1, ["/usr/bin/python3", "train.py", "--epochs", "2"], CHAINED)
    assert reason == (
        "AlgorithmError: ExecuteUserScriptError:\nExitCode 1\n"
        'ErrorMessage "ValueError: bad shard 7"\n'
        'Command "/usr/bin/python3 train.py --epochs 2", exit code: 1'
    )
    # No traceback (an argparse error, a sys.exit with a message): its last line.
    said = failure.script_failure(2, ["python3", "t.py"], ["usage: t.py", "t.py: error: bad"])
    assert 'ErrorMessage "t.py: error: bad"' in said


def test_output_failure_is_the_last_lines_or_sagemakers_empty_reason() -> None:
    lines = [f"line {i}" for i in range(9)] + ["", "[trainport] ours"]
    assert failure.output_failure(3, lines) == (
        "AlgorithmError: line 4\nline 5\nline 6\nline 7\nline 8, exit code: 3"
    )
    assert failure.output_failure(3, []) == "AlgorithmError: , exit code: 3"


BAD_SHARD = """
import sys
def load(shard):
    raise ValueError(f"bad shard {shard}")
print("loading", flush=True)
load(int(sys.argv[sys.argv.index("--shard") + 1]))
"""


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_a_failing_scripts_exception_is_in_the_reason(
    home: Path, service: JobService, runner: str
) -> None:
    if runner == "sandbox":
        from trainport.runners.sandbox import sandbox_problem

        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    put(home, "data", "train/x.csv", "1\n")
    name = f"bad-shard-{runner}"
    service.create(
        script_job(home, name, {"train.py": BAD_SHARD}, "train.py", shard="7"), runner=runner
    )
    record = wait_for(service, name)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    head, command = reason.rsplit("\nCommand ", 1)
    assert head == (
        'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "ValueError: bad shard 7"'
    )
    assert command.startswith('"') and command.endswith(' train.py --shard 7", exit code: 1')


def test_a_user_script_failure_file_wins(home: Path, service: JobService) -> None:
    code = (
        "import os\n"
        "base = os.environ['SAGEMAKER_BASE_DIR']\n"
        "open(base + '/output/failure', 'w').write('DataError: my own words')\n"
        "raise SystemExit(2)\n"
    )
    put(home, "data", "train/x.csv", "1\n")
    service.create(script_job(home, "own-words", {"train.py": code}, "train.py"), runner="process")
    record = wait_for(service, "own-words")
    assert (record.status, record.failure_reason) == ("Failed", "DataError: my own words")


def test_an_entrypoint_without_failure_file_gives_its_last_lines(service: JobService) -> None:
    code = "print('reading', flush=True)\nraise RuntimeError('the disk went away')\n"
    service.create(python_job("byoc-lines", code), runner="process")
    record = wait_for(service, "byoc-lines")
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert reason.startswith("AlgorithmError: ")
    assert reason.endswith("RuntimeError: the disk went away, exit code: 1")


def test_the_reason_through_the_cli(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(BAD_SHARD)
    done = subprocess.run(
        [*TRAINPORT, "run", "--entry-point", str(script), "--hp", "shard=7", "--runner", "process"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 1, done.stderr
    assert "ExecuteUserScriptError" in done.stderr
    assert 'ErrorMessage "ValueError: bad shard 7"' in done.stderr


TRACEBACK_THEN_EXIT = """
import sys, time, traceback
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 1:
    try:
        raise ValueError("bad shard 7")
    except ValueError:
        traceback.print_exc()
        sys.exit(3)
time.sleep(300)
"""


@pytest.mark.slow
def test_an_mpi_ranks_error_is_in_the_reason(home: Path, service: JobService) -> None:
    require(shutil.which("mpirun") is not None, "OpenMPI is not installed")
    require(mpi.has_mpi4py(), "mpi4py is not installed")
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(
        home,
        "mpi-error",
        {"train.py": TRACEBACK_THEN_EXIT},
        "train.py",
        sagemaker_mpi_enabled="true",
        sagemaker_mpi_num_of_processes_per_host="2",
    )
    body["ResourceConfig"] = {
        "InstanceType": "ml.c5.xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    service.create(body, runner="process")
    record = wait_for(service, "mpi-error", timeout=180)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert "MPI rank 1 on host algo-1 " in reason, reason
    assert "ValueError: bad shard 7" in reason, reason


TORCHRUN_TAIL = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "train.py", line 4, in <module>',
    "[rank1]: ValueError: bad shard 7",
    "E1125 12:00:00 failed (exitcode: 1) local_rank: 1 (pid: 42) of binary: python",
    "Traceback (most recent call last):",
    '  File "torch/distributed/run.py", line 9, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "============================================================",
    "train.py FAILED",
]


def test_torchruns_report_gives_way_to_the_ranks_error() -> None:
    assert failure.last_exception(TORCHRUN_TAIL) == "ValueError: bad shard 7"


RANK_RAISES = """
import os
if os.environ["LOCAL_RANK"] == "1":
    raise ValueError("bad shard 7")
"""


@pytest.mark.slow
def test_a_torchrun_ranks_error_is_in_the_reason(home: Path, service: JobService) -> None:
    from tests.conftest import require_module

    require_module("torch")
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(
        home,
        "torchrun-error",
        {"train.py": RANK_RAISES},
        "train.py",
        sagemaker_torch_distributed_enabled="true",
    )
    body["Tags"] = [{"Key": "trainport:processes-per-host", "Value": "2"}]
    service.create(body, runner="process")
    record = wait_for(service, "torchrun-error", timeout=180)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert 'ErrorMessage "ValueError: bad shard 7"' in reason, reason
    assert "torch.distributed.run" in reason
