"""Jobs on a real Ray cluster: each host on its own node (a network namespace of its own),
talking to the others by name, failures naming their host."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import put, python_job, require, wait_for, wait_until
from tests.on_ray.cluster import NamespaceCluster, RayNode
from tests.test_multihost import torch_job
from trainport.config import load_settings
from trainport.errors import ValidationError
from trainport.jobs.records import JobRecord
from trainport.jobs.service import JobService

pytestmark = pytest.mark.slow

TWO_HOSTS = {"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1}

ALL_REDUCE_BY_NAME = """
import json, os, socket
import torch, torch.distributed as dist
rc = json.load(open('/opt/ml/input/config/resourceconfig.json'))
me, hosts = rc['current_host'], rc['hosts']
rank = hosts.index(me)
dist.init_process_group('gloo', init_method='tcp://algo-1:29511', rank=rank, world_size=len(hosts))
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
addresses = {h: socket.gethostbyname(h) for h in hosts}
print('REPORT ' + json.dumps({'host': me, 'sum': t.item(), 'addresses': addresses}), flush=True)
open(f'/opt/ml/model/{me}.txt', 'w').write(me)
dist.destroy_process_group()
"""


def reports(service: JobService, job: str, hosts: int) -> dict[str, dict[str, object]]:
    out = {}
    for k in range(1, hosts + 1):
        for _, text in service.logs(job, host=f"algo-{k}"):
            if text.startswith("REPORT "):
                doc = json.loads(text[len("REPORT ") :])
                out[doc["host"]] = doc
    return out


FORWARD = ["Starting", "Downloading", "Training", "Uploading", "Completed"]


def test_two_hosts_on_two_nodes_all_reduce_by_name(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    service.create(python_job("ray-byo", ALL_REDUCE_BY_NAME, ResourceConfig=TWO_HOSTS))
    record = wait_for(service, "ray-byo", timeout=180)
    assert record.status == "Completed", (record.failure_reason, service.logs("ray-byo"))
    assert record.runner == "ray"
    # One record for the job: a slower host's phase never takes it back.
    assert [t.status for t in record.transitions] == FORWARD
    got = reports(service, "ray-byo", 2)
    assert {h: d["sum"] for h, d in got.items()} == {"algo-1": 3.0, "algo-2": 3.0}
    # algo-k resolves to its address on the job's own network, one node per host.
    addresses = got["algo-1"]["addresses"]
    assert addresses == got["algo-2"]["addresses"]
    prefix = addresses["algo-1"].rsplit(".", 1)[0]  # type: ignore[index]
    assert addresses == {"algo-1": f"{prefix}.2", "algo-2": f"{prefix}.3"}
    placed = {
        t.split(" runs on Ray node ")[1].split()[0]
        for h in ("algo-1", "algo-2")
        for _, t in service.logs("ray-byo", host=h)
        if " runs on Ray node " in t
    }
    assert placed == {n.address for n in on_ray.nodes}
    # Each node's model folder came back into the one merged archive.
    import tarfile

    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
        assert sorted(tar.getnames()) == ["algo-1.txt", "algo-2.txt"]


BIG_MODEL = """
import hashlib, json, os
rc = json.load(open('/opt/ml/input/config/resourceconfig.json'))
me = rc['current_host']
data = os.urandom(70 << 20) if me == 'algo-2' else b'small'
open(f'/opt/ml/model/{me}.bin', 'wb').write(data)
print('REPORT ' + json.dumps({'host': me, 'sha': hashlib.sha256(data).hexdigest()}), flush=True)
"""


def test_a_model_larger_than_one_transfer_comes_back_whole(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    """algo-2's 70 MiB model folder comes from its node in chunks, into the merged archive."""
    import hashlib
    import tarfile

    service.create(python_job("ray-big-model", BIG_MODEL, ResourceConfig=TWO_HOSTS))
    record = wait_for(service, "ray-big-model", timeout=180)
    assert record.status == "Completed", record.failure_reason
    got = reports(service, "ray-big-model", 2)
    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
        for host in ("algo-1", "algo-2"):
            member = tar.extractfile(f"{host}.bin")
            assert member is not None
            assert hashlib.sha256(member.read()).hexdigest() == got[host]["sha"]
    assert not list((home / "jobs" / "ray-big-model" / "hosts").glob("*/packed.tar"))


