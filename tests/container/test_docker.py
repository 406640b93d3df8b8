"""What differs under docker: its command line, the networks it can and cannot give a
job's hosts, a 2-host job in two docker containers, and the container a killed supervisor
left to the daemon. The contract itself runs on docker in test_container_jobs.py (its
``engine`` fixture); the daemon is the tests' own (conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, request, wait_for, wait_until
from tests.container import test_container_lifecycle as lifecycle
from tests.container.test_container_argv import job, placement
from tests.container.test_container_jobs import _image_tag, image_job
from trainport.errors import SandboxError, ValidationError
from trainport.jobs.service import JobService
from trainport.runners.container import container_argv, network_problem

http_port = lifecycle.http_port  # the lifecycle tests' HTTP server on this machine


@pytest.fixture
def docker_image(dockerd: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", dockerd)
    return _image_tag(dockerd)


def docker_argv(isolated: bool = False, netns: str | None = None) -> list[str]:
    return container_argv(
        job(engine="/usr/bin/docker", network_isolation=isolated), placement(netns)
    )


def test_docker_gets_no_podman_flags_and_the_image_is_pid_1() -> None:
    argv = docker_argv()
    assert argv[argv.index("--network") + 1] == "host"
    assert not {"--uts", "--runtime", "--ulimit"} & set(argv)  # docker has no --uts private
    assert "--init=false" in argv  # whatever the daemon's default, as SageMaker runs it


def test_docker_joins_no_namespace_but_one_isolated_host_has_no_network() -> None:
    argv = docker_argv(isolated=True, netns="tp-j-lo")  # as root: the job's loopback
    assert argv[argv.index("--network") + 1] == "none"  # the same for one host
    with pytest.raises(SandboxError, match="TRAINPORT_CONTAINER_ENGINE=podman"):
        docker_argv(netns="tp-j-algo-1")
    assert network_problem("/usr/bin/docker", 1, namespaces=False, isolated=True) is None
    assert network_problem("/usr/bin/docker", 2, namespaces=False, isolated=True)
    assert network_problem("/usr/bin/docker", 1, namespaces=True, isolated=False)
    assert network_problem("/usr/bin/podman", 2, namespaces=True, isolated=True) is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"Tags": [{"Key": "trainport:network", "Value": "namespaces"}]},
        {"EnableNetworkIsolation": True},
    ],
    ids=["namespaces", "isolated"],
)
def test_a_network_docker_cannot_give_is_refused_at_create(
    service: JobService, docker_image: str, overrides: dict[str, Any]
) -> None:
    body = image_job("dk-refused", docker_image)
    body.update(overrides)
    body["ResourceConfig"] = {
        "InstanceType": "ml.m5.large",
        "InstanceCount": 2,
        "VolumeSizeInGB": 1,
    }
    with pytest.raises(ValidationError, match="docker cannot join") as caught:
        service.create(body)
    assert "TRAINPORT_CONTAINER_ENGINE=podman" in str(caught.value)


@pytest.mark.parametrize("isolated", [True, False])
def test_one_isolated_host_in_docker_reaches_nothing(
    home: Path, service: JobService, docker_image: str, http_port: int, isolated: bool
) -> None:
    name = f"dk-iso-{str(isolated).lower()}"
    env = {"PORT": str(http_port), "MACHINE": lifecycle.machine_address(), "EXTRA": ""}
    body = lifecycle.shell_job(
        home, name, docker_image, lifecycle.PROBE, Environment=env, EnableNetworkIsolation=isolated
    )
    service.create(body)
    record = wait_for(service, name)
    lines = lifecycle.lines_of(service, name)
    assert record.status == "Completed", (record.failure_reason, lines)
    reached = [line for line in lines if line.startswith("reached")]
    if isolated:
        assert reached == [] and "routes: 0" in lines, lines
    else:
        assert "reached 127.0.0.1" in reached, lines


# algo-1 listens on the machine's network, as each container shares it; algo-2 reaches it
# by name (its address in the job's /etc/hosts).
TWO_HOSTS = """
if [ "$(hostname)" = algo-1 ]; then
  nc -l -p "$PORT" -e sh -c 'cat > /opt/ml/model/got'; echo "algo-1 got: $(cat /opt/ml/model/got)"
else
  until echo "hello from $(hostname)" | nc algo-1 "$PORT"; do sleep 0.2; done
fi
"""


def test_two_hosts_in_two_docker_containers(
    service: JobService, docker_image: str, dockerd: str
) -> None:
    body = request(
        "dk-two",
        AlgorithmSpecification={
            "TrainingImage": docker_image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["/bin/sh", "-c", TWO_HOSTS],
        },
        Environment={"PORT": str(free_port())},
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
    )
    service.create(body)
    record = wait_for(service, "dk-two")
    lines = [line for _, line in service.logs("dk-two")]
    assert record.status == "Completed", (record.failure_reason, lines)
    assert "algo-1 got: hello from algo-2" in lines
    assert any(f"{docker_image} in {dockerd}" in t.message for t in record.transitions)


def docker_containers_of(docker: str, job: str) -> list[str]:
    listed = subprocess.run(
        [docker, "ps", "-a", "-q", "--filter", f"label=trainport.job={job}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()


@pytest.fixture
def leave_no_docker_containers(dockerd: str) -> Iterator[None]:
    """Whatever a failing test left running is removed (this test's job only)."""
    yield
    ids = docker_containers_of(dockerd, "dk-orphan")
    if ids:
        subprocess.run([dockerd, "rm", "-f", *ids], capture_output=True)


def test_reconcile_removes_the_docker_container_of_a_killed_supervisor(
    home: Path,
    service: JobService,
    docker_image: str,
    dockerd: str,
    leave_no_docker_containers: None,
) -> None:
    from trainport.jobs import liveness

    service.create(lifecycle.shell_job(home, "dk-orphan", docker_image, lifecycle.FOREVER))
    wait_until(lambda: "ready" in lifecycle.lines_of(service, "dk-orphan"), what="its start")
    supervisor = service.get("dk-orphan").supervisor
    assert supervisor is not None
    os.kill(supervisor[0], signal.SIGKILL)
    wait_until(lambda: not liveness.is_alive(supervisor), what="the supervisor's end")
    assert docker_containers_of(dockerd, "dk-orphan")  # the daemon keeps it running
    service.reconcile()
    record = service.get("dk-orphan")
    assert record.status == "Failed" and "supervisor" in (record.failure_reason or ""), record
    assert docker_containers_of(dockerd, "dk-orphan") == []
