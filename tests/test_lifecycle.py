"""Real jobs, real processes and signals: a job's lifecycle as docs/contract.md's "The end of
a job" describes it."""

from __future__ import annotations

import json
import os
import signal
import tarfile
from pathlib import Path

import pytest

from tests.conftest import put, python_job, request, require, wait_for, wait_until
from trainport.config import container_engine_setting
from trainport.errors import NotFoundError, ResourceInUseError, ValidationError
from trainport.jobs.service import JobService
from trainport.jobs.supervisor import host_addresses
from trainport.runners import container
from trainport.runners.sandbox import sandbox_problem

BYOC = Path(__file__).resolve().parents[1] / "examples" / "byoc"


def members(home: Path, uri: str) -> dict[str, bytes]:
    path = home / "store" / uri[len("s3://") :]
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def transitions(record: object) -> list[str]:
    return [t.status for t in record.transitions]  # type: ignore[attr-defined]


@pytest.fixture
def sandbox() -> None:
    require(sandbox_problem() is None, f"no sandbox on this machine: {sandbox_problem()}")


def byoc_job(name: str, **hps: str) -> dict[str, object]:
    return request(
        name,
        AlgorithmSpecification={"TrainingImage": str(BYOC), "TrainingInputMode": "File"},
        HyperParameters=hps,
        InputDataConfig=[
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://data/{name}/"}
                },
            }
        ],
        Tags=[{"Key": "trainport:runner", "Value": "sandbox"}],
    )


@pytest.mark.usefixtures("sandbox")
@pytest.mark.parametrize("way", ["runc", "bwrap"])
def test_two_concurrent_byoc_jobs_each_see_only_their_own_opt_ml(
    home: Path, service: JobService, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if way == "runc":
        require(os.geteuid() == 0, "runc needs root")
    elif os.geteuid() == 0:
        pytest.skip("as root the sandbox is runc; bubblewrap is the way for a non-root user")
    monkeypatch.setenv("TRAINPORT_SANDBOX", way)
    put(home, "data", "job-a/one.txt", "aaaa")
    put(home, "data", "job-a/deep/two.txt", "aa")
    put(home, "data", "job-b/three.txt", "bbbbbbbbb")
    service.create(byoc_job("job-a", sleep="1", lr="0.1"))
    service.create(byoc_job("job-b", sleep="1"))
    a, b = wait_for(service, "job-a"), wait_for(service, "job-b")
    assert (a.status, b.status) == ("Completed", "Completed"), (a.failure_reason, b.failure_reason)
    log_a = [line for _, line in service.logs("job-a")]
    assert 'hyperparameters={"lr": "0.1", "sleep": "1"}' in log_a
    assert 'host=algo-1 files=["deep/two.txt", "one.txt"]' in log_a
    assert json.loads(members(home, a.model_artifacts)["model.json"]) == {
        "job": "job-a",
        "bytes": 6,
        "files": ["deep/two.txt", "one.txt"],
    }
    assert json.loads(members(home, b.model_artifacts)["model.json"])["files"] == ["three.txt"]
    assert transitions(a) == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    # the time in each transition is contiguous: each EndTime is the next StartTime
    for before, after in zip(a.transitions, a.transitions[1:], strict=False):
        assert before.end_time == after.start_time


@pytest.mark.usefixtures("sandbox")
def test_failure_file_becomes_the_failure_reason(home: Path, service: JobService) -> None:
    put(home, "data", "fails/x.txt", "x")
    service.create(byoc_job("fails", fail="yes"))
    record = wait_for(service, "fails")
    assert record.status == "Failed"
    assert record.failure_reason == "RuntimeError: asked to fail by the 'fail' hyperparameter"
    assert transitions(record)[-1] == "Failed"
    assert record.model_artifacts  # uploaded after failure too


def test_exit_code_reason_without_failure_file(service: JobService) -> None:
    service.create(python_job("exit3", "import sys; sys.exit(3)"))
    record = wait_for(service, "exit3")
    assert (record.status, record.failure_reason) == ("Failed", "AlgorithmError: , exit code: 3")


def test_failure_reason_is_cut_at_1024_characters_keeping_the_cause(
    service: JobService,
) -> None:
    """A long traceback keeps its first lines and its last one, the real cause."""
    code = (
        "import os,sys; base=os.environ['SAGEMAKER_BASE_DIR'];"
        "open(base+'/output/failure','w').write('Traceback '+'x'*5000+' RuntimeError: cause'); sys.exit(1)"
    )
    service.create(
        python_job("long-reason", code, Tags=[{"Key": "trainport:runner", "Value": "process"}])
    )
    record = wait_for(service, "long-reason")
    reason = record.failure_reason
    assert reason is not None and len(reason) == 1024
    assert reason.startswith("Traceback xxx") and reason.endswith("xxx RuntimeError: cause")
    assert "\n...\n" in reason


SAVE_ON_TERM = """
import os, signal, sys, time
base = os.environ['SAGEMAKER_BASE_DIR']
def on_term(signum, frame):
    print('got SIGTERM, saving', flush=True)
    time.sleep(0.5)
    open(base + '/model/saved-in-grace.txt', 'w').write('grace')
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('ready', flush=True)
while True:
    time.sleep(0.05)
"""


def test_stop_sigterm_grace_and_the_model_saved_in_grace_is_uploaded(
    home: Path, service: JobService
) -> None:
    service.create(python_job("stop-me", SAVE_ON_TERM))
    wait_until(lambda: any("ready" in line for _, line in service.logs("stop-me")), what="ready")
    stopping = service.stop("stop-me")
    assert (stopping.status, stopping.secondary_status) == ("Stopping", "Stopping")
    record = wait_for(service, "stop-me")
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    assert transitions(record)[-3:] == ["Stopping", "Uploading", "Stopped"]
    assert members(home, record.model_artifacts) == {"saved-in-grace.txt": b"grace"}
    assert record.failure_reason is None


def test_sigkill_after_the_grace_period(home: Path, service: JobService) -> None:
    ignore_term = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
        "while True: time.sleep(0.05)"
    )
    service.create(
        python_job(
            "stubborn", ignore_term, Tags=[{"Key": "trainport:stop-grace-seconds", "Value": "1"}]
        )
    )
    wait_until(lambda: any("ready" in line for _, line in service.logs("stubborn")), what="ready")
    service.stop("stubborn")
    record = wait_for(service, "stubborn")
    assert record.status == "Stopped"
    supervisor_log = (home / "jobs" / "stubborn" / "supervisor.log").read_text()
    assert "grace period of 1 s over; sending SIGKILL" in supervisor_log
    # The grace period was given in full: the job's record says when Stop was asked and
    # when the job ended, both after the fact, whatever the machine's load.
    times = {t.status: t.start_time for t in record.transitions}
    assert times["Stopped"] - times["Stopping"] >= 0.9


