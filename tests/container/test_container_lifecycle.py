"""Container jobs over their whole life: network isolation, a supervisor that dies, max
runtime, a checkpoint folder of the request's choosing, and a host that fails. Real podman
and busybox images, real signals, a real HTTP server on this machine."""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import put, request, require, wait_for, wait_until
from tests.container.test_container_jobs import _image_tag, model
from trainport.jobs.service import JobService


@pytest.fixture(scope="module")
def busybox_image() -> str:
    engine = shutil.which("podman")
    require(engine is not None, "podman is not installed (scripts/setup.sh --test)")
    assert engine is not None
    require(Path("/bin/busybox").exists(), "busybox-static is not installed")
    require(os.geteuid() == 0, "these tests run podman as root")
    return _image_tag(engine)


def _namespaces() -> None:
    from trainport.runners.netns import netns_problem

    require(netns_problem() is None, f"no network namespaces: {netns_problem()}")


def shell_job(home: Path, name: str, image: str, script: str, **overrides: Any) -> dict[str, Any]:
    """A job running ``script`` with the image's busybox sh; the script comes in through
    a channel (an entrypoint's words are at most 256 characters)."""
    put(home, "data", f"{name}/run.sh", script)
    algo = {
        "TrainingImage": image,
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["/bin/sh", "/opt/ml/input/data/code/run.sh"],
    }
    channel = {
        "ChannelName": "code",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://data/{name}/"}},
    }
    return request(name, AlgorithmSpecification=algo, InputDataConfig=[channel], **overrides)


def lines_of(service: JobService, name: str, host: str = "algo-1") -> list[str]:
    return [line for _, line in service.logs(name, host=host)]


# -- EnableNetworkIsolation --------------------------------------------------------------


class _Pong(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"pong\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    """An HTTP server on all of this machine's addresses (127.0.0.1 among them)."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Pong)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def machine_address() -> str:
    """One of this machine's own non-loopback IPv4 addresses (where the server listens)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    found = [
        line.split()[3].split("/")[0]
        for line in out.splitlines()
        if line.split()[1] != "lo" and not line.split()[1].startswith(("tpb", "tpv"))
    ]
    require(bool(found), "this machine has no non-loopback IPv4 address")
    return found[0]


# busybox-static's wget crashes in an image without NSS libraries; its nc does not.
PROBE = r"""
for host in 127.0.0.1 "$MACHINE" $EXTRA; do
  if printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 "$host" "$PORT" 2> /dev/null | grep -q pong
  then echo "reached $host"; else echo "no $host"; fi
done
echo "routes: $(tail -n +2 /proc/net/route | wc -l)"
"""


@pytest.mark.parametrize("isolated", [True, False])
def test_network_isolation_leaves_one_host_nothing_to_reach(
    home: Path, service: JobService, busybox_image: str, http_port: int, isolated: bool
) -> None:
    name = f"iso-{str(isolated).lower()}"
    env = {"PORT": str(http_port), "MACHINE": machine_address(), "EXTRA": ""}
    service.create(
        shell_job(
            home, name, busybox_image, PROBE, Environment=env, EnableNetworkIsolation=isolated
        )
    )
    record = wait_for(service, name)
    lines = lines_of(service, name)
    assert record.status == "Completed", (record.failure_reason, lines)
    reached = [line for line in lines if line.startswith("reached")]
    # Either way nothing of the machine's: the job's network is its own (as root). Isolated,
    # a route to its own subnet at most (the job's bridge, itself alone on it); otherwise
    # that and a default route out through NAT.
    assert reached == [], lines
    assert ("routes: 0" in lines or "routes: 1" in lines) if isolated else "routes: 2" in lines


# algo-1 reads what algo-2 sends until algo-2 closes (nc -e: a listening nc whose own
# input is empty may give up before the data arrives).
TWO_ISOLATED = (
    r"""
if [ "$(hostname)" = algo-1 ]; then
  printf '#!/bin/sh\ncat > /opt/ml/output/got\n' > /opt/ml/output/recv
  chmod +x /opt/ml/output/recv
  nc -l -p 5000 -e /opt/ml/output/recv
  echo "algo-1 got: $(cat /opt/ml/output/got)"
else
  until echo "hello from $(hostname)" | nc algo-1 5000; do sleep 0.2; done
fi
# The bridge's own address (the .1 of the hosts' subnet), where there is a bridge.
own=$(ip -4 addr show eth0 2>/dev/null | awk '/inet /{print $2}' | cut -d/ -f1)
[ -n "$own" ] && EXTRA="${own%.*}.1"
"""
    + PROBE
)


@pytest.mark.parametrize("network", ["loopback", "namespaces"])
def test_isolated_hosts_reach_each_other_and_nothing_else(
    home: Path, service: JobService, busybox_image: str, http_port: int, network: str
) -> None:
    _namespaces()
    name = f"iso-two-{network}"
    body = shell_job(
        home,
        name,
        busybox_image,
        TWO_ISOLATED,
        Environment={"PORT": str(http_port), "MACHINE": machine_address()},
        EnableNetworkIsolation=True,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        Tags=[{"Key": "trainport:network", "Value": network}],
    )
    service.create(body)
    record = wait_for(service, name)
    one, two = lines_of(service, name), lines_of(service, name, "algo-2")
    assert record.status == "Completed", (record.failure_reason, one, two)
    assert "algo-1 got: hello from algo-2" in one
    for lines in (one, two):
        assert not [line for line in lines if line.startswith("reached")], lines
        assert len([line for line in lines if line.startswith("no ")]) == (
            3 if network == "namespaces" else 2
        ), lines


def test_isolation_of_a_job_outside_containers_too(
    home: Path, service: JobService, http_port: int
) -> None:
    """The process runner as root: the job's own loopback namespace holds it."""
    _namespaces()
    code = (
        "import urllib.request\n"
        "try:\n"
        f"    urllib.request.urlopen('http://127.0.0.1:{http_port}/', timeout=3)\n"
        "    print('reached')\n"
        "except OSError as exc:\n"
        "    print('unreachable', exc)\n"
    )
    body = request(
        "iso-process",
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", "-c", code],
        },
        EnableNetworkIsolation=True,
        Tags=[{"Key": "trainport:runner", "Value": "process"}],
    )
    service.create(body)
    record = wait_for(service, "iso-process")
    lines = lines_of(service, "iso-process")
    assert record.status == "Completed", (record.failure_reason, lines)
    assert any(line.startswith("unreachable") for line in lines), lines


