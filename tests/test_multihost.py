"""Multi-host jobs on one machine: algo-1..N, sharding, failure propagation, merged models,
and torchrun on every host."""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import put, python_job, request, require, require_module, wait_for, wait_until
from trainport.jobs.records import JobRecord
from trainport.jobs.service import JobService
from trainport.jobs.supervisor import host_addresses
from trainport.runners.sandbox import sandbox_problem

REPORT = """
import json, os, socket
base = os.environ['SAGEMAKER_BASE_DIR']
rc = json.load(open(base + '/input/config/resourceconfig.json'))
me = rc['current_host']
files = sorted(os.listdir(base + '/input/data/train'))
resolved = {h: socket.gethostbyname(h) for h in rc['hosts']} if os.path.exists('/opt/ml/input') else {}
print('REPORT ' + json.dumps({'host': me, 'files': files, 'rc': rc, 'resolved': resolved}), flush=True)
open(base + f'/model/{me}.txt', 'w').write(me)
open(base + '/model/common.txt', 'w').write(me)
"""


def training_seconds(record: JobRecord) -> float:
    """How long the job trained, by its own record (not the test's clock)."""
    assert record.training_start_time is not None and record.training_end_time is not None
    return record.training_end_time - record.training_start_time


def sharded(uri: str) -> list[dict[str, object]]:
    return [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": uri,
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
        }
    ]


def assert_host_addresses(resolved: dict[str, str], job: str) -> None:
    """algo-k resolves in the job to its address on the job's own bridge, 10.a.b.(k+1),
    as root; otherwise to a loopback address of its own."""
    from trainport.runners.netns import netns_problem

    if netns_problem() is not None:
        assert resolved == host_addresses(job, tuple(sorted(resolved)))
        return
    (subnet,) = {address.rsplit(".", 1)[0] for address in resolved.values()}
    assert subnet.startswith("10."), resolved
    assert all(resolved[h] == f"{subnet}.{int(h.split('-')[1]) + 1}" for h in resolved)


def reports(service: JobService, job: str, hosts: int) -> dict[str, dict[str, object]]:
    out = {}
    for k in range(1, hosts + 1):
        lines = [t for _, t in service.logs(job, host=f"algo-{k}") if t.startswith("REPORT ")]
        (line,) = lines
        doc = json.loads(line[len("REPORT ") :])
        out[doc["host"]] = doc
    return out


@pytest.mark.parametrize("runner", ["sandbox", "process"])
def test_three_hosts_shard_resolve_and_merge(home: Path, service: JobService, runner: str) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    for i in range(10):
        put(home, "data", f"shards/part-{i:02d}", str(i))
    body = python_job(
        f"three-{runner}",
        REPORT,
        InputDataConfig=sharded("s3://data/shards/"),
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 3, "VolumeSizeInGB": 1},
    )
    service.create(body, runner=runner)
    record = wait_for(service, f"three-{runner}")
    assert record.status == "Completed", record.failure_reason
    got = reports(service, f"three-{runner}", 3)
    assert sorted(got) == ["algo-1", "algo-2", "algo-3"]
    shards = [set(got[h]["files"]) for h in sorted(got)]  # type: ignore[arg-type]
    assert set().union(*shards) == {f"part-{i:02d}" for i in range(10)}
    assert sum(len(s) for s in shards) == 10 and sorted(len(s) for s in shards) == [3, 3, 4]
    for host, doc in got.items():
        rc = doc["rc"]
        assert rc["current_host"] == host  # type: ignore[index]
        assert rc["hosts"] == ["algo-1", "algo-2", "algo-3"]  # type: ignore[index]
        if runner == "sandbox":
            resolved: dict[str, str] = doc["resolved"]  # type: ignore[assignment]
            assert sorted(resolved) == sorted(got)
            assert_host_addresses(resolved, f"three-{runner}")
    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
        names = sorted(tar.getnames())
        common = tar.extractfile("common.txt").read()  # type: ignore[union-attr]
    assert names == ["algo-1.txt", "algo-2.txt", "algo-3.txt", "common.txt"]
    assert common == b"algo-1"  # the lowest-numbered host's copy wins
    assert any("common.txt (algo-1, algo-2, algo-3)" in t.message for t in record.transitions)
    assert [t.status for t in record.transitions] == [
        "Starting",
        "Downloading",
        "Training",
        "Uploading",
        "Completed",
    ]  # three hosts, one job: its phases only go forward
    # FinalMetricDataList and logs: each host keeps its own log
    assert all(
        (home / "jobs" / f"three-{runner}" / "logs" / f"algo-{k}.log").exists() for k in (1, 2, 3)
    )


