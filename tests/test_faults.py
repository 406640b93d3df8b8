"""What an adversarial probe broke: same-name submissions, hostile metric
regexes, a full disk, a killed supervisor's mounts and archives, reconcile racing the queue,
checkpoint folder markers. Real CLI processes, real signals, moto over HTTP for S3."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.conftest import put, python_job, require, wait_for, wait_until
from tests.pipe.conftest import require_fuse
from trainport.config import load_settings
from trainport.errors import ValidationError
from trainport.host import fastfile
from trainport.host.metrics import MetricMatcher
from trainport.jobs import liveness
from trainport.jobs.records import JobRecord, MetricPoint, Transition
from trainport.jobs.scheduler import Scheduler
from trainport.jobs.service import JobService, in_queue, is_orphan
from trainport.jobs.status import Finished, Phase, advance, goes_back
from trainport.jobs.supervisor import should_retry

TRAINPORT = [sys.executable, "-m", "trainport.cli"]


def tp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=timeout)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def code_and_data(tmp_path: Path, tag: str) -> tuple[Path, Path]:
    code = tmp_path / f"code-{tag}"
    code.mkdir()
    (code / "train.py").write_text(f"print('code {tag}')\n")
    data = tmp_path / f"data-{tag}"
    data.mkdir()
    (data / f"{tag}.txt").write_text(tag)
    return code / "train.py", data


# -- 1: a name is checked before anything is uploaded, and uploads are the submission's own --


def test_refused_duplicate_name_leaves_the_stored_code_and_data_alone(
    home: Path, tmp_path: Path
) -> None:
    entry, data = code_and_data(tmp_path, "first")
    done = tp("run", "--name", "dup", "--entry-point", str(entry), "--channel", f"train={data}")
    assert done.returncode == 0, done.stderr
    assert "code first" in done.stdout
    stored = tree(home / "store")
    entry, data = code_and_data(tmp_path, "second")
    again = tp("run", "--name", "dup", "--entry-point", str(entry), "--channel", f"train={data}")
    assert again.returncode == 2
    assert "'dup' already exists" in again.stderr
    assert tree(home / "store") == stored


def test_same_name_at_the_same_instant_runs_the_winners_own_code(
    home: Path, tmp_path: Path
) -> None:
    runs = {}
    for tag in ("left", "right"):
        entry, data = code_and_data(tmp_path, tag)
        runs[tag] = subprocess.Popen(
            [*TRAINPORT, "run", "--detach", "--name", "race", "--entry-point", str(entry),
             "--channel", f"train={data}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
    codes = {tag: proc.wait(timeout=120) for tag, proc in runs.items()}
    winners = [tag for tag, code in codes.items() if code == 0]
    assert len(winners) == 1, codes
    service = JobService(load_settings())
    record = wait_for(service, "race")
    assert record.status == "Completed", record.failure_reason
    assert [line for _, line in service.logs("race")] == [f"code {winners[0]}"]
    # The loser's uploads are gone; the winner's channel holds its own file only.
    channel = record.request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"]
    folder = home / "store" / channel[len("s3://") :]
    assert sorted(tree(folder)) == [f"{winners[0]}.txt"]
    uploads = tree(home / "store" / "trainport" / "race")
    assert len({path.split("/")[0] for path in uploads}) == 1, sorted(uploads)


# -- 2: a user's Regex is matched outside the supervisor, within a budget --------------------

RUNAWAY = [
    {"Name": "loss", "Regex": r"loss=([0-9.]+)"},
    {"Name": "stall", "Regex": r"(a+)+$"},  # exponential on a run of a's that ends in b
]


def test_a_runaway_metric_regex_holds_up_neither_logs_nor_stop(service: JobService) -> None:
    code = (
        "import time\n"
        "print('loss=0.5', flush=True)\n"
        "print('a' * 60 + 'b', flush=True)\n"
        "print('after', flush=True)\n"
        "time.sleep(300)\n"
    )
    service.create(
        python_job("runaway", code, algo={"MetricDefinitions": RUNAWAY}), runner="process"
    )
    wait_until(lambda: "after" in [t for _, t in service.logs("runaway")], what="log capture")

    def notes() -> list[str]:
        return [t for _, t in service.logs("runaway") if t.startswith("[trainport] metrics")]

    # The runaway line ends its matcher within the budget of CPU time (a job's end would
    # not wait for that: see test_metric_backlog.py); stop once it has.
    wait_until(lambda: notes(), what="the runaway line's warning")
    assert service.stop("runaway").status == "Stopping"
    record = wait_for(service, "runaway")
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    assert [(m.name, m.value) for m in record.final_metrics] == [("loss", 0.5)]
    (note,) = notes()
    assert note.startswith("[trainport] metrics disabled") and "'aaaa" in note, note


def test_the_matcher_reports_points_then_disables_itself_on_a_runaway_line() -> None:
    batches: list[list[MetricPoint]] = []
    disabled: list[str] = []
    matcher = MetricMatcher(
        [(d["Name"], d["Regex"]) for d in RUNAWAY],
        on_points=batches.append,
        on_warning=disabled.append,
        budget=0.2,
        end_grace=600,  # this test is of the runaway line, not of the job's end
    )
    matcher.feed("loss=1.5", 1.0)
    matcher.feed("a" * 60 + "b", 2.0)
    matcher.feed("loss=2.5", 3.0)  # after the runaway line: not matched any more
    matcher.close()
    assert [p for batch in batches for p in batch] == [MetricPoint("loss", 1.5, 1.0)]
    assert len(disabled) == 1 and "0.2 s of CPU" in disabled[0]


# -- 3: a Regex that cannot compile is refused at submission, naming its field --------------


def test_uncompilable_metric_regex_is_refused_through_the_service(service: JobService) -> None:
    body = python_job(
        "bad-regex",
        "print('loss=1')",
        algo={"MetricDefinitions": [{"Name": "ok", "Regex": "x"}, {"Name": "loss", "Regex": "(unclosed"}]},
    )  # fmt: skip
    with pytest.raises(
        ValidationError, match=r"AlgorithmSpecification\.MetricDefinitions\[1\]\.Regex"
    ):
        service.create(body)
    assert service.list() == []


def test_uncompilable_metric_regex_is_refused_by_the_cli(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('loss=1')\n")
    done = tp(
        "run", "--name", "bad-metric", "--entry-point", str(script), "--metric", "loss=(unclosed"
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "MetricDefinitions[0].Regex" in lines[0], done.stderr
    assert tp("jobs", "describe", "bad-metric").returncode == 2
    assert tree(home / "store") == {}  # its code was uploaded, then dropped


# -- 8: folder markers under a checkpoint prefix are not files --------------------------------


def test_checkpoint_folder_markers_are_skipped_when_seeding(
    s3_home: Path, moto_endpoint: str
) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt-markers")
    s3.put_object(Bucket="ckpt-markers", Key="ck/run1/", Body=b"")
    s3.put_object(Bucket="ckpt-markers", Key="ck/run1/state.txt", Body=b"epoch 3")
    service = JobService(load_settings())
    code = (
        "import os; d=os.environ['SAGEMAKER_BASE_DIR']+'/checkpoints'\n"
        "for root, dirs, names in sorted(os.walk(d)):\n"
        "    for n in sorted(names): print(os.path.relpath(os.path.join(root, n), d), open(os.path.join(root, n)).read())\n"
    )
    service.create(
        python_job(
            "ckpt-markers",
            code,
            CheckpointConfig={"S3Uri": "s3://ckpt-markers/ck/"},
            OutputDataConfig={"S3OutputPath": "s3://ckpt-markers/out"},
        ),
        runner="process",
    )
    record = wait_for(service, "ckpt-markers")
    assert record.status == "Completed", record.failure_reason
    assert [line for _, line in service.logs("ckpt-markers")] == ["run1/state.txt epoch 3"]


# -- 4: a full disk ends the job Failed, saying so and where --------------------------------


@pytest.fixture
def small_home(home: Path) -> Iterator[Path]:
    """TRAINPORT_HOME on an 8 MiB tmpfs of its own, removed after the test."""
    require(os.geteuid() == 0, "mounting a small tmpfs as TRAINPORT_HOME needs root")
    home.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(home)], check=True)
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], check=True)


def test_disk_filled_while_staging(small_home: Path, tmp_path: Path) -> None:
    put(small_home, "data", "ds/big.bin", os.urandom(5 << 20))  # staged twice over: no room
    entry = tmp_path / "train.py"
    entry.write_text("print('never')\n")
    done = tp("run", "--name", "full-staging", "--entry-point", str(entry),
              "--channel", "train=s3://data/ds/")  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "Job full-staging: Failed (Failed)" in done.stderr
    described = json.loads(tp("jobs", "describe", "full-staging").stdout)
    data = small_home / "jobs" / "full-staging" / "hosts" / "algo-1" / "input" / "data"
    reason = described["FailureReason"]
    assert reason.startswith(f"ClientError: no space left on the device that holds {data} ")
    assert "while staging the input data" in reason and "killed or crashed" not in reason
    assert list(data.iterdir()) == []  # the staged copies are gone


def test_disk_filled_while_writing_the_model(small_home: Path, tmp_path: Path) -> None:
    entry = tmp_path / "train.py"
    entry.write_text(
        "import os\n"
        "with open(os.environ['SM_MODEL_DIR'] + '/model.bin', 'wb') as f:\n"
        "    for _ in range(40): f.write(os.urandom(1 << 20))\n"
    )
    done = tp("run", "--name", "full-model", "--entry-point", str(entry))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "Job full-model: Failed (Failed)" in done.stderr
    root = small_home / "jobs" / "full-model" / "hosts" / "algo-1"
    reason = json.loads(tp("jobs", "describe", "full-model").stdout)["FailureReason"]
    assert reason.startswith(f"ClientError: no space left on the device that holds {root} ")
    assert "while training" in reason


def test_disk_filled_while_packing_the_model_says_where(small_home: Path, tmp_path: Path) -> None:
    # Fits while training (with the host's reserve), not twice over: packing fills the disk.
    entry = tmp_path / "train.py"
    entry.write_text(
        "import os\n"
        "with open(os.environ['SM_MODEL_DIR'] + '/model.bin', 'wb') as f:\n"
        "    f.write(os.urandom(9 << 19))\n"
    )
    done = tp("run", "--name", "full-pack", "--entry-point", str(entry))
    assert done.returncode == 1, done.stderr
    reason = json.loads(tp("jobs", "describe", "full-pack").stdout)["FailureReason"]
    scratch = small_home / "jobs" / "full-pack" / "tmp"
    model = small_home / "jobs" / "full-pack" / "hosts" / "algo-1" / "model"
    assert reason.startswith(
        "ClientError: artifact upload failed: no space left on the device that holds "
        f"{scratch} (packing model.tar.gz from {model})"
    ), reason


def test_full_disk_at_submission_is_one_line(small_home: Path, tmp_path: Path) -> None:
    assert tp("jobs", "list").returncode == 0  # the database exists
    with open(small_home / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * (1 << 20))
    entry = tmp_path / "train.py"
    entry.write_text("print('never')\n")
    done = tp("run", "--name", "full-submit", "--entry-point", str(entry))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "no space is left on the device" in lines[0]


# -- 5: reconcile unmounts the FastFile views of a killed supervisor -------------------------


def fuse_mounts(root: Path) -> list[Path]:
    return fastfile.mounts_under(Path("/proc/self/mountinfo").read_text(), root.resolve())


def test_reconcile_unmounts_a_killed_supervisors_fastfile_view(
    home: Path, service: JobService
) -> None:
    require_fuse()
    put(home, "data", "ff/a.txt", "A")
    body = python_job(
        "ff-orphan",
        "import time; print('ready', flush=True); time.sleep(300)",
        InputDataConfig=[
            {
                "ChannelName": "ff",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/ff/"}
                },
                "InputMode": "FastFile",
            }
        ],
    )
    service.create(body, runner="process")
    wait_until(lambda: any("ready" in line for _, line in service.logs("ff-orphan")), what="ready")
    view = home / "jobs" / "ff-orphan" / "hosts" / "algo-1" / "input" / "data" / "ff"
    assert fuse_mounts(home) == [view.resolve()]
    supervisor = service.get("ff-orphan").supervisor
    assert supervisor is not None
    os.kill(supervisor[0], signal.SIGKILL)
    wait_until(lambda: service.get("ff-orphan").status == "Failed", what="reconcile")
    assert fuse_mounts(home) == []
    assert not os.path.ismount(view)


def test_mountinfo_lines_are_read_with_their_escapes() -> None:
    text = (
        "36 35 98:0 / /mnt/jobs/a\\040b/in rw - fuse trainport-fastfile:x rw\n"
        "37 35 98:0 / /mnt/jobs/a\\040b/in/deeper rw shared:1 - fuse.x src rw\n"
        "38 35 98:0 / /mnt/jobs/ab rw - fuse src rw\n"
        "39 35 98:0 / /mnt/jobs/a\\040b/tmp rw - tmpfs tmpfs rw\n"
    )
    assert fastfile.mounts_under(text, Path("/mnt/jobs/a b")) == [
        Path("/mnt/jobs/a b/in/deeper"),
        Path("/mnt/jobs/a b/in"),
    ]


# -- 6: a job being started is never an orphan; an ended job never trains -----------------


def _record(**fields: object) -> JobRecord:
    base: dict[str, Any] = {
        "name": "j",
        "arn": "arn",
        "request": {},
        "creation_time": 0.0,
        "transitions": (
            Transition("Pending", 0.0, 1000.0, ""),
            Transition("Starting", 1000.0, None, ""),
        ),
    }
    base.update(fields)
    return JobRecord(**base)


LIVE = (1, 1, "boot")
DEAD = (2, 2, "boot")


@pytest.mark.parametrize(
    ("fields", "now", "orphan"),
    [
        # Queued an hour, then left the queue: its launcher lives, so it is being started.
        ({"secondary_status": "Starting", "launcher": LIVE}, 4600.0, False),
        # Its launcher died just now: the supervisor it spawned still gets the window.
        ({"secondary_status": "Starting", "launcher": DEAD}, 1010.0, False),
        ({"secondary_status": "Starting", "launcher": DEAD}, 1000.0 + 3600, True),
        # Launched, and the supervisor not seen (it ended at once): the window, then orphaned.
        ({"secondary_status": "Starting"}, 1010.0, False),
        ({"secondary_status": "Starting"}, 1000.0 + 3600, True),
        ({"secondary_status": "Pending"}, 1e9, False),
        # Pending for a Ray cluster's capacity: its supervisor decides.
        ({"secondary_status": "Pending", "supervisor": LIVE}, 1e9, False),
        ({"secondary_status": "Pending", "supervisor": DEAD}, 1e9, True),
        ({"secondary_status": "Training", "supervisor": LIVE}, 1e9, False),
        ({"secondary_status": "Training", "supervisor": DEAD}, 1001.0, True),
        ({"status": "Failed", "secondary_status": "Failed", "supervisor": DEAD}, 1e9, False),
    ],
)
def test_the_orphan_verdict(fields: dict[str, object], now: float, orphan: bool) -> None:
    assert is_orphan(_record(**fields), now, lambda ident: ident == LIVE) is orphan


def test_only_a_pending_job_without_a_supervisor_is_in_the_queue() -> None:
    assert in_queue(_record(secondary_status="Pending"))
    # Waiting for a Ray cluster's capacity: it left the queue, it holds its slot.
    assert not in_queue(_record(secondary_status="Pending", supervisor=LIVE))
    assert not in_queue(_record(secondary_status="Starting"))
    assert not in_queue(_record(status="Stopping", secondary_status="Stopping"))


@pytest.mark.parametrize(
    ("current", "phase", "back"),
    [
        ("Training", "Downloading", True),  # a slower host, still staging its channels
        ("Downloading", "Starting", True),
        ("Training", "Uploading", False),
        ("Downloading", "Downloading", False),  # a new message for the same phase
        ("Pending", "Starting", False),  # placed after waiting for the cluster
        ("Starting", "Pending", False),
        ("Stopping", "Training", False),  # not a phase: advance decides
    ],
)
def test_a_host_phase_that_would_take_the_job_back(current: str, phase: str, back: bool) -> None:
    assert goes_back(current, phase) is back


LOST = Finished(None, "InternalServerError: Ray node 10.0.0.3 (host algo-2) died")


@pytest.mark.parametrize(
    ("outcome", "attempt", "attempts", "stopped", "retried"),
    [
        (LOST, 1, 2, False, True),
        (LOST, 2, 2, False, False),  # no attempts left
        (LOST, 1, 2, True, False),  # stopped: a stop is never undone by a retry
        (Finished(1, "AlgorithmError: ExitCode 1"), 1, 3, False, False),  # the code's own
        (Finished(None, "ClientError: the job's hosts could not be started"), 1, 3, False, False),
        (Finished(0, None), 1, 3, False, False),
        (LOST, 1, 1, False, False),  # no RetryStrategy
    ],
)
def test_the_retry_verdict(
    outcome: Finished, attempt: int, attempts: int, stopped: bool, retried: bool
) -> None:
    assert should_retry(outcome, attempt, attempts, stopped) is retried


def test_a_job_whose_starter_died_before_its_supervisor_ran(service: JobService) -> None:
    service.create(python_job("unstarted", "print('trained')"), start=False)
    starter = subprocess.Popen(["sleep", "60"])
    ident = liveness.identity(starter.pid)
    starter.kill()
    starter.wait()
    hour_ago = time.time() - 3600  # it left the queue an hour ago and nothing came of it
    service.db.update(
        "unstarted",
        lambda r: dataclasses.replace(
            advance(r, Phase("Starting", "Preparing the instances"), hour_ago), launcher=ident
        ),
    )
    assert service.reconcile() == ["unstarted"]
    reason = service.get("unstarted").failure_reason or ""
    assert f"the process starting this job (pid {starter.pid}) ended" in reason
    assert "never ran" in reason and "pid None" not in reason


def test_a_supervisor_started_for_an_ended_job_does_not_train_it(
    home: Path, service: JobService
) -> None:
    service.create(python_job("ended", "print('trained')"), start=False)
    assert service.stop("ended").status == "Stopped"
    done = subprocess.run(
        [sys.executable, "-m", "trainport.jobs.supervisor", "ended"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "not running it" in done.stderr
    record = service.get("ended")
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    assert not service.log_path("ended").exists()


def test_reconcile_in_another_process_while_the_queue_drains(
    home: Path, service: JobService
) -> None:
    scheduler = Scheduler(JobService(load_settings(), reconcile_on_read=False), 1, interval=0.05)
    names = [f"queued-{i}" for i in range(4)]
    for name in names:
        scheduler.submit(python_job(name, "print('trained')"))
    for name in names:  # queued for an hour, as far as any window can tell
        service.db.update(
            name, lambda r: dataclasses.replace(r, creation_time=r.creation_time - 3600)
        )
    reconciler = subprocess.Popen(
        [sys.executable, "-c", "from trainport.jobs.service import JobService\n"
         "service = JobService()\nwhile True: service.reconcile()"],
    )  # fmt: skip
    try:
        scheduler.start()
        records = [wait_for(service, name) for name in names]
    finally:
        scheduler.close()
        reconciler.kill()
        reconciler.wait()
    assert [(r.status, r.failure_reason) for r in records] == [("Completed", None)] * len(names)
    spans = sorted((r.training_start_time or 0, r.training_end_time or 0) for r in records)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans  # one job at a time, as --max-jobs 1 says


# -- 7: archives are packed in the job's folder, and a killed supervisor's are removed ------


def test_killed_during_upload_leaves_no_archive_behind(
    home: Path, service: JobService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))  # the supervisor's temp folder
    # A large sparse model: packing it takes long enough to be caught in the act.
    code = (
        "import os; m=os.environ['SAGEMAKER_BASE_DIR']+'/model/big.bin'\n"
        "with open(m, 'wb') as f: f.truncate(8 << 30)\n"
    )
    service.create(python_job("packing", code), runner="process")
    scratch = home / "jobs" / "packing" / "tmp"

    def archives() -> list[Path]:
        return [*scratch.rglob("*.tar.gz"), *system_tmp.rglob("*.tar.gz")]

    wait_until(lambda: bool(archives()), what="an archive being packed")
    supervisor = service.get("packing").supervisor
    assert supervisor is not None
    os.kill(supervisor[0], signal.SIGKILL)
    assert list(system_tmp.iterdir()) == []
    (home / "jobs" / "packing" / "hosts" / "algo-1" / "model" / "big.bin").unlink()
    wait_until(lambda: service.get("packing").status == "Failed", what="reconcile")
    assert not scratch.exists()
