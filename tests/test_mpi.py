"""MPI jobs: mpirun on algo-1 over every host through trainport's launch agent, no ssh.

Real OpenMPI, real mpi4py ranks, real processes on every host; the runner is each test's
parameter where both must hold.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import put, require, require_module, wait_for, wait_until
from tests.test_script_mode_job import script_job
from trainport.errors import ValidationError
from trainport.host import mpi
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _needs_mpi() -> None:
    require(
        shutil.which("mpirun") is not None, "OpenMPI is not installed (apt-get install openmpi-bin)"
    )
    require(mpi.has_mpi4py(), "mpi4py is not installed")


def runner_ok(runner: str) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")


RANKS = """
import json, os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
print("RANK " + json.dumps({
    "rank": comm.Get_rank(), "size": comm.Get_size(), "total": total,
    "ompi_rank": os.environ["OMPI_COMM_WORLD_RANK"],
    "local_rank": os.environ["OMPI_COMM_WORLD_LOCAL_RANK"],
    "host": os.environ["SM_CURRENT_HOST"],
    "resolved": socket.gethostbyname(os.environ["SM_CURRENT_HOST"]),
    "mark": os.environ.get("TRAINPORT_TEST_MARK"),
    "argv": sys.argv[1:],
}), flush=True)
"""


def mpi_job(
    home: Path, name: str, code: str, hosts: int = 2, per_host: int = 2, **hps: str
) -> dict[str, Any]:
    put(home, "data", "train/x.csv", "1\n")
    body = script_job(
        home,
        name,
        {"train.py": code},
        "train.py",
        sagemaker_mpi_enabled="true",
        sagemaker_mpi_num_of_processes_per_host=str(per_host),
        **hps,
    )
    body["ResourceConfig"] = {
        "InstanceType": "ml.c5.xlarge",
        "InstanceCount": hosts,
        "VolumeSizeInGB": 1,
    }
    return body


def rank_reports(service: JobService, name: str, hosts: int) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {}
    for k in range(1, hosts + 1):
        host = f"algo-{k}"
        seen[host] = [
            json.loads(raw)
            for _, text in service.logs(name, host=host)
            for raw in re.findall(r"RANK (\{.*\})", text)
        ]
    return seen


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_two_hosts_by_two_ranks_all_reduce_each_on_its_own_host(
    home: Path, service: JobService, runner: str
) -> None:
    runner_ok(runner)
    name = f"mpi-{runner}"
    body = mpi_job(
        home,
        name,
        RANKS,
        epochs="3",
        sagemaker_mpi_custom_mpi_options='"-x TRAINPORT_TEST_MARK=custom-reached"',
    )
    body["Environment"] = {"TRAINPORT_TEST_MARK": "not-forwarded"}
    service.create(body, runner=runner)
    record = wait_for(service, name, timeout=240)
    assert record.status == "Completed", record.failure_reason
    seen = rank_reports(service, name, 2)
    assert sorted(r["rank"] for r in seen["algo-1"]) == [0, 1]
    assert sorted(r["rank"] for r in seen["algo-2"]) == [2, 3]
    for host, reports in seen.items():
        for report in reports:
            assert report["size"] == 4 and report["total"] == 1 + 2 + 3 + 4
            assert report["host"] == host  # SM_* of its own host
            assert int(report["ompi_rank"]) == report["rank"]
            assert int(report["local_rank"]) == report["rank"] % 2
            assert report["mark"] == "custom-reached"  # the custom options reached mpirun
            assert report["argv"] == ["--epochs", "3"]
    # The job map, once, in algo-1's log: mpirun's --display-map would print it again from
    # every host's daemon.
    maps = [
        (host, text)
        for host in seen
        for _, text in service.logs(name, host=host)
        if "JOB MAP" in text or "MPI job map" in text
    ]
    assert maps == [("algo-1", f"[trainport] {mpi.job_map(['algo-1', 'algo-2'], 2)}")]


FAILING_RANK = """
import os, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
if rank == 3:
    sys.exit(3)