def test_max_runtime(home: Path, service: JobService) -> None:
    service.create(
        python_job("too-long", SAVE_ON_TERM, StoppingCondition={"MaxRuntimeInSeconds": 1})
    )
    record = wait_for(service, "too-long")
    assert (record.status, record.secondary_status) == ("Stopped", "MaxRuntimeExceeded")
    assert members(home, record.model_artifacts) == {"saved-in-grace.txt": b"grace"}


CHECKPOINTED = """
import os, pathlib
ckpt = pathlib.Path(os.environ['SAGEMAKER_BASE_DIR']) / 'checkpoints'
state = ckpt / 'step.txt'
step = int(state.read_text()) if state.exists() else 0
print(f'resumed at step {step}', flush=True)
ckpt.mkdir(parents=True, exist_ok=True)
state.write_text(str(step + 5))
"""


def test_checkpoints_resume_across_runs(home: Path, service: JobService) -> None:
    ckpt = {"S3Uri": "s3://ckpt/run-1/"}
    tags = [{"Key": "trainport:runner", "Value": "process"}]
    for name in ("ckpt-a", "ckpt-b"):
        service.create(python_job(name, CHECKPOINTED, CheckpointConfig=ckpt, Tags=tags))
        assert wait_for(service, name).status == "Completed"
    assert "resumed at step 0" in [line for _, line in service.logs("ckpt-a")]
    assert "resumed at step 5" in [line for _, line in service.logs("ckpt-b")]
    assert (home / "store" / "ckpt" / "run-1" / "step.txt").read_text() == "10"


