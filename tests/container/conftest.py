"""The container engines the container tests run on: podman as installed, and docker
through a daemon of the tests' own (a system docker is never used nor touched)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require

log = logging.getLogger(__name__)


def _dockerd_argv(dockerd: str, root: Path) -> list[str]:
    """A daemon whose state, sockets and containers are all under ``root``.

    No TCP listener, no iptables rules and no docker0 bridge on the machine: job
    containers name their network (host or none), and builds need none. A running system
    containerd is shared by dockerd 20.10 whatever it is told, so its namespaces are ours.
    The storage driver is dockerd's choice: overlay2 where the folder allows, else vfs.
    """
    return [
        dockerd,
        "--data-root",
        str(root / "data"),
        "--exec-root",
        str(root / "exec"),
        "--pidfile",
        str(root / "dockerd.pid"),
        "--host",
        f"unix://{root / 'docker.sock'}",
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        "--containerd-namespace",
        "trainport-test",
        "--containerd-plugins-namespace",
        "trainport-test-plugins",
    ]


def _unmount_under(root: Path) -> None:
    """What dockerd leaves mounted after it ended (its network sandbox's nsfs)."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@pytest.fixture(scope="session")
def dockerd() -> Iterator[str]:
    """A private docker daemon for the session; DOCKER_HOST points at it meanwhile. Yields
    the docker client's path."""
    dockerd, docker = shutil.which("dockerd"), shutil.which("docker")
    require(
        dockerd is not None and docker is not None,
        "docker is not installed (scripts/setup.sh --test installs docker.io)",
    )
    require(os.geteuid() == 0, "the docker tests start a docker daemon, which needs root")
    assert dockerd is not None and docker is not None
    # Short: the daemon's sockets live under it, and a socket path has at most 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="tp-dockerd-"))
    host = f"unix://{root / 'docker.sock'}"
    with open(root / "dockerd.log", "wb") as out:
        daemon = subprocess.Popen(
            _dockerd_argv(dockerd, root),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DOCKER_HOST", host)
            deadline = time.monotonic() + 60
            while subprocess.run([docker, "info"], capture_output=True).returncode != 0:
                said = (root / "dockerd.log").read_text(errors="replace")[-3000:]
                if daemon.poll() is not None:
                    pytest.fail(f"dockerd exited with {daemon.returncode}:\n{said}")
                if time.monotonic() > deadline:
                    pytest.fail(f"dockerd did not answer on {host} within 60 s:\n{said}")
                time.sleep(0.1)
            log.info("private dockerd %d on %s", daemon.pid, host)
            yield docker
    finally:
        daemon.send_signal(signal.SIGTERM)  # dockerd stops its containers and containerd
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        _unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=["podman", "docker"])
def engine(request: pytest.FixtureRequest) -> str:
    """The path of the engine a test's jobs run in: each test asking for it runs on both."""
    require(Path("/bin/busybox").exists(), "busybox-static is not installed")
    if request.param == "docker":
        return str(request.getfixturevalue("dockerd"))
    podman = shutil.which("podman")
    require(podman is not None, "podman is not installed (scripts/setup.sh --test)")
    require(os.geteuid() == 0, "these tests run podman as root")
    assert podman is not None
    return podman