time.sleep(300)
"""


def test_a_failing_rank_fails_the_job_naming_its_host(home: Path, service: JobService) -> None:
    service.create(mpi_job(home, "mpi-fail", FAILING_RANK), runner="process")
    record = wait_for(service, "mpi-fail", timeout=180)
    assert record.status == "Failed"
    assert "algo-2" in (record.failure_reason or ""), record.failure_reason
    assert "rank 3" in (record.failure_reason or ""), record.failure_reason


SLEEPING_RANKS = """
import os, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
open(os.path.join(os.environ["PIDS"], f"rank{rank}"), "w").write(str(os.getpid()))
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def test_stop_ends_every_rank_on_every_host(
    home: Path, service: JobService, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    body = mpi_job(home, "mpi-stop", SLEEPING_RANKS)
    body["Environment"] = {"PIDS": str(pids)}
    service.create(body, runner="process")
    wait_until(lambda: len(list(pids.iterdir())) == 4, timeout=120, what="4 ranks started")
    ranks = [int(p.read_text()) for p in pids.iterdir()]
    assert all(alive(pid) for pid in ranks)
    service.stop("mpi-stop")
    record = wait_for(service, "mpi-stop", timeout=180)
    assert record.status == "Stopped"
    wait_until(lambda: not any(alive(pid) for pid in ranks), timeout=30, what="ranks gone")


def test_mpi_without_mpirun_is_refused_at_submission(
    home: Path, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_which = shutil.which
    monkeypatch.setattr(
        mpi.shutil, "which", lambda cmd, *a, **k: None if cmd == "mpirun" else real_which(cmd)
    )
    with pytest.raises(ValidationError, match="apt-get install openmpi-bin"):
        service.create(mpi_job(home, "mpi-none", RANKS))


def test_bad_mpi_settings_are_refused_at_submission(home: Path, service: JobService) -> None:
    with pytest.raises(ValidationError, match="sagemaker_mpi_num_of_processes_per_host"):
        service.create(mpi_job(home, "mpi-bad", RANKS, per_host=0))
    body = mpi_job(home, "mpi-both", RANKS)
    body["Tags"] = [{"Key": "trainport:distribution", "Value": "torchrun"}]
    with pytest.raises(ValidationError, match="both MPI and torchrun"):
        service.create(body)


def test_the_mpirun_command_has_the_toolkits_options() -> None:
    command = mpi.mpirun_command(
        hosts=["algo-1", "algo-2"],
        per_host=2,
        interface="eth0",
        agent=["/venv/bin/python", "-m", "trainport.host.mpi_launch"],
        program=["/venv/bin/python", "train.py"],
        custom_options=["-x", "A=1"],
    )
    joined = " ".join(command)
    assert command[:5] == ["mpirun", "--host", "algo-1:2,algo-2:2", "-np", "4"]
    for option in (
        "-bind-to none",
        "-map-by slot",
        "-mca orte_abort_on_non_zero_status 1",
        "-mca btl_tcp_if_include eth0",
        "-mca oob_tcp_if_include eth0",
        "-mca plm_rsh_agent /venv/bin/python -m trainport.host.mpi_launch",
        "-x A=1 /venv/bin/python train.py",
    ):
        assert option in joined


def test_the_job_map_names_each_hosts_ranks() -> None:
    assert mpi.job_map(["algo-1", "algo-2", "algo-3"], 2) == (
        "MPI job map: 6 ranks, 2 per host, by slot: algo-1 ranks 0-1, algo-2 ranks 2-3, "
        "algo-3 ranks 4-5"
    )
    assert mpi.job_map(["algo-1", "algo-2"], 1) == (
        "MPI job map: 2 ranks, 1 per host, by slot: algo-1 rank 0, algo-2 rank 1"
    )


def test_rank_output_is_routed_to_each_ranks_host() -> None:
    demux = mpi.RankDemux(mpi.rank_host(["algo-1", "algo-2"], 2))
    out = demux.feed(b"[1,3]<stdout>:4 local[1,1]<stdout>:one [1,3]<stdout>: done\n")
    out += demux.feed(b"[1,1]<stdout>:line\n")
    out += demux.feed(b"mpirun's own words\n")
    assert out == [
        ("algo-2", b"4 local done"),
        ("algo-1", b"one line"),
        (None, b"mpirun's own words"),
    ]


def test_failure_reason_names_the_rank_and_host() -> None:
    host_of = mpi.rank_host(["algo-1", "algo-2"], 2)
    report = [
        "Primary job  terminated normally, but 1 process returned",
        "a non-zero exit code. Per user-direction, the job has been aborted.",
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "the job to be terminated. The first process to do so was:",
        "",
        "  Process name: [[36429,1],3]",
        "  Exit code:    3",
    ]
    reason = mpi.failure_reason(report, host_of, 3)
    assert reason == "AlgorithmError: MPI rank 3 on host algo-2 exited with code 3"


def test_a_ranks_note_gives_the_error_behind_its_exit_code() -> None:
    host_of = mpi.rank_host(["algo-1", "algo-2"], 2)
    report = ["  Process name: [[36429,1],3]", "  Exit code:    1"]
    note = json.dumps({"rank": 3, "code": 1, "error": "ValueError: rank 3 gives up", "time": 1.0})
    other = json.dumps({"rank": 2, "code": 1, "error": "RuntimeError: peer gone", "time": 2.0})
    reason = mpi.failure_reason(report, host_of, 1, [other, note])
    assert reason == (
        "AlgorithmError: MPI rank 3 on host algo-2 exited with code 1: ValueError: rank 3 gives up"
    )


# What mpirun printed in one CI run after rank 3's MPI_Abort, when algo-2's daemon died
# during the teardown (exit 139): nothing in it names the rank.
DAEMON_DIED = [
    "ORTE was unable to reliably start one or more daemons.",
    "* an inability to create a connection back to mpirun due to a",
    "  lack of common network interfaces and/or no route found between",
    "  them. Please check network connectivity (including firewalls",
    "  and network routing requirements).",
    "--------------------------------------------------------------------------",
]


def test_a_ranks_note_names_it_when_mpiruns_report_does_not() -> None:
    host_of = mpi.rank_host(["algo-1", "algo-2"], 2)
    later = json.dumps({"rank": 1, "code": 143, "error": "", "time": 20.0})
    first = json.dumps({"rank": 3, "code": 3, "error": "", "time": 10.0})
    hostile = ["{", json.dumps({"rank": "3; rm", "code": 1, "time": 1.0}), "[]"]
    reason = mpi.failure_reason(DAEMON_DIED, host_of, 139, [later, *hostile, first])
    assert reason.startswith("AlgorithmError: MPI rank 3 on host algo-2 exited with code 3")
    assert "mpirun itself ended with code 139" in reason
    # Without notes, the report's tail stays the reason.
    assert "exited with code 139: * an inability" in mpi.failure_reason(DAEMON_DIED, host_of, 139)


def test_a_ranks_note_gives_the_error_behind_its_abort() -> None:
    host_of = mpi.rank_host(["algo-1", "algo-2"], 2)
    report = ["MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD", "with errorcode 1."]
    note = json.dumps({"rank": 2, "code": 1, "error": "ValueError: bad shard", "time": 1.0})
    reason = mpi.failure_reason(report, host_of, 1, [note])
    assert reason == (
        "AlgorithmError: MPI rank 2 on host algo-2 aborted the run (MPI_Abort, error code 1): "
        "ValueError: bad shard"
    )


RAISING_RANK = """
import time
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 2:
    raise ValueError("bad shard")
time.sleep(300)
"""


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_a_rank_that_raises_leaves_a_note_in_its_hosts_tree(
    home: Path, service: JobService, runner: str
) -> None:
    runner_ok(runner)
    name = f"mpi-raise-{runner}"
    service.create(mpi_job(home, name, RAISING_RANK), runner=runner)
    record = wait_for(service, name, timeout=180)
    assert record.status == "Failed"
    assert "rank 2 on host algo-2" in (record.failure_reason or ""), record.failure_reason
    assert "ValueError: bad shard" in (record.failure_reason or ""), record.failure_reason


def test_launch_board_refuses_strangers(tmp_path: Path) -> None:
    import socket as sockets
    import threading

    board = mpi.LaunchBoard(["algo-1", "algo-2"])
    board.start(tmp_path / "private")
    assert board.path is not None

    def ask(doc: dict[str, str]) -> dict[str, Any]:
        with sockets.socket(sockets.AF_UNIX) as conn:
            conn.connect(str(board.path))
            conn.sendall(json.dumps(doc).encode() + b"\n")
            return dict(json.loads(conn.makefile().readline()))

    assert "wrong token" in ask({"token": "x", "host": "algo-2", "command": "true"})["error"]
    bad_host = ask({"token": board.token, "host": "algo-1", "command": "true"})
    assert "not another host" in bad_host["error"]
    stop = threading.Event()
    served: list[dict[str, Any]] = []
    asker = threading.Thread(
        target=lambda: served.append(ask({"token": board.token, "host": "algo-2", "command": "x"}))
    )
    asker.start()
    request = board.wait_for("algo-2", stop)
    assert request is not None and request.command == "x"
    again = ask({"token": board.token, "host": "algo-2", "command": "y"})
    assert "already launched" in again["error"]
    request.finish(7)
    asker.join(10)
    assert served == [{"exit": 7}]
    board.close()
    time.sleep(0)


def test_launch_board_stays_bounded_under_a_flood_and_still_launches(tmp_path: Path) -> None:
    """Connections that never send a request (or trickle one) cost the board a bounded
    number of threads, are closed after its request time, and the real launch agent gets
    through afterwards."""
    import contextlib
    import socket as sockets
    import subprocess
    import sys
    import threading

    board = mpi.LaunchBoard(["algo-1", "algo-2", "algo-3"])
    board.request_seconds = 1.0
    board.start(tmp_path / "private")
    assert board.path is not None

    def serving() -> int:  # the board's threads, one per connection it serves
        return sum(t.name == "mpi-launch-conn" for t in threading.enumerate())

    flood = []
    for k in range(400):
        conn = sockets.socket(sockets.AF_UNIX)
        conn.connect(str(board.path))
        if k % 50 == 0:
            # A request that never ends; the board may already have closed this one (all
            # its slots busy), which a flooding client meets as a broken pipe.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.sendall(b'{"token": ')
        flood.append(conn)
    time.sleep(0.3)
    assert serving() <= board.slots
    # Each one the board took is closed once its request time is over.
    wait_until(lambda: serving() == 0, timeout=10, what="slots freed")
    for conn in flood:
        conn.settimeout(5)
        # Closed by the board, at once or after its time (reset: it left bytes unread).
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(1) == b""
        conn.close()
    env = {"PATH": "/usr/bin:/bin", mpi.ENV_HOST: "algo-1", **board.environment(str(board.path))}
    agent = subprocess.Popen(
        [sys.executable, "-m", "trainport.host.mpi_launch", "algo-2", "orted", "--real"], env=env
    )
    request = board.wait_for("algo-2", threading.Event())
    assert request is not None and request.command == "orted --real"
    request.finish(0)
    assert agent.wait(timeout=30) == 0
    board.close()


FLOODING_RANK = """
import json, os, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
held = []
if comm.Get_rank() == 0:
    folder, name = os.path.split(os.environ["TRAINPORT_MPI_LAUNCH"])
    os.chdir(folder)
    for _ in range(600):
        conn = socket.socket(socket.AF_UNIX)
        try:
            conn.connect(name)
        except OSError:
            continue
        held.append(conn)
    print("FLOODED " + str(len(held)), flush=True)
    time.sleep(4)
comm.Barrier()
print("RANK " + json.dumps({"rank": comm.Get_rank()}), flush=True)
"""


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_a_rank_flooding_the_launch_board_costs_the_supervisor_no_thread_each(
    home: Path, service: JobService, runner: str
) -> None:
    runner_ok(runner)
    name = f"mpi-flood-{runner}"
    service.create(mpi_job(home, name, FLOODING_RANK, per_host=1), runner=runner)

    def flooded() -> bool:
        return any("FLOODED" in text for _, text in service.logs(name))

    wait_until(flooded, timeout=120, what="the rank's flood")
    supervisor = service.get(name).supervisor
    assert supervisor is not None
    threads = len(os.listdir(f"/proc/{supervisor[0]}/task"))
    assert threads < 100, f"the supervisor runs {threads} threads"
    record = wait_for(service, name, timeout=180)
    assert record.status == "Completed", record.failure_reason
    seen = rank_reports(service, name, 2)
    assert [r["rank"] for r in seen["algo-1"]] == [0] and [r["rank"] for r in seen["algo-2"]] == [1]


PIPE_RANKS = """
import json, os
from mpi4py import MPI
from trainport.data import ChannelDataset
rank = MPI.COMM_WORLD.Get_rank()
dataset = ChannelDataset.from_channel("train", record_format="tfrecord")
for epoch in range(2):
    dataset.set_epoch(epoch)
    got = [bytes(r).decode() for r in dataset]
    print("RANK " + json.dumps({"rank": rank, "epoch": epoch, "records": got}), flush=True)
"""


def put_tfrecords(home: Path, prefix: str, values: list[str], per_object: int = 1) -> None:
    from trainport.data import encode_tfrecord

    for start in range(0, len(values), per_object):
        blob = b"".join(encode_tfrecord(v.encode()) for v in values[start : start + per_object])
        put(home, "data", f"{prefix}/{start:04d}.tfrecord", blob)


def test_per_rank_pipes_two_ranks_on_one_host_read_disjoint_series(
    home: Path, service: JobService
) -> None:
    values = [str(i) for i in range(12)]
    put_tfrecords(home, "pipes", values)
    body = mpi_job(home, "mpi-pipes", PIPE_RANKS, hosts=1, per_host=2)
    body["InputDataConfig"] = [
        {
            "ChannelName": "train",
            "InputMode": "Pipe",
            "ShuffleConfig": {"Seed": 5},
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/pipes/"}},
        }
    ]
    body["Tags"] = [{"Key": "trainport:pipe-workers", "Value": "2"}]
    service.create(body, runner="process")
    record = wait_for(service, "mpi-pipes", timeout=180)
    assert record.status == "Completed", record.failure_reason
    reports = rank_reports(service, "mpi-pipes", 1)["algo-1"]
    for epoch in range(2):
        per_rank = {r["rank"]: r["records"] for r in reports if r["epoch"] == epoch}
        assert sorted(per_rank) == [0, 1]
        assert not set(per_rank[0]) & set(per_rank[1])  # never two readers on one FIFO
        assert sorted(per_rank[0] + per_rank[1], key=int) == values  # and nothing missed
    orders = [[r["records"] for r in reports if r["rank"] == 0 and r["epoch"] == e] for e in (0, 1)]
    assert orders[0] != orders[1]  # shuffled per epoch


HOROVOD = """
import hashlib, json, os, sys
import torch
import horovod.torch as hvd
from trainport.data import ChannelDataset, ReaderSlot

hvd.init()
torch.manual_seed(100 + hvd.rank())  # different starts: the broadcast must align them
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
# A Horovod job's usual layout: one Pipe channel per rank, train_<rank>.
# The channel is this rank's alone: it reads all of it (a slot of one reader).
data = ChannelDataset.from_channel(f"train_{hvd.rank()}", record_format="tfrecord", slot=ReaderSlot())
seen, first = 0, None
for epoch in range(int(os.environ.get("EPOCHS", "3"))):
    data.set_epoch(epoch)
    xs = torch.tensor([[float(bytes(r).decode())] for r in data])
    seen += len(xs)
    for _ in range(20):
        optimizer.zero_grad()
        loss = ((model(xs) - (2 * xs + 1)) ** 2).mean()
        loss.backward()
        optimizer.step()
        first = loss.item() if first is None else first
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
print("RANK " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "seen": seen, "digest": digest, "first": first, "loss": loss.item()}), flush=True)
if hvd.rank() == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
"""


@pytest.mark.parametrize("runner", ["sandbox"])
def test_horovod_job_with_per_rank_pipe_channels(
    home: Path, service: JobService, runner: str
) -> None:
    runner_ok(runner)
    require_module("horovod.torch", "Horovod is built by scripts/build-horovod.sh")
    channels = []
    for rank in range(4):
        put_tfrecords(home, f"hvd/{rank}", [str(v / 10) for v in range(rank, 40, 4)], per_object=5)
        channels.append(
            {
                "ChannelName": f"train_{rank}",
                "InputMode": "Pipe",
                "ShuffleConfig": {"Seed": 234},
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://data/hvd/{rank}/"}
                },
            }
        )
    body = mpi_job(home, "mpi-hvd", HOROVOD)
    body["InputDataConfig"] = channels
    body["Environment"] = {"EPOCHS": "3"}
    service.create(body, runner=runner)
    record = wait_for(service, "mpi-hvd", timeout=300)
    assert record.status == "Completed", record.failure_reason
    seen = rank_reports(service, "mpi-hvd", 2)
    reports = seen["algo-1"] + seen["algo-2"]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert {r["size"] for r in reports} == {4}
    assert all(r["seen"] == 3 * 10 for r in reports)  # each rank its own channel, 3 epochs
    assert len({r["digest"] for r in reports}) == 1  # every rank holds the same model
    assert all(r["loss"] < r["first"] / 4 for r in reports)  # it trained
    import tarfile

    assert record.model_artifacts is not None
    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:
        assert "model.pt" in tar.getnames()


def test_mpi_on_namespace_hosts(home: Path, service: JobService) -> None:
    from trainport.runners.netns import netns_problem

    require(netns_problem() is None, f"no network namespaces: {netns_problem()}")
    require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    body = mpi_job(home, "mpi-netns", RANKS)
    body["Tags"] = [{"Key": "trainport:network", "Value": "namespaces"}]
    service.create(body, runner="sandbox")
    record = wait_for(service, "mpi-netns", timeout=240)
    assert record.status == "Completed", record.failure_reason
    seen = rank_reports(service, "mpi-netns", 2)
    assert sorted(r["rank"] for r in seen["algo-2"]) == [2, 3]
    for host, reports in seen.items():
        for report in reports:
            assert report["total"] == 10 and report["host"] == host
            assert report["resolved"].startswith("10.")  # its own namespace's address