def test_metrics_and_logs(service: JobService) -> None:
    code = "for i in range(3): print(f'epoch={i} loss={1/(i+1):.3f} acc=0.{i}')"
    algo = {
        "MetricDefinitions": [
            {"Name": "loss", "Regex": "loss=([0-9.]+)"},
            {"Name": "acc", "Regex": "acc=([0-9.]+)"},
        ]
    }
    service.create(python_job("metrics", code, algo=algo))
    record = wait_for(service, "metrics")
    described = service.describe("metrics")
    assert [(m["MetricName"], m["Value"]) for m in described["FinalMetricDataList"]] == [
        ("acc", 0.2),
        ("loss", 0.333),
    ]
    assert [v for _, v in service.metric_series("metrics")["loss"]] == [1.0, 0.5, 0.333]
    stamped = list(service.logs("metrics"))
    assert [line for _, line in stamped] == [
        "epoch=0 loss=1.000 acc=0.0",
        "epoch=1 loss=0.500 acc=0.1",
        "epoch=2 loss=0.333 acc=0.2",
    ]
    assert all(record.creation_time <= ts <= record.training_end_time for ts, _ in stamped)
    assert described["BillableTimeInSeconds"] >= 1
    assert described["TrainingJobArn"].endswith(":training-job/metrics")


def test_environment_and_job_identity(service: JobService) -> None:
    code = "import os; print(os.environ['TRAINING_JOB_NAME'], os.environ['TRAINING_JOB_ARN'], os.environ['MY_VAR'])"
    service.create(python_job("env-job", code, Environment={"MY_VAR": "hello"}))
    assert wait_for(service, "env-job").status == "Completed"
    (line,) = [line for _, line in service.logs("env-job")]
    assert line == "env-job arn:aws:sagemaker:us-east-1:000000000000:training-job/env-job hello"


def test_process_runner_points_sagemaker_base_dir_into_the_job(
    home: Path, service: JobService
) -> None:
    put(home, "data", "p/x.txt", "x")
    code = (
        "import os, json; base=os.environ['SAGEMAKER_BASE_DIR'];"
        "print(base); print(sorted(os.listdir(base + '/input/data/train')));"
        "print(json.load(open(base + '/input/config/resourceconfig.json'))['hosts'])"
    )
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/p/"}},
    }
    service.create(python_job("proc", code, InputDataConfig=[channel]), runner="process")
    record = wait_for(service, "proc")
    assert record.status == "Completed", record.failure_reason
    lines = [line for _, line in service.logs("proc")]
    assert lines == [str(home / "jobs" / "proc" / "hosts" / "algo-1"), "['x.txt']", "['algo-1']"]


@pytest.mark.usefixtures("sandbox")
def test_sandbox_hides_other_jobs_and_resolves_algo_1(home: Path, service: JobService) -> None:
    # Nothing of TRAINPORT_HOME exists inside: the sandbox is built from an allow-list.
    code = (
        "import os, socket; print(socket.gethostbyname('algo-1'));"
        f"print(os.path.exists({str(home / 'jobs')!r}), os.path.exists({str(home)!r}))"
    )
    service.create(python_job("hidden", code), runner="sandbox")
    assert wait_for(service, "hidden").status == "Completed"
    # algo-1 is its own address: the job network's (as root) or its loopback block's.
    address, hidden = [line for _, line in service.logs("hidden")]
    assert hidden == "False False"
    if os.geteuid() == 0:
        assert address.startswith("10.") and address.endswith(".2"), address
    else:
        assert address == host_addresses("hidden", ("algo-1",))["algo-1"]


def test_supervisor_killed_mid_job_is_marked_failed_and_training_stopped(
    service: JobService,
) -> None:
    code = "import time; print('ready', flush=True); time.sleep(300)"
    service.create(python_job("orphan", code))
    wait_until(lambda: any("ready" in line for _, line in service.logs("orphan")), what="ready")
    record = service.get("orphan")
    assert record.supervisor is not None and record.training_pgid
    os.kill(record.supervisor[0], signal.SIGKILL)
    wait_until(lambda: service.get("orphan").status == "Failed", timeout=30, what="reconcile")
    ended = service.get("orphan")
    assert "supervisor of this job" in (ended.failure_reason or "")
    assert "training processes were stopped" in (ended.failure_reason or "")
    # Nothing of the group runs (a sandbox's init may stay a zombie until the machine's
    # init reaps it: it trains nothing).
    from trainport.runners.api import _group_runs

    pgid = record.training_pgid
    wait_until(lambda: not _group_runs(pgid), timeout=10, what="the training group gone")


def test_duplicate_name_is_refused_and_the_first_job_untouched(service: JobService) -> None:
    service.create(python_job("dup", "print('first')"))
    first = wait_for(service, "dup")
    with pytest.raises(ResourceInUseError, match="already exists"):
        service.create(python_job("dup", "print('second')"))
    assert service.get("dup") == first
    assert [line for _, line in service.logs("dup")] == ["first"]