# algo-2 fails once the others are ready for SIGTERM (each says so with a file in READY):
# however late a loaded machine starts them, the stop reaches a handler.
FAIL_ON_ALGO_2 = """
import json, os, signal, sys, time
base = os.environ['SAGEMAKER_BASE_DIR']
ready = os.environ['READY']
me = json.load(open(base + '/input/config/resourceconfig.json'))['current_host']
if me == 'algo-2':
    while len(os.listdir(ready)) < 2:
        time.sleep(0.05)
    open(base + '/output/failure', 'w').write('algo-2 ran out of patience')
    sys.exit(3)
def on_term(*_):
    open(base + '/model/terminated.txt', 'w').write(me)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(ready, me), 'w').close()
print('waiting', flush=True)
time.sleep(300)
"""


def test_a_failing_host_stops_the_others_and_is_named(home: Path, service: JobService) -> None:
    ready = home.parent / "ready"
    ready.mkdir()
    body = python_job(
        "host-fails",
        FAIL_ON_ALGO_2,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 3, "VolumeSizeInGB": 1},
        Environment={"READY": str(ready)},
    )
    service.create(body, runner="process")
    record = wait_for(service, "host-fails", timeout=90)
    assert record.status == "Failed"
    # The survivors were stopped, not waited out: per the job's record, its training ended
    # before their 300 s sleep could have.
    assert training_seconds(record) < 300
    assert record.failure_reason == "algo-2: algo-2 ran out of patience"
    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
        # the survivors got SIGTERM and saved in their grace period (algo-1's copy kept)
        assert tar.extractfile("terminated.txt").read() == b"algo-1"  # type: ignore[union-attr]


UP_UNTIL_TERM = """
import signal, sys, time
def on_term(*_):
    print('got SIGTERM', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print('up', flush=True)
time.sleep(300)
"""


def test_stop_reaches_every_host(service: JobService) -> None:
    body = python_job(
        "stop-all",
        UP_UNTIL_TERM,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
    )
    service.create(body, runner="process")
    hosts = ("algo-1", "algo-2")

    def said(host: str, text: str) -> bool:
        return any(line == text for _, line in service.logs("stop-all", host=host))

    # Both hosts running their training before the stop, or the test fails here.
    wait_until(lambda: all(said(h, "up") for h in hosts), what="both hosts up")
    service.stop("stop-all")
    record = wait_for(service, "stop-all")
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    assert [h for h in hosts if not said(h, "got SIGTERM")] == []