@pytest.fixture
def s3_on_bridge(
    home: Path, on_ray: NamespaceCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """moto's S3 server on the cluster's bridge, which every node reaches; the job's store."""
    from moto.server import ThreadedMotoServer

    from tests.conftest import free_port

    port = free_port()
    address = f"{on_ray.subnet}.1"
    server = ThreadedMotoServer(ip_address=address, port=port, verbose=False)
    server.start()
    endpoint = f"http://{address}:{port}"
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    try:
        yield endpoint
    finally:
        server.stop()


S3_JOB = """
import json, os
rc = json.load(open('/opt/ml/input/config/resourceconfig.json'))
me = rc['current_host']
files = sorted(os.listdir('/opt/ml/input/data/train'))
with open('/opt/ml/input/data/stream_0', 'rb') as fifo:
    streamed = fifo.read().decode()
open(f'/opt/ml/model/{me}.txt', 'w').write(me)
print('REPORT ' + json.dumps({'host': me, 'files': files, 'stream': streamed}), flush=True)
"""


def test_an_s3_store_on_nodes(s3_on_bridge: str, service: JobService) -> None:
    """The store is an S3 endpoint: its settings travel to the nodes, which stage their
    channels from it, and the merged model lands in it."""
    import io
    import tarfile

    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_on_bridge, region_name="us-east-1")
    for bucket in ("ray-s3-data", "ray-s3-out"):
        s3.create_bucket(Bucket=bucket)
    for k in range(4):
        s3.put_object(Bucket="ray-s3-data", Key=f"shards/part-{k}", Body=f"shard {k}".encode())
    s3.put_object(Bucket="ray-s3-data", Key="stream/all", Body=b"streamed from S3")
    channels = [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://ray-s3-data/shards/",
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
        },
        {
            "ChannelName": "stream",
            "InputMode": "Pipe",
            "DataSource": {
                "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://ray-s3-data/stream/"}
            },
        },
    ]
    body = python_job(
        "ray-s3",
        S3_JOB,
        ResourceConfig=TWO_HOSTS,
        InputDataConfig=channels,
        OutputDataConfig={"S3OutputPath": "s3://ray-s3-out/jobs"},
    )
    service.create(body)
    record = wait_for(service, "ray-s3", timeout=180)
    assert record.status == "Completed", (record.failure_reason, service.logs("ray-s3"))
    got = reports(service, "ray-s3", 2)
    shards = sorted(f for doc in got.values() for f in doc["files"])  # type: ignore[attr-defined]
    assert shards == [f"part-{k}" for k in range(4)]
    assert {doc["stream"] for doc in got.values()} == {"streamed from S3"}
    assert record.model_artifacts == "s3://ray-s3-out/jobs/ray-s3/output/model.tar.gz"
    packed = s3.get_object(Bucket="ray-s3-out", Key="jobs/ray-s3/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(packed["Body"].read())) as tar:
        assert sorted(tar.getnames()) == ["algo-1.txt", "algo-2.txt"]
    left = s3.list_objects_v2(Bucket="ray-s3-out", Prefix="jobs/ray-s3/")
    keys = sorted(o["Key"] for o in left.get("Contents", []))
    assert keys == ["jobs/ray-s3/output/model.tar.gz", "jobs/ray-s3/output/output.tar.gz"]


def test_an_s3_endpoint_the_nodes_cannot_reach_is_found_before_the_job_starts(
    home: Path, on_ray: NamespaceCluster, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto on this machine's 127.0.0.1: the supervisor reaches it, no node does."""
    import boto3

    for name, value in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(
        Bucket="out"
    )
    service = JobService(load_settings())
    service.create(python_job("ray-s3-blind", "print('never')", ResourceConfig=TWO_HOSTS))
    record = wait_for(service, "ray-s3-blind", timeout=180)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert "the S3 store is not reachable from every node" in reason, reason
    assert "host algo-1 on node" in reason and "host algo-2 on node" in reason, reason
    assert record.training_start_time is None or not any(
        t == "never" for _, t in service.logs("ray-s3-blind")
    )


def test_a_ray_client_address_names_the_cluster_too(
    on_ray: NamespaceCluster, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAY_ADDRESS=ray://head:10001, as users name a cluster they do not run a node of: the
    supervisor drives the job through the head's Ray Client server."""
    monkeypatch.setenv("RAY_ADDRESS", f"ray://{on_ray.head.address}:10001")
    service.create(python_job("ray-client", ALL_REDUCE_BY_NAME, ResourceConfig=TWO_HOSTS))
    record = wait_for(service, "ray-client", timeout=180)
    assert record.status == "Completed", (
        record.failure_reason,
        list(service.logs("ray-client")),
        on_ray.head_logs("ray_client_server*"),
    )
    got = reports(service, "ray-client", 2)
    assert {h: d["sum"] for h, d in got.items()} == {"algo-1": 3.0, "algo-2": 3.0}


def test_torchrun_across_nodes(home: Path, on_ray: NamespaceCluster, service: JobService) -> None:
    service.create(torch_job(home, "ray-ddp", 2, 1))
    record = wait_for(service, "ray-ddp", timeout=240)
    assert record.status == "Completed", record.failure_reason
    sums = []
    for k in (1, 2):
        for _, text in service.logs("ray-ddp", host=f"algo-{k}"):
            if "RANKINFO " in text:
                fields = dict(kv.split("=") for kv in text.split("RANKINFO ")[1].split())
                assert fields["GROUP_RANK"] == str(k - 1)
                assert fields["MASTER_ADDR"] == "algo-1"
                sums.append(float(fields["sum"]))
    assert sums == [3.0, 3.0]


def test_mpi_across_nodes(home: Path, on_ray: NamespaceCluster, service: JobService) -> None:
    """algo-1's mpirun starts each other host's daemon through that host's actor, on its
    node; every rank's output lands in the log of the host it ran on."""
    import shutil

    from tests.test_mpi import RANKS, mpi_job, rank_reports
    from trainport.host import mpi

    require(
        shutil.which("mpirun") is not None and mpi.has_mpi4py(),
        "OpenMPI or mpi4py is not installed (apt-get install openmpi-bin; pip install mpi4py)",
    )
    body = mpi_job(home, "ray-mpi", RANKS, epochs="2")
    body["ResourceConfig"] = TWO_HOSTS
    service.create(body)
    record = wait_for(service, "ray-mpi", timeout=240)
    assert record.status == "Completed", (record.failure_reason, service.logs("ray-mpi"))
    seen = rank_reports(service, "ray-mpi", 2)
    assert sorted(r["rank"] for r in seen["algo-1"]) == [0, 1]
    assert sorted(r["rank"] for r in seen["algo-2"]) == [2, 3]
    nodes = {n.address for n in on_ray.nodes}
    for host, ranks in seen.items():
        for rank in ranks:
            assert rank["size"] == 4 and rank["total"] == 1 + 2 + 3 + 4
            assert rank["host"] == host and rank["argv"] == ["--epochs", "2"]
            # Each host's name is its address on the job's own network, not its node's.
            assert rank["resolved"] not in nodes
            assert rank["resolved"].endswith(f".{int(host[-1]) + 1}")
    assert seen["algo-1"][0]["resolved"] != seen["algo-2"][0]["resolved"]


def test_an_mpi_rank_that_raises_on_another_node_names_rank_and_host(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    from tests.test_mpi import RAISING_RANK, mpi_job

    body = mpi_job(home, "ray-mpi-raise", RAISING_RANK)
    body["ResourceConfig"] = TWO_HOSTS
    service.create(body)
    record = wait_for(service, "ray-mpi-raise", timeout=180)
    assert record.status == "Failed"
    # Its log (algo-2's, through mpirun's tagged output) has the traceback.
    assert "rank 2 on host algo-2" in (record.failure_reason or ""), record.failure_reason
    assert any("bad shard" in t for _, t in service.logs("ray-mpi-raise", host="algo-2"))
    # The sleeping ranks (300 s) were ended, not waited out.
    assert _trained_for(record) < 300


FAIL_ON_ALGO_2 = """
import json, os, sys, time, signal
rc = json.load(open('/opt/ml/input/config/resourceconfig.json'))
if rc['current_host'] == 'algo-2':
    time.sleep(1)
    open('/opt/ml/output/failure', 'w').write('algo-2 gave up')
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print('waiting', flush=True)
time.sleep(300)
"""


def _trained_for(record: JobRecord) -> float:
    """Seconds from the job's Training to its end, from its own record."""
    assert record.training_start_time is not None and record.training_end_time is not None
    return record.training_end_time - record.training_start_time


def test_a_failure_on_one_node_names_its_host(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    service.create(python_job("ray-fails", FAIL_ON_ALGO_2, ResourceConfig=TWO_HOSTS))
    record = wait_for(service, "ray-fails", timeout=120)
    assert record.status == "Failed"
    assert record.failure_reason == "algo-2: algo-2 gave up"
    assert _trained_for(record) < 300  # algo-1 (asleep for 300 s) was stopped, not waited out
    assert any("waiting" in t for _, t in service.logs("ray-fails", host="algo-1"))


def test_a_job_no_node_could_ever_hold_is_refused_at_submission(
    on_ray: NamespaceCluster, service: JobService
) -> None:
    big = {"InstanceType": "ml.m5.24xlarge", "InstanceCount": 2, "VolumeSizeInGB": 1}
    with pytest.raises(ValidationError) as caught:
        service.create(python_job("ray-too-big", "print(1)", ResourceConfig=big))
    said = str(caught.value)
    assert said.startswith("ResourceConfig: host algo-1 (ml.m5.24xlarge) needs a node with 96 CPUs")
    assert "the largest has 2 CPUs" in said and "TRAINPORT_RAY_INSTANCE_TYPES" in said
    assert not service.db.exists("ray-too-big")


REACH = """
import json, os, socket, time
def reach(address, port):
    try:
        socket.create_connection((address, port), timeout=3).close()
        return "reached"
    except OSError as exc:
        return type(exc).__name__
me = json.load(open('/opt/ml/input/config/resourceconfig.json'))['current_host']
if me == 'algo-1':
    listener = socket.create_server(('0.0.0.0', 7777))
    listener.settimeout(60)
    listener.accept()[0].close()  # algo-2's
    seen = {}
else:
    for _ in range(300):
        if reach('algo-1', 7777) == 'reached':
            break
        time.sleep(0.1)
    seen = {'peer': 'reached'}
own = socket.create_server(('127.0.0.1', 0))
seen.update({
    'head': reach(os.environ['HEAD'], 6379),
    'nodes': [reach(node, 5999) for node in os.environ['NODES'].split()],
    'submitter': reach(os.environ['SUBMITTER'], int(os.environ['SUBMITTER_PORT'])),
    'own loopback': reach('127.0.0.1', own.getsockname()[1]),
})
print('REACH ' + json.dumps(seen), flush=True)
"""


@contextlib.contextmanager
def _listening_on_every_node(cluster: NamespaceCluster, port: int) -> Iterator[None]:
    """A listener on ``port`` of every node's address, in the node's own network."""
    serve = (
        "import socket, sys, time; s = socket.create_server(('0.0.0.0', int(sys.argv[1]))); "
        "print('up', flush=True); time.sleep(600)"
    )
    listeners = []
    try:
        for node in cluster.nodes:
            argv = ["nsenter", f"--net=/run/netns/{node.name}", sys.executable, "-c", serve]
            listener = subprocess.Popen([*argv, str(port)], stdout=subprocess.PIPE, text=True)
            listeners.append(listener)
            assert listener.stdout is not None and listener.stdout.readline() == "up\n"
        yield
    finally:
        for listener in listeners:
            listener.kill()
            listener.wait()


@pytest.mark.parametrize("isolated", [False, True])
def test_hosts_on_nodes_reach_each_other_and_no_node(
    on_ray: NamespaceCluster, service: JobService, isolated: bool
) -> None:
    """Each host has a network of the job's own on its node: the job's hosts reach each
    other by name, nothing of any node of the cluster (the head's GCS, its own node) answers,
    and the outside (here the submitting machine) is reached through NAT unless the job is
    network-isolated."""
    import socket

    submitter = socket.create_server((f"{on_ray.subnet}.1", 0))
    name = f"ray-isolated-{isolated}".lower()
    env = {
        "HEAD": on_ray.head.address,
        "NODES": " ".join(n.address for n in on_ray.nodes),
        "SUBMITTER": f"{on_ray.subnet}.1",
        "SUBMITTER_PORT": str(submitter.getsockname()[1]),
    }
    body = python_job(
        name, REACH, EnableNetworkIsolation=isolated, Environment=env, ResourceConfig=TWO_HOSTS
    )
    with submitter, _listening_on_every_node(on_ray, 5999):
        service.create(body)
        record = wait_for(service, name, timeout=120)
    assert record.status == "Completed", (record.failure_reason, service.logs(name))
    for host in ("algo-1", "algo-2"):
        said = [t for _, t in service.logs(name, host=host)]
        assert any("on the job's own network" in t for t in said), said
        seen = json.loads(next(t for t in said if t.startswith("REACH "))[len("REACH ") :])
        assert seen["own loopback"] == "reached", (host, seen)
        assert seen["head"] != "reached", (host, seen)
        assert "reached" not in seen["nodes"], (host, seen)
        assert seen["submitter"] == ("OSError" if isolated else "reached"), (host, seen)
    assert seen["peer"] == "reached"


SERVE_7777 = """
import json, os, socket, time
me = json.load(open('/opt/ml/input/config/resourceconfig.json'))['current_host']
token = os.environ['TOKEN']
if me == 'algo-1':
    listener = socket.create_server(('0.0.0.0', 7777))
    print('SERVING ' + socket.gethostbyname('algo-1'), flush=True)
    while True:  # until stopped
        conn, _ = listener.accept()
        conn.sendall(token.encode())
        conn.close()
else:
    def fetch(address):
        try:
            with socket.create_connection((address, 7777), timeout=3) as conn:
                return conn.recv(100).decode()
        except OSError as exc:
            return type(exc).__name__
    for _ in range(300):
        got = fetch('algo-1')
        if not got.endswith('Error'):
            break
        time.sleep(0.1)
    other = os.environ.get('OTHER')
    print('GOT ' + json.dumps({'own': got, 'other': fetch(other) if other else None}), flush=True)
"""


def _served_at(service: JobService, name: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = [t for _, t in service.logs(name, host="algo-1")]
        serving = [t.split()[1] for t in said if t.startswith("SERVING ")]
        if serving:
            return serving[0]
        record = service.get(name)
        assert record.status == "InProgress", (record.failure_reason, list(service.logs(name)))
        time.sleep(0.2)
    raise AssertionError(f"{name}'s algo-1 did not start serving")


def test_two_jobs_on_the_same_nodes_each_own_port_7777(
    on_ray: NamespaceCluster, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two 2-host jobs on the same two nodes at once: each one's algo-1 binds port 7777 on
    every address, each one's algo-2 reaches its own, and the other job's is unreachable
    while it serves."""
    # Half a node per host, so that each node holds a host of each job.
    monkeypatch.setenv("TRAINPORT_RAY_INSTANCE_TYPES", '{"ml.m5.large": {"cpus": 1}}')
    first = python_job(
        "ray-net-a", SERVE_7777, ResourceConfig=TWO_HOSTS, Environment={"TOKEN": "job a"}
    )
    service.create(first)
    a_at = _served_at(service, "ray-net-a")
    second = python_job(
        "ray-net-b",
        SERVE_7777,
        ResourceConfig=TWO_HOSTS,
        Environment={"TOKEN": "job b", "OTHER": a_at},
    )
    try:
        service.create(second)
        _served_at(service, "ray-net-b")
        got = {}
        for name in ("ray-net-a", "ray-net-b"):
            wait_until(
                lambda name=name: any(
                    t.startswith("GOT ") for _, t in service.logs(name, host="algo-2")
                ),
                timeout=120,
                what=f"{name}'s algo-2 to report",
            )
            said = next(t for _, t in service.logs(name, host="algo-2") if t.startswith("GOT "))
            got[name] = json.loads(said[len("GOT ") :])
        # Job a still serves: b's try at its address met a live listener's network.
        assert service.get("ray-net-a").status == "InProgress"
    finally:
        for name in ("ray-net-a", "ray-net-b"):
            with contextlib.suppress(Exception):
                service.stop(name)
    assert got["ray-net-a"]["own"] == "job a"
    assert got["ray-net-b"]["own"] == "job b"
    assert got["ray-net-b"]["other"] in ("TimeoutError", "ConnectionRefusedError", "OSError")
    for name in ("ray-net-a", "ray-net-b"):
        assert wait_for(service, name, timeout=60).status == "Stopped"


def test_settings_name_the_cluster(on_ray: NamespaceCluster) -> None:
    settings = load_settings()
    assert settings.runner == "ray"
    assert settings.ray_address == on_ray.address


SLEEPER = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(0)))
print('up', flush=True)
time.sleep(300)
"""


def _training_on_every_host(service: JobService, name: str, hosts: int) -> None:
    """Wait until every host's training process said "up" (the supervisor records no
    process groups of a node's processes: they are not this machine's)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        up = [
            h
            for h in (f"algo-{k}" for k in range(1, hosts + 1))
            if any(t == "up" for _, t in service.logs(name, host=h))
        ]
        if len(up) == hosts or service.get(name).status != "InProgress":
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} did not start training on {hosts} hosts")


def test_stop_reaches_every_node(on_ray: NamespaceCluster, service: JobService) -> None:
    service.create(python_job("ray-stop", SLEEPER, ResourceConfig=TWO_HOSTS))
    _training_on_every_host(service, "ray-stop", 2)
    service.stop("ray-stop")
    record = wait_for(service, "ray-stop", timeout=60)
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    for host in ("algo-1", "algo-2"):
        assert any("got SIGTERM" in t for _, t in service.logs("ray-stop", host=host)), host


def test_max_runtime_reaches_every_node(on_ray: NamespaceCluster, service: JobService) -> None:
    body = python_job(
        "ray-overrun",
        SLEEPER,
        ResourceConfig=TWO_HOSTS,
        # Long enough for both hosts to start on a loaded machine: the SIGTERM must find
        # their handlers installed.
        StoppingCondition={"MaxRuntimeInSeconds": 30},
    )
    service.create(body)
    record = wait_for(service, "ray-overrun", timeout=90)
    assert (record.status, record.secondary_status) == ("Stopped", "MaxRuntimeExceeded")
    for host in ("algo-1", "algo-2"):
        assert any("got SIGTERM" in t for _, t in service.logs("ray-overrun", host=host)), host


def test_a_job_stopped_while_it_waits_for_capacity_never_runs(
    on_ray: NamespaceCluster, service: JobService
) -> None:
    many = {**TWO_HOSTS, "InstanceCount": on_ray.running() + 1}
    service.create(python_job("ray-wait-stop", "print('ran', flush=True)", ResourceConfig=many))
    deadline = time.monotonic() + 60
    while "Waiting for the Ray cluster" not in service.get("ray-wait-stop").status_message:
        assert time.monotonic() < deadline, service.get("ray-wait-stop")
        time.sleep(0.2)
    assert service.get("ray-wait-stop").secondary_status == "Pending"
    service.stop("ray-wait-stop")
    record = wait_for(service, "ray-wait-stop", timeout=30)
    assert (record.status, record.secondary_status) == ("Stopped", "Stopped")
    assert [t.status for t in record.transitions] == [
        "Starting",
        "Pending",
        "Stopping",
        "Stopped",
    ]
    assert not any(t == "ran" for _, t in service.logs("ray-wait-stop"))


def test_a_job_waits_for_capacity_then_runs(on_ray: NamespaceCluster, service: JobService) -> None:
    three = {**TWO_HOSTS, "InstanceCount": 3}
    service.create(python_job("ray-wait", "print('ran', flush=True)", ResourceConfig=three))
    deadline = time.monotonic() + 60
    while "Waiting for the Ray cluster" not in service.get("ray-wait").status_message:
        assert time.monotonic() < deadline, (
            service.get("ray-wait").runner,
            service.get("ray-wait").status,
            service.get("ray-wait").status_message,
            service.logs("ray-wait", host="algo-3"),
        )
        time.sleep(0.2)
    record = service.get("ray-wait")
    assert (record.status, record.secondary_status) == ("InProgress", "Pending")
    assert "3 nodes" in record.status_message and "2 live nodes" in record.status_message
    # A server's scheduler counts it as running, holding its slot, never as queued.
    from trainport.jobs.scheduler import Scheduler

    scheduler = Scheduler(service, limit=1)
    assert scheduler.tick() == []
    assert scheduler._census() == ([], 1)
    grown = on_ray.add_node()  # the cluster grows: the job gets its third node
    try:
        record = wait_for(service, "ray-wait", timeout=120)
    finally:
        on_ray.remove_node(grown)  # the next tests find the two nodes they expect
    assert record.status == "Completed", record.failure_reason
    steps = [t.status for t in record.transitions]
    assert steps[:3] == ["Starting", "Pending", "Starting"], steps
    assert steps[-1] == "Completed" and "Training" in steps


CHANNELS = """
import json, os
rc = json.load(open('/opt/ml/input/config/resourceconfig.json'))
files = sorted(os.listdir('/opt/ml/input/data/train'))
with open('/opt/ml/input/data/stream_0', 'rb') as fifo:
    streamed = fifo.read()
print('REPORT ' + json.dumps({'host': rc['current_host'], 'files': files,
                              'stream': streamed.decode()}), flush=True)
"""


def test_sharded_file_and_pipe_channels_on_nodes(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    for k in range(4):
        put(home, "data", f"shards/part-{k}", f"shard {k}")
    put(home, "data", "stream/all", "every host reads this")
    channels = [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://data/shards/",
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
        },
        {
            "ChannelName": "stream",
            "InputMode": "Pipe",
            "DataSource": {
                "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/stream/"}
            },
        },
    ]
    body = python_job("ray-channels", CHANNELS, ResourceConfig=TWO_HOSTS, InputDataConfig=channels)
    service.create(body)
    record = wait_for(service, "ray-channels", timeout=120)
    assert record.status == "Completed", record.failure_reason
    got = reports(service, "ray-channels", 2)
    shards = [f for doc in got.values() for f in doc["files"]]  # type: ignore[attr-defined]
    assert sorted(shards) == [f"part-{k}" for k in range(4)]  # each object on one host
    assert all(doc["files"] for doc in got.values())
    assert {doc["stream"] for doc in got.values()} == {"every host reads this"}


FAST = """
import json, os
rc = json.load(open('/opt/ml/input/config/resourceconfig.json'))
root = '/opt/ml/input/data/fast'
files = {f: open(os.path.join(root, f)).read() for f in sorted(os.listdir(root))}
print('REPORT ' + json.dumps({'host': rc['current_host'], 'files': files}), flush=True)
"""


def test_a_fastfile_channel_on_nodes(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    require(Path("/dev/fuse").exists(), "FastFile needs FUSE (/dev/fuse)")
    for k in range(2):
        put(home, "data", f"fast/part-{k}", f"lazily {k}")
    channel = {
        "ChannelName": "fast",
        "InputMode": "FastFile",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/fast/"}},
    }
    body = python_job("ray-fast", FAST, ResourceConfig=TWO_HOSTS, InputDataConfig=[channel])
    service.create(body)
    record = wait_for(service, "ray-fast", timeout=120)
    assert record.status == "Completed", (record.failure_reason, service.logs("ray-fast"))
    got = reports(service, "ray-fast", 2)
    expected = {"part-0": "lazily 0", "part-1": "lazily 1"}
    assert {h: d["files"] for h, d in got.items()} == {"algo-1": expected, "algo-2": expected}


def test_two_hosts_in_containers_on_two_nodes(
    home: Path, on_ray: NamespaceCluster, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image's hosts, each a container started by its node's agent (podman, on the
    node's network), talking by name across nodes."""
    import shutil

    from tests.container.test_container_jobs import TWO_HOSTS as TALK
    from tests.container.test_container_jobs import _image_tag

    require(shutil.which("podman") is not None, "podman is not installed")
    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", "podman")
    image = _image_tag("podman")
    body = python_job("ray-byo-image", "", ResourceConfig=TWO_HOSTS)
    body["AlgorithmSpecification"] = {
        "TrainingImage": image,
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["/bin/sh", "-c", TALK],
    }
    service.create(body)
    record = wait_for(service, "ray-byo-image", timeout=180)
    lines = [t for _, t in service.logs("ray-byo-image")]
    assert record.status == "Completed", (record.failure_reason, lines)
    assert "algo-1 got: hello from algo-2" in lines
    for host in ("algo-1", "algo-2"):
        said = [t for _, t in service.logs("ray-byo-image", host=host)]
        assert any(f"host {host} runs on Ray node" in t for t in said)
    assert any(f"running image {image} in" in t.message for t in record.transitions)


def test_the_same_spec_gives_the_same_results_here_and_on_ray(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    import tarfile

    results = {}
    for where in ("sandbox", "ray"):
        name = f"same-{where}"
        body = python_job(name, ALL_REDUCE_BY_NAME, ResourceConfig=TWO_HOSTS)
        # This interpreter (it has torch) on both sides, not the machine's python3.
        body["AlgorithmSpecification"]["ContainerEntrypoint"][0] = sys.executable
        service.create(body, runner=where)
        record = wait_for(service, name, timeout=180)
        assert record.status == "Completed", (record.failure_reason, list(service.logs(name)))
        assert record.runner == where
        with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
            archive = {n: tar.extractfile(n).read() for n in tar.getnames()}  # type: ignore[union-attr]
        sums = {h: d["sum"] for h, d in reports(service, name, 2).items()}
        results[where] = (sums, archive, record.secondary_status)
    assert results["sandbox"] == results["ray"]


CHECKPOINTS = """
import os
seeded = open('/opt/ml/checkpoints/step-1').read()
open('/opt/ml/checkpoints/step-2', 'w').write(seeded + '+2')
open('/opt/ml/model/weights', 'w').write('from ' + os.uname().nodename)
print('seeded ' + seeded, flush=True)
"""


def test_one_host_uploads_its_model_and_checkpoints_from_its_node(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    import tarfile

    put(home, "ckpt", "run/step-1", "one")
    body = python_job(
        "ray-one",
        CHECKPOINTS,
        CheckpointConfig={"S3Uri": "s3://ckpt/run", "LocalPath": "/opt/ml/checkpoints"},
    )
    service.create(body)
    record = wait_for(service, "ray-one", timeout=120)
    assert record.status == "Completed", record.failure_reason
    assert any(t == "seeded one" for _, t in service.logs("ray-one"))
    assert (home / "store" / "ckpt" / "run" / "step-2").read_text() == "one+2"
    with tarfile.open(home / "store" / record.model_artifacts[len("s3://") :]) as tar:  # type: ignore[index]
        assert tar.getnames() == ["weights"]
    # Nothing of the host's tree is left on its node.
    assert not list(Path(tempfile.gettempdir(), "trainport-ray").glob("*/jobs/ray-one"))


def test_the_server_with_the_ray_runner_sends_boto3_jobs_to_the_cluster(
    home: Path, on_ray: NamespaceCluster, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.server.conftest import KEY_ID, SECRET, TRAIN, client, job, start_server
    from tests.server.conftest import wait_for as wait_described

    monkeypatch.setenv("TRAINPORT_SERVER_KEYS", f"{KEY_ID}:{SECRET}")
    put(home, "data", "train/part-0.txt", "one\ntwo\n")
    server = start_server()  # TRAINPORT_RUNNER=ray: the server's setting
    try:
        sm = client(server)
        sm.create_training_job(**job("ray-boto3", TRAIN, ResourceConfig=TWO_HOSTS))
        described = wait_described(sm, "ray-boto3", timeout=120)
    finally:
        server.close()
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    assert service.get("ray-boto3").runner == "ray"
    assert [m["MetricName"] for m in described["FinalMetricDataList"]] == ["loss"]
    placed = [t for _, t in service.logs("ray-boto3", host="algo-2") if "runs on Ray node" in t]
    assert placed, "algo-2 did not run on a Ray node"


def test_the_cli_runs_a_job_on_the_cluster(
    home: Path, on_ray: NamespaceCluster, tmp_path: Path
) -> None:
    """`trainport run --runner ray`: the command a user types, as its own process (which
    checks the job against the cluster, then starts the supervisor without forking)."""
    import subprocess

    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(
        "import os\nprint('cli on', os.environ['SM_CURRENT_HOST'], flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "trainport.cli", "run", "--name", "ray-cli",
         "--entry-point", "train.py", "--source-dir", str(source), "--instance-count", "2",
         "--runner", "ray"],
        capture_output=True, text=True, timeout=180, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "cli on algo-1" in done.stdout  # algo-1's log, streamed as it came
    service = JobService(load_settings())
    record = service.get("ray-cli")
    assert (record.status, record.runner) == ("Completed", "ray")
    assert any(t == "cli on algo-2" for _, t in service.logs("ray-cli", host="algo-2"))


def _processes_running(needle: str) -> list[int]:
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle.encode() in cmdline and state != b"Z":
            found.append(int(pid))
    return found


def _described(pids: list[int]) -> list[str]:
    """Each process with its parent and command line, to say what was left."""
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            ppid = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        found.append(f"{pid} (parent {ppid.decode()}): {cmdline.decode(errors='replace')[:200]}")
    return found


def test_a_dead_supervisor_leaves_no_training_on_the_nodes(
    on_ray: NamespaceCluster, service: JobService
) -> None:
    body = python_job(
        "ray-orphan",
        SLEEPER,
        ResourceConfig=TWO_HOSTS,
        Tags=[{"Key": "trainport:stop-grace-seconds", "Value": "2"}],
    )
    service.create(body)
    _training_on_every_host(service, "ray-orphan", 2)
    assert len(_processes_running("ray-orphan-")) >= 2  # the two training processes
    supervisor = service.get("ray-orphan").supervisor
    assert supervisor is not None
    os.kill(supervisor[0], signal.SIGKILL)
    # Ray ends the dead driver's actors, and the processes they started with them (its
    # workers' children are killed when a worker exits), so nothing trains on unowned.
    deadline = time.monotonic() + 60
    while left := _processes_running("ray-orphan-"):
        assert time.monotonic() < deadline, f"training still runs on a node: {_described(left)}"
        time.sleep(0.2)
    record = wait_for(service, "ray-orphan", timeout=30)  # reading it reconciles it
    assert record.status == "Failed"
    assert "supervisor" in (record.failure_reason or "")


def test_a_node_that_cannot_see_the_store_is_found_before_the_job_starts(
    home: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    # The embedded store lies under pytest's folder, which this node does not mount.
    temp = Path(tempfile.gettempdir())
    assert home.is_relative_to(temp), f"{home}: the test hides pytest's folder under {temp}"
    hidden = temp / home.relative_to(temp).parts[0]  # pytest-of-USER, or --basetemp's
    blind = on_ray.add_node(hide=hidden)
    try:
        hosts = {**TWO_HOSTS, "InstanceCount": on_ray.running()}  # every node, the blind one too
        service.create(python_job("ray-blind", "print('never')", ResourceConfig=hosts))
        record = wait_for(service, "ray-blind", timeout=120)
    finally:
        on_ray.remove_node(blind)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert "is not visible on every node" in reason, reason
    assert f"on node {blind.address}" in reason and "cannot read" in reason, reason
    assert "AWS_ENDPOINT_URL_S3" in reason
    assert record.training_start_time is None or "never" not in "".join(
        t for _, t in service.logs("ray-blind")
    )


def test_a_node_with_another_trainport_fails_the_job_at_once_naming_it(
    tmp_path: Path, on_ray: NamespaceCluster, service: JobService
) -> None:
    # This node's Python finds another "trainport" first: one without this one's modules.
    other = tmp_path / "other-trainport"
    (other / "trainport").mkdir(parents=True)
    (other / "trainport" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    stranger = on_ray.add_node(env={"PYTHONPATH": str(other)})
    try:
        hosts = {**TWO_HOSTS, "InstanceCount": on_ray.running()}  # every node, this one too
        service.create(python_job("ray-stranger", "print('never')", ResourceConfig=hosts))
        record = wait_for(service, "ray-stranger", timeout=120)
    finally:
        on_ray.remove_node(stranger)
    assert record.status == "Failed"
    reason = record.failure_reason or ""
    assert f"could not start on the node the cluster gave it (node {stranger.address}" in reason
    assert "Every node needs trainport 0.1.0 installed" in reason, reason
    # At once: before any host trained.
    assert "Training" not in [t.status for t in record.transitions]
    assert record.training_start_time is None or not any(
        t == "never" for _, t in service.logs("ray-stranger")
    )


RESUMES = """
import os, signal, sys, time
mark = '/opt/ml/checkpoints/started'
if os.path.exists(mark):
    print('resumed from the checkpoint', flush=True)
    sys.exit(0)
open(mark, 'w').write('1')
print('up', flush=True)
time.sleep(300)
"""


def test_a_node_killed_mid_job_with_retry_strategy_runs_it_again(
    home: Path, on_ray: NamespaceCluster, service: JobService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RetryStrategy: the lost node's InternalServerError starts the job again (Starting,
    saying why), which waits as Pending for a second node, then resumes from its checkpoint.
    Leaves the cluster with as many live nodes as it found."""
    monkeypatch.setenv("TRAINPORT_CHECKPOINT_SYNC_SECONDS", "0.5")
    body = python_job(
        "ray-retried",
        RESUMES,
        ResourceConfig=TWO_HOSTS,
        RetryStrategy={"MaximumRetryAttempts": 1},
        CheckpointConfig={"S3Uri": "s3://out/checkpoints/ray-retried"},
    )
    assert on_ray.alive_nodes() == 2  # one lost node leaves too few: the retry waits
    service = JobService(load_settings())
    service.create(body)
    _training_on_every_host(service, "ray-retried", 2)
    # The retry resumes from what reached the store: the mark must be there before the kill.
    wait_until(
        lambda: service.store.exists("out", "checkpoints/ray-retried/started"),
        timeout=60,
        what="the checkpoint mark synced to the store",
    )
    victim = _node_of(service, on_ray, "ray-retried", away_from_head=True)
    os.kill(on_ray.raylet_pid(victim), signal.SIGKILL)
    deadline = time.monotonic() + 90
    while service.get("ray-retried").secondary_status != "Pending":
        got = service.get("ray-retried")
        assert time.monotonic() < deadline, (got.transitions, got.failure_reason)
        time.sleep(0.2)
    on_ray.remove_node(victim)  # what is left of it (its `ray start`) goes too
    on_ray.add_node()
    record = wait_for(service, "ray-retried", timeout=180)
    assert record.status == "Completed", (record.failure_reason, service.logs("ray-retried"))
    steps = [(t.status, t.message) for t in record.transitions]
    restarted = [m for status, m in steps if m.startswith("Restarting the training job")]
    assert len(restarted) == 1, steps
    assert restarted[0].startswith("Restarting the training job (attempt 2 of 2, RetryStrategy)")
    assert f"InternalServerError: Ray node {victim.address}" in restarted[0]
    # Back to Starting once, for the retry; waiting for a node, then forward only.
    assert [status for status, _ in steps] == [*FORWARD[:3], "Starting", "Pending", *FORWARD], steps
    said = [t for _, t in service.logs("ray-retried")]
    assert "resumed from the checkpoint" in said and any("attempt 2 of 2" in t for t in said)


def _node_of(
    service: JobService, on_ray: NamespaceCluster, job: str, away_from_head: bool
) -> RayNode:
    """The node a host of ``job`` runs on (one not the head, if asked)."""
    where = {}
    for host in ("algo-1", "algo-2"):
        for _, text in service.logs(job, host=host):
            if text.startswith(f"[trainport] host {host} runs on Ray node "):
                where[host] = text.split()[7]
    address = next(a for a in where.values() if not away_from_head or a != on_ray.head.address)
    return next(n for n in on_ray.nodes if n.address == address)


def test_a_node_killed_mid_job_fails_it_naming_host_and_node(
    on_ray: NamespaceCluster, service: JobService
) -> None:
    """Runs last: it kills a node (never the head). Ray marks it dead in about 15 s."""
    service.create(python_job("ray-node-dies", SLEEPER, ResourceConfig=TWO_HOSTS))
    _training_on_every_host(service, "ray-node-dies", 2)
    where = {}
    for host in ("algo-1", "algo-2"):
        for _, text in service.logs("ray-node-dies", host=host):
            if text.startswith(f"[trainport] host {host} runs on Ray node "):
                where[host] = text.split()[7]
    victim = next(h for h, address in where.items() if address != on_ray.head.address)
    node = next(n for n in on_ray.nodes if n.address == where[victim])
    killed = time.time()
    os.kill(on_ray.raylet_pid(node), signal.SIGKILL)
    record = wait_for(service, "ray-node-dies", timeout=120)
    assert record.status == "Failed"
    assert record.failure_reason.startswith(
        f"{victim}: InternalServerError: Ray node {node.address}"
    )  # type: ignore[union-attr]
    # Noticed by Ray's failure detection, not when the other host's 300 s sleep ended.
    assert record.training_end_time is not None and record.training_end_time - killed < 300