def test_unknown_job(service: JobService) -> None:
    with pytest.raises(NotFoundError, match="not found"):
        service.describe("nope")


def test_empty_prefix_is_refused_before_anything_runs(home: Path, service: JobService) -> None:
    channel = {
        "ChannelName": "train",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/none/"}},
    }
    with pytest.raises(ValidationError, match='No S3 objects found under S3 URL "s3://data/none/"'):
        service.create(python_job("empty", "print(1)", InputDataConfig=[channel]))
    with pytest.raises(NotFoundError):
        service.get("empty")
    assert not (home / "jobs" / "empty").exists()


def test_image_folder_without_train_is_refused(tmp_path: Path, service: JobService) -> None:
    with pytest.raises(ValidationError, match="no executable 'train'"):
        service.create(
            request(
                "noimg",
                AlgorithmSpecification={
                    "TrainingImage": str(tmp_path),
                    "TrainingInputMode": "File",
                },
            )
        )
    registry_image = request(
        "noimg-registry",
        AlgorithmSpecification={"TrainingImage": "123.dkr.ecr/x:1", "TrainingInputMode": "File"},
    )
    if container.installed_engine(container_engine_setting()) is None:
        with pytest.raises(ValidationError, match="not a local folder"):
            service.create(registry_image)
    else:  # an engine pulls it when the job starts; the failed pull names the image
        service.create(registry_image)
        ended = wait_for(service, "noimg-registry")
        assert ended.status == "Failed"
        assert "123.dkr.ecr/x:1" in (ended.failure_reason or ""), ended.failure_reason
    with pytest.raises(ValidationError, match="not on PATH"):
        service.create(
            request(
                "noimg",
                AlgorithmSpecification={
                    "ContainerEntrypoint": ["no-such-binary-xyz"],
                    "TrainingInputMode": "File",
                },
            )
        )


def test_artifacts_contain_model_and_output_data(home: Path, service: JobService) -> None:
    code = (
        "import os; b=os.environ['SAGEMAKER_BASE_DIR'];"
        "os.makedirs(b+'/model/sub'); open(b+'/model/sub/w.bin','wb').write(b'\\x00\\x01');"
        "open(b+'/output/data/report.txt','w').write('ok')"
    )
    service.create(python_job("arts", code), runner="process")
    record = wait_for(service, "arts")
    assert record.model_artifacts == "s3://out/jobs/arts/output/model.tar.gz"
    assert members(home, record.model_artifacts) == {"sub/w.bin": b"\x00\x01"}
    out = members(home, "s3://out/jobs/arts/output/output.tar.gz")
    assert out == {"report.txt": b"ok"}


SYNC_DURING_RUN = """
import os, pathlib, time
ckpt = pathlib.Path(os.environ['SAGEMAKER_BASE_DIR']) / 'checkpoints'
ckpt.mkdir(parents=True, exist_ok=True)
(ckpt / 'epoch-1.pt').write_text('weights-1')
print('written', flush=True)
time.sleep(120)
"""


def test_checkpoints_sync_while_the_job_runs(home: Path, service: JobService) -> None:
    service.create(
        python_job("ckpt-live", SYNC_DURING_RUN, CheckpointConfig={"S3Uri": "s3://ckpt/live"}),
        runner="process",
    )
    synced = home / "store" / "ckpt" / "live" / "epoch-1.pt"
    wait_until(synced.exists, timeout=30, what="checkpoint synced during the run")
    assert service.get("ckpt-live").status == "InProgress"
    assert synced.read_text() == "weights-1"
    service.stop("ckpt-live")
    assert wait_for(service, "ckpt-live").status == "Stopped"


def test_download_progress_is_reported(tmp_path: Path) -> None:
    from trainport.store.local import LocalStore
    from trainport.store.transfer import Transfer, download_all

    store = LocalStore(tmp_path / "store")
    for i in range(20):
        store.put_bytes("b", f"k{i}", b"x" * 1000)
    seen: list[tuple[int, int, int, int]] = []
    items = [Transfer("b", f"k{i}", tmp_path / "out" / f"k{i}", 1000) for i in range(20)]
    stats = download_all(store, items, workers=4, on_progress=lambda *a: seen.append(a))
    assert stats.objects == 20 and stats.bytes == 20_000
    assert seen[-1] == (20, 20, 20_000, 20_000)