def test_instance_groups_in_resourceconfig(home: Path, service: JobService) -> None:
    put(home, "data", "g/x", "x")
    body = python_job(
        "groups",
        REPORT,
        InputDataConfig=sharded("s3://data/g/"),
        ResourceConfig={
            "InstanceGroups": [
                {"InstanceGroupName": "leader", "InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
                {"InstanceGroupName": "workers", "InstanceType": "ml.m5.large", "InstanceCount": 2},
            ],
            "VolumeSizeInGB": 1,
        },
    )
    service.create(body, runner="process")
    assert wait_for(service, "groups").status == "Completed"
    got = reports(service, "groups", 3)
    assert got["algo-1"]["rc"]["current_group_name"] == "leader"  # type: ignore[index]
    assert got["algo-3"]["rc"]["current_instance_type"] == "ml.m5.large"  # type: ignore[index]
    assert got["algo-2"]["rc"]["instance_groups"] == [  # type: ignore[index]
        {"instance_group_name": "leader", "instance_type": "ml.c5.xlarge", "hosts": ["algo-1"]},
        {
            "instance_group_name": "workers",
            "instance_type": "ml.m5.large",
            "hosts": ["algo-2", "algo-3"],
        },
    ]


DDP_SCRIPT = """
import os, sys
import torch
import torch.distributed as dist
keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'MASTER_ADDR', 'MASTER_PORT']
dist.init_process_group('gloo')
rank = dist.get_rank()
if os.environ.get('FAIL_RANK') == str(rank):
    sys.exit(7)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# one write per line: two ranks share the host's output pipe
sys.stdout.write('RANKINFO ' + ' '.join(f'{k}={os.environ[k]}' for k in keys) + f' sum={t.item():g}' + chr(10))
sys.stdout.flush()
dist.destroy_process_group()
"""


def torch_job(
    home: Path, name: str, hosts: int, per_host: int, env: dict[str, str] | None = None
) -> dict[str, object]:
    from trainport.host.script_mode import pack_sourcedir

    src = home.parent / f"src-{name}"
    src.mkdir()
    (src / "ddp.py").write_text(DDP_SCRIPT)
    put(home, "code", f"{name}/sourcedir.tar.gz", pack_sourcedir(src, "ddp.py"))
    return request(
        name,
        AlgorithmSpecification={"TrainingImage": "pytorch", "TrainingInputMode": "File"},
        HyperParameters={
            "sagemaker_program": '"ddp.py"',
            "sagemaker_submit_directory": f'"s3://code/{name}/sourcedir.tar.gz"',
            "sagemaker_torch_distributed_enabled": "true",
        },
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": hosts, "VolumeSizeInGB": 1},
        Tags=[
            {"Key": "trainport:processes-per-host", "Value": str(per_host)},
            {"Key": "trainport:stop-grace-seconds", "Value": "5"},
        ],
        Environment=env or {},
    )


@pytest.mark.slow
@pytest.mark.parametrize(("runner", "hosts", "per_host"), [("sandbox", 2, 1), ("process", 2, 2)])
def test_torchrun_on_every_host(
    home: Path, service: JobService, runner: str, hosts: int, per_host: int
) -> None:
    require_module("torch")
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    service.create(torch_job(home, f"ddp-{runner}", hosts, per_host), runner=runner)
    record = wait_for(service, f"ddp-{runner}", timeout=180)
    assert record.status == "Completed", record.failure_reason
    world = hosts * per_host
    seen = []
    for k in range(1, hosts + 1):
        for _, text in service.logs(f"ddp-{runner}", host=f"algo-{k}"):
            if "RANKINFO " in text:
                fields = dict(kv.split("=") for kv in text.split("RANKINFO ")[1].split())
                seen.append(fields)
                assert fields["GROUP_RANK"] == str(k - 1)
                assert fields["WORLD_SIZE"] == str(world)
                assert fields["LOCAL_WORLD_SIZE"] == str(per_host)
                assert int(fields["RANK"]) == (k - 1) * per_host + int(fields["LOCAL_RANK"])
                assert fields["MASTER_PORT"] == "7777"
                # Every runner resolves algo-1 (the process runner through its own hosts
                # file in a mount namespace), so torchrun is given the name, as SageMaker's.
                assert fields["MASTER_ADDR"] == "algo-1"
                assert float(fields["sum"]) == world * (world + 1) / 2
    assert sorted(int(f["RANK"]) for f in seen) == list(range(world))


@pytest.mark.slow
def test_a_dying_rank_fails_the_job_naming_its_host(home: Path, service: JobService) -> None:
    require_module("torch")
    body = torch_job(home, "ddp-dies", 2, 1, env={"FAIL_RANK": "1"})
    service.create(body, runner="process")
    record = wait_for(service, "ddp-dies", timeout=180)
    assert record.status == "Failed"
    assert (record.failure_reason or "").startswith("algo-2: ")
    # The rank left waiting in all_reduce was stopped, not left to the runtime limit.
    assert training_seconds(record) < body["StoppingCondition"]["MaxRuntimeInSeconds"]  # type: ignore[index]


PORT_PROBE = """
import json, os, socket, time
rc = json.load(open(os.environ['SAGEMAKER_BASE_DIR'] + '/input/config/resourceconfig.json'))
algo_1 = socket.gethostbyname('algo-1')
if rc['current_host'] == 'algo-1':
    srv = socket.create_server((algo_1, 7777))  # torchrun's master port on every job
    time.sleep(2)  # hold it while the other job starts
    conn, _ = srv.accept()
    print('PORT ' + conn.recv(100).decode(), flush=True)
else:
    while True:  # until algo-1 listens, however late a loaded machine starts it
        try:
            s = socket.create_connection((algo_1, 7777))
            break
        except OSError:
            time.sleep(0.05)
    s.sendall(os.environ['TRAINING_JOB_NAME'].encode())
"""


def test_two_jobs_at_once_each_listen_on_their_algo_1(service: JobService) -> None:
    """On the machine's network (the opt-out, as without root), each job's hosts have a
    block of loopback addresses of their own."""
    require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    rc = {"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1}
    loopback = [{"Key": "trainport:network", "Value": "loopback"}]
    for name in ("ports-a", "ports-b"):
        body = python_job(name, PORT_PROBE, ResourceConfig=rc, Tags=loopback)
        service.create(body, runner="sandbox")
    for name in ("ports-a", "ports-b"):
        record = wait_for(service, name, timeout=60)
        assert record.status == "Completed", record.failure_reason
        # Each job's algo-2 reached its own job's algo-1.
        assert [t for _, t in service.logs(name) if t.startswith("PORT ")] == [f"PORT {name}"]
    a, b = (host_addresses(n, ("algo-1",))["algo-1"] for n in ("ports-a", "ports-b"))
    assert a != b and a.startswith("127.") and not a.startswith("127.0.0.")


NET_PROBE = """
import json, os, socket, time
base = os.environ['SAGEMAKER_BASE_DIR']
rc = json.load(open(base + '/input/config/resourceconfig.json'))
me = rc['current_host']
addrs = {h: socket.gethostbyname(h) for h in rc['hosts']}
if me == 'algo-1':
    srv = socket.create_server((addrs['algo-1'], 7000))
    conn, peer = srv.accept()
    n = 0
    start = time.monotonic()
    while chunk := conn.recv(1 << 16):
        n += len(chunk)
    seconds = time.monotonic() - start
    rps = open('/sys/class/net/eth0/queues/rx-0/rps_cpus').read().strip()
    cc = open('/proc/sys/net/ipv4/tcp_congestion_control').read().strip()
    print('NET ' + json.dumps({'peer': peer[0], 'bytes': n, 'mbit': n * 8 / seconds / 1e6, 'iface': rc['network_interface_name'], 'addrs': addrs, 'rps': rps, 'cc': cc}), flush=True)
else:
    while True:  # until algo-1 listens, however late a loaded machine starts it
        try:
            s = socket.create_connection((addrs['algo-1'], 7000))
            break
        except OSError:
            time.sleep(0.1)
    s.sendall(b'x' * (4 << 20))
    s.close()
"""


@pytest.fixture
def cubic_allowed() -> Iterator[None]:
    """Namespaces may choose cubic (some machines allow only their default, e.g. bbr)."""
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    before = allowed.read_text().strip()
    change = os.geteuid() == 0 and "cubic" not in before.split()
    if change:
        allowed.write_text(f"{before} cubic")
    yield
    if change:
        allowed.write_text(before)


def test_namespace_hosts_with_shaped_bandwidth(
    home: Path, service: JobService, cubic_allowed: None
) -> None:
    from trainport.runners.netns import netns_problem

    require(netns_problem() is None, f"no network namespaces: {netns_problem()}")
    require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    body = python_job(
        "netns",
        NET_PROBE,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        Tags=[
            {"Key": "trainport:network", "Value": "namespaces"},
            {"Key": "trainport:host-bandwidth", "Value": "100mbit"},
        ],
    )
    import subprocess

    def namespaces() -> set[str]:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return {line.split()[0] for line in listed.splitlines() if line.startswith("tp-")}

    before = namespaces()  # another test's SIGKILLed supervisor may have left some
    service.create(body, runner="sandbox")
    record = wait_for(service, "netns", timeout=120)
    assert record.status == "Completed", record.failure_reason
    (line,) = [t for _, t in service.logs("netns") if t.startswith("NET ")]
    got = json.loads(line[4:])
    assert got["iface"] == "eth0"
    assert got["addrs"]["algo-1"].startswith("10.") and got["addrs"]["algo-2"].startswith("10.")
    assert got["peer"] == got["addrs"]["algo-2"]  # the traffic really came from algo-2's interface
    assert got["bytes"] == 4 << 20
    assert got["mbit"] < 150  # shaped to 100 Mbit/s (loopback would give tens of Gbit/s)
    # The host's receive work is steered to one CPU, so its flows stay in order.
    assert int(got["rps"].replace(",", ""), 16) != 0
    assert got["cc"] == "cubic"  # Linux's default, whatever this machine's is
    assert namespaces() <= before  # the job's namespaces removed at the end


PIPE_READER = """
import json, os, time
base = os.environ['SAGEMAKER_BASE_DIR']
me = json.load(open(base + '/input/config/resourceconfig.json'))['current_host']
for epoch in range(2):
    path = base + f'/input/data/train_{epoch}'
    while not os.path.exists(path):
        time.sleep(0.01)
    with open(path, 'rb') as f:
        data = f.read()
    print('PIPE ' + json.dumps({'host': me, 'epoch': epoch, 'records': sorted(data.decode().split())}), flush=True)
"""


def test_sharded_pipe_channel_across_hosts(home: Path, service: JobService) -> None:
    for i in range(8):
        put(home, "data", f"pipe/part-{i}", f"r{i} ")
    channel = sharded("s3://data/pipe/")
    channel[0]["InputMode"] = "Pipe"
    channel[0]["ShuffleConfig"] = {"Seed": 5}
    body = python_job(
        "pipe-hosts",
        PIPE_READER,
        InputDataConfig=channel,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
    )
    service.create(body, runner="process")
    record = wait_for(service, "pipe-hosts")
    assert record.status == "Completed", record.failure_reason
    got: dict[tuple[str, int], list[str]] = {}
    for host in ("algo-1", "algo-2"):
        for _, text in service.logs("pipe-hosts", host=host):
            if text.startswith("PIPE "):
                doc = json.loads(text[5:])
                got[(doc["host"], doc["epoch"])] = doc["records"]
    everything = sorted(f"r{i}" for i in range(8))
    for epoch in (0, 1):
        one, two = got[("algo-1", epoch)], got[("algo-2", epoch)]
        assert sorted(one + two) == everything and not set(one) & set(two)
        assert len(one) == len(two) == 4
    assert got[("algo-1", 0)] != got[("algo-1", 1)]  # shuffled: membership changes by epoch
