"""A host's CPU and memory samples: read from a real process group, from a real cgroup of
its own where this machine lets us make one, written and read back; and the dashboard's
shaping of metric steps and host order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import python_job, require, wait_for, wait_until
from trainport.host.resources import (
    ResourceSampler,
    append_resource_samples,
    read_resource_samples,
    resource_path,
    usage_of_group,
)
from trainport.jobs.service import JobService
from trainport.server.dashboard_series import host_order, job_settings, metric_steps

# Busy on one core, holding about 64 MiB.
BUSY = (
    "b = bytearray(64 << 20)\nfor i in range(len(b) // 4096): b[i * 4096] = 1\nwhile True: pass\n"
)


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


# Starts BUSY as a child in a session (and group) of its own, as an init such as tini
# starts the training process, and says the child's pid.
PARENT = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], start_new_session=True)\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
)


def test_the_children_of_a_group_in_groups_of_their_own_count_too() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, BUSY], start_new_session=True, stdout=subprocess.PIPE
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while (usage := usage_of_group(parent.pid)).memory_bytes < 60 << 20:
            assert time.monotonic() < deadline, f"the child's memory never counted: {usage}"
            time.sleep(0.1)
        assert usage.source == "processes"
    finally:
        os.kill(child, signal.SIGKILL)
        parent.wait()


def test_a_process_group_without_a_cgroup_of_its_own_is_read_from_its_processes(
    busy: subprocess.Popen[bytes],
) -> None:
    samples: list[tuple[float, float, int]] = []
    sampler = ResourceSampler(busy.pid, samples.append, interval=0.2)
    sampler.start()
    while len(samples) < 3:
        time.sleep(0.05)
    sampler.stop()
    assert usage_of_group(busy.pid).source == "processes"
    _, cpus, memory = samples[-1]
    assert cpus > 0.05  # busy, though a loaded machine may give it little of a core
    assert memory > 60 << 20


def _v1_group(controller: str, name: str) -> Path | None:
    root = Path("/sys/fs/cgroup") / controller
    if not root.is_dir() or not os.access(root, os.W_OK):
        return None
    path = root / name
    path.mkdir()
    return path


def test_a_process_group_in_a_cgroup_of_its_own_is_read_from_the_cgroup(
    busy: subprocess.Popen[bytes],
) -> None:
    name = f"trainport-test-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    try:
        for controller in ("memory", "cpuacct"):
            group = _v1_group(controller, name)
            require(group is not None, "no writable cgroup v1 memory and cpuacct here (root)")
            assert group is not None
            made.append(group)
            (group / "cgroup.procs").write_text(str(busy.pid))
        time.sleep(0.3)
        usage = usage_of_group(busy.pid)
        assert usage.source == "cgroup"
        assert usage.memory_bytes > 0 and usage.cpu_seconds > 0
    finally:
        busy.kill()
        busy.wait()
        for group in made:  # empty once the process is gone: then it can be removed
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def test_samples_are_written_and_read_back_torn_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "resources" / "algo-1.tsv"
    append_resource_samples(path, [(10.0, 1.5, 1024), (11.0, 0.25, 2048)])
    with open(path, "a") as f:
        f.write("12.0\t0.5")  # a write cut short
    assert read_resource_samples(path) == [(10.0, 1.5, 1024), (11.0, 0.25, 2048)]
    assert read_resource_samples(tmp_path / "none.tsv") == []


def test_metric_points_take_the_step_of_the_log_line_they_came_from(tmp_path: Path) -> None:
    log = tmp_path / "algo-1.log"
    log.write_text(
        "100.000\tEpoch 1/3: loss=0.9\n100.500\tsaving\n101.000\t[epoch 2] loss=0.5\n"
        "102.000\tloss=0.2\n"
    )
    series = {"loss": [(100.0, 0.9), (101.0, 0.5), (102.0, 0.2)]}
    steps = metric_steps(log, series)
    assert steps["loss"] == {
        "points": [[100.0, 0.9, 1], [101.0, 0.5, 2], [102.0, 0.2, None]],
        "axis": "epoch",
    }
    assert metric_steps(tmp_path / "none.log", series)["loss"]["axis"] is None
    # The log grows (its last line still half written): the new lines are read on.
    with open(log, "a") as f:
        f.write("103.000\tstep 40 loss=0.1\n104.000\tstep 4")
    grown = {"loss": [*series["loss"], (103.0, 0.1), (104.0, 0.05)]}
    points = metric_steps(log, grown)["loss"]["points"]
    assert [p[2] for p in points] == [1, 2, None, 40, None]
    with open(log, "a") as f:
        f.write("1 loss=0.05\n")
    assert metric_steps(log, grown)["loss"]["points"][-1] == [104.0, 0.05, 41]


def test_the_failed_host_comes_first_and_environment_values_stay_out() -> None:
    hosts = ["algo-1", "algo-2", "algo-10"]
    assert [h["host"] for h in host_order(hosts, "algo-10: AlgorithmError: boom")] == [
        "algo-10",
        "algo-1",
        "algo-2",
    ]
    assert [h["failed"] for h in host_order(hosts, "AlgorithmError: boom")] == [False] * 3
    settings = job_settings(
        {"Environment": {"TOKEN": "secret", "A": "1"}, "ResourceConfig": {"InstanceCount": 1}},
        [("team", "vision")],
    )
    assert settings["EnvironmentNames"] == ["A", "TOKEN"]
    assert "secret" not in repr(settings)
    assert settings["Tags"] == [{"Key": "team", "Value": "vision"}]


def test_a_sandboxed_hosts_samples_come_from_its_runc_containers_cgroup(
    home: Path, service: JobService
) -> None:
    from trainport.runners import sandbox

    require(os.geteuid() == 0, "the runc sandbox (and its cgroups) needs root")
    problem = sandbox._probe("runc")
    require(problem is None, f"no runc sandbox on this machine: {problem}")
    code = "b = bytearray(64 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
    code += "import time\nprint('holding', flush=True)\ntime.sleep(30)\n"
    service.create(python_job("held", code, Tags=[{"Key": "trainport:runner", "Value": "sandbox"}]))
    wait_until(lambda: any("holding" in line for _, line in service.logs("held")), 120, "holding")
    pgid = service.get("held").training_pgid
    assert pgid is not None
    usage = usage_of_group(pgid)
    assert usage.source == "cgroup"
    assert usage.memory_bytes > 60 << 20
    samples = resource_path(home / "jobs" / "held", "algo-1")
    wait_until(lambda: len(read_resource_samples(samples)) >= 2, 30, "two samples")
    service.stop("held")
    assert wait_for(service, "held").status == "Stopped"
    assert max(memory for _, _, memory in read_resource_samples(samples)) > 60 << 20
