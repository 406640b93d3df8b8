"""The pure decision of the container runner: what an engine is told to mount and run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainport.runners.api import Placement
from trainport.runners.container import ContainerJob, container_argv


def placement(netns: str | None = None) -> Placement:
    return Placement(
        root=Path("/jobs/j/hosts/algo-2/opt_ml"),
        hosts_file=Path("/jobs/j/hosts/algo-2/hosts"),
        argv=("img", "train"),
        env={"PATH": "/machine/bin"},
        cwd="/",
        netns=netns,
    )


def job(**kw: Any) -> ContainerJob:
    base = ContainerJob(
        engine="/usr/bin/podman",
        image="img:1",
        name="trainport-j-algo-2",
        host="algo-2",
        env={"TRAINING_JOB_NAME": "j"},
    )
    return dataclasses.replace(base, **kw)


def test_sagemaker_subfolders_hosts_file_and_only_the_contract_env() -> None:
    argv = container_argv(job(), placement())
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert volumes == [
        "/jobs/j/hosts/algo-2/opt_ml/input:/opt/ml/input",
        "/jobs/j/hosts/algo-2/opt_ml/model:/opt/ml/model",
        "/jobs/j/hosts/algo-2/opt_ml/output:/opt/ml/output",
        "/jobs/j/hosts/algo-2/opt_ml/checkpoints:/opt/ml/checkpoints",
        "/jobs/j/hosts/algo-2/hosts:/etc/hosts:ro",
    ]
    assert "TRAINING_JOB_NAME=j" in argv and not any(a.startswith("PATH=") for a in argv)
    assert argv[argv.index("--hostname") + 1] == "algo-2"
    assert argv[argv.index("--runtime") + 1] == "runc"
    assert argv[-2:] == ["img:1", "train"]


def test_entrypoint_and_arguments_override_as_in_sagemaker() -> None:
    argv = container_argv(
        job(entrypoint=("python3", "-u", "t.py"), arguments=("--lr", "1")), placement()
    )
    i = argv.index("--entrypoint")
    assert argv[i:] == ["--entrypoint", "python3", "img:1", "-u", "t.py", "--lr", "1"]
    assert container_argv(job(arguments=("serve",)), placement())[-2:] == ["img:1", "serve"]


def test_network_namespace_isolation_and_gpus() -> None:
    argv = container_argv(job(), placement(netns="tp-j-algo-2"))
    assert argv[argv.index("--network") + 1] == "ns:/run/netns/tp-j-algo-2"
    # Isolated: no network of its own, or the job's namespace where its hosts meet.
    argv = container_argv(job(network_isolation=True), placement())
    assert argv[argv.index("--network") + 1] == "none"
    argv = container_argv(job(network_isolation=True), placement(netns="tp-j-lo"))
    assert argv[argv.index("--network") + 1] == "ns:/run/netns/tp-j-lo"
    argv = container_argv(job(gpu_devices=("1", "2")), placement())
    assert "--device=nvidia.com/gpu=1" in argv and "--device=nvidia.com/gpu=2" in argv
    docker = container_argv(job(engine="/usr/bin/docker", gpu_devices=("1",)), placement())
    assert docker[docker.index("--gpus") + 1] == "device=1" and "--runtime" not in docker


def test_labels_name_the_job_so_a_dead_supervisors_containers_are_found() -> None:
    labelled = job(labels={"trainport.job": "j", "trainport.job-dir": "/home/jobs/j"})
    argv = container_argv(labelled, placement())
    labels = [argv[i + 1] for i, a in enumerate(argv) if a == "--label"]
    assert labels == ["trainport.job=j", "trainport.job-dir=/home/jobs/j"]
    assert argv.index("--label") < argv.index("img:1")  # engine options, not the program's


def test_a_checkpoint_folder_outside_sagemakers_folders_is_mounted_too() -> None:
    def volumes(path: str) -> list[str]:
        argv = container_argv(job(checkpoint_path=path), placement())
        return [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]

    assert "/jobs/j/hosts/algo-2/opt_ml/ckpt/run:/opt/ml/ckpt/run" in volumes("/opt/ml/ckpt/run")
    assert len(volumes("/opt/ml/model/ckpt")) == len(volumes("/opt/ml/checkpoints")) == 5


def test_a_container_gets_its_instance_types_limits() -> None:
    from trainport.runners.limits import host_limits

    limits = host_limits("ml.m5.large", {})
    assert limits is not None
    argv = container_argv(job(), dataclasses.replace(placement(), limits=limits))
    assert f"--memory={8 << 30}" in argv and "--cpus=2" in argv and "--pids-limit=2048" in argv
    assert f"--shm-size={8 << 30}" in argv
    assert not any(a.startswith("--memory") for a in container_argv(job(), placement()))