def test_network_isolation_must_be_a_boolean(service: JobService) -> None:
    from trainport.errors import ValidationError
    from trainport.spec import parse_request

    body = request("iso-bad", EnableNetworkIsolation="yes")
    with pytest.raises(ValidationError, match="EnableNetworkIsolation"):
        parse_request(body, validate=False)
    assert parse_request(request("iso-ok", EnableNetworkIsolation=True)).network_isolation


# -- a supervisor that dies ----------------------------------------------------------------

FOREVER = r"""
trap '' TERM
echo ready
while true; do sleep 0.2; done
"""


def containers_of(job: str) -> list[str]:
    podman = shutil.which("podman")
    assert podman is not None
    listed = subprocess.run(
        [podman, "ps", "-a", "-q", "--filter", f"label=trainport.job={job}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


@pytest.fixture
def leave_no_containers() -> Iterator[None]:
    """Whatever a failing test left running is removed (this test's jobs only)."""
    yield
    podman = shutil.which("podman")
    for job in ("orphan-box",):
        ids = containers_of(job)
        if podman and ids:
            subprocess.run([podman, "rm", "-f", "-t", "0", *ids], capture_output=True)


def test_reconcile_removes_the_container_and_network_of_a_killed_supervisor(
    home: Path, service: JobService, busybox_image: str, leave_no_containers: None
) -> None:
    from trainport.jobs import liveness
    from trainport.runners.netns import network_tag

    _namespaces()
    # Isolated, so that its hosts' network namespace is left behind too.
    body = shell_job(home, "orphan-box", busybox_image, FOREVER, EnableNetworkIsolation=True)
    service.create(body)
    wait_until(lambda: "ready" in lines_of(service, "orphan-box"), what="the container's start")
    supervisor = service.get("orphan-box").supervisor
    assert supervisor is not None and containers_of("orphan-box")
    tag = network_tag("orphan-box", supervisor[0])
    namespace, bridge = f"tp-{tag}-1", Path(f"/sys/class/net/tpb{tag}")  # algo-1's, the job's
    assert namespace in namespaces() and bridge.exists()
    rules = subprocess.run(["nft", "list", "table", "inet", "trainport"], capture_output=True)
    assert bridge.name in rules.stdout.decode()
    os.kill(supervisor[0], signal.SIGKILL)
    wait_until(lambda: not liveness.is_alive(supervisor), what="the supervisor's end")
    assert containers_of("orphan-box")  # the engine keeps it running without its client
    service.reconcile()
    record = service.get("orphan-box")
    assert record.status == "Failed", record
    assert "supervisor" in (record.failure_reason or "")
    assert containers_of("orphan-box") == []
    assert namespace not in namespaces() and not bridge.exists()
    rules = subprocess.run(["nft", "list", "table", "inet", "trainport"], capture_output=True)
    assert bridge.name not in rules.stdout.decode()  # its firewall elements too


# -- MaxRuntimeInSeconds -------------------------------------------------------------------

SAVES_ON_TERM = r"""
trap 'echo got TERM; echo saved > /opt/ml/model/saved.txt; exit 0' TERM
echo ready
while true; do sleep 0.2; done
"""


@pytest.mark.parametrize("handles_term", [True, False])
def test_max_runtime_sends_term_then_kill_after_the_grace_and_uploads(
    home: Path, service: JobService, busybox_image: str, handles_term: bool
) -> None:
    """Stopped/MaxRuntimeExceeded as under the other runners, the model uploaded; a
    container that ignores SIGTERM is killed once the grace period is over."""
    name = f"overrun-{str(handles_term).lower()}"
    script = SAVES_ON_TERM if handles_term else "echo early > /opt/ml/model/early.txt\n" + FOREVER
    body = shell_job(
        home,
        name,
        busybox_image,
        script,
        StoppingCondition={"MaxRuntimeInSeconds": 8},
        Tags=[{"Key": "trainport:stop-grace-seconds", "Value": "2"}],
    )
    service.create(body)
    record = wait_for(service, name)
    lines = lines_of(service, name)
    assert (record.status, record.secondary_status) == ("Stopped", "MaxRuntimeExceeded"), lines
    assert "ready" in lines
    files = model(home, str(record.model_artifacts))
    if handles_term:
        assert "got TERM" in lines and files["saved.txt"] == b"saved\n"
    else:
        assert files == {"early.txt": b"early\n"}
    assert containers_of(name) == []


# -- CheckpointConfig.LocalPath ------------------------------------------------------------

CHECKPOINTS = r"""
echo "seeded: $(cat /opt/ml/my-checkpoints/step-1.txt)"
echo two > /opt/ml/my-checkpoints/step-2.txt
"""


def test_checkpoints_at_the_requested_local_path_are_seeded_and_synced(
    home: Path, service: JobService, busybox_image: str
) -> None:
    put(home, "ckpt", "box/step-1.txt", "one\n")
    body = shell_job(
        home,
        "ckpt-box",
        busybox_image,
        CHECKPOINTS,
        CheckpointConfig={"S3Uri": "s3://ckpt/box/", "LocalPath": "/opt/ml/my-checkpoints"},
    )
    service.create(body)
    record = wait_for(service, "ckpt-box")
    lines = lines_of(service, "ckpt-box")
    assert record.status == "Completed", (record.failure_reason, lines)
    assert "seeded: one" in lines
    assert (home / "store" / "ckpt" / "box" / "step-2.txt").read_text() == "two\n"


# -- a host that fails -----------------------------------------------------------------------

ONE_HOST_FAILS = r"""
if [ "$(hostname)" = algo-1 ]; then
  trap 'echo got TERM; echo saved > /opt/ml/model/saved.txt; exit 0' TERM
  nc -l -p 5000 -e /bin/true &  # tells algo-2 that the handler is set
  while true; do sleep 0.2; done
else
  until nc algo-1 5000 < /dev/null; do sleep 0.2; done
  echo "bad shard on algo-2" > /opt/ml/output/failure
  exit 3
fi
"""


def test_a_failed_host_stops_the_other_container_and_the_job_names_it(
    home: Path, service: JobService, busybox_image: str
) -> None:
    _namespaces()
    body = shell_job(
        home,
        "box-host-fails",
        busybox_image,
        ONE_HOST_FAILS,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        Tags=[{"Key": "trainport:network", "Value": "namespaces"}],
    )
    service.create(body)
    record = wait_for(service, "box-host-fails")
    one = lines_of(service, "box-host-fails")
    assert record.status == "Failed", (record.failure_reason, one)
    assert record.failure_reason == "algo-2: bad shard on algo-2\n"
    assert "got TERM" in one  # algo-1's container got SIGTERM, and its handler ran
    assert model(home, str(record.model_artifacts))["saved.txt"] == b"saved\n"
    assert containers_of("box-host-fails") == []
