"""Jobs whose TrainingImage is an image in the machine's container engine (podman, and
docker through the tests' own daemon): the bring-your-own-container contract (an image
run as ``image train`` that finds everything at /opt/ml) checked inside a real container."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import put, request, require, wait_for, wait_until
from trainport.jobs.service import JobService
from trainport.runners.container import engine_kind, find_engine, image_present

# A BYO training program that hard-codes /opt/ml, as images written for SageMaker do.
TRAIN = r"""#!/bin/sh
echo "args=$* host=$(hostname) job=$TRAINING_JOB_NAME arn=${TRAINING_JOB_ARN%%:*} foo=$FOO"
grep -q algo-1 /etc/hosts && echo "algo-1 in hosts"
ls /opt/ml/input/config
if [ -p /opt/ml/input/data/training_0 ]; then
  echo "training_0 is a FIFO"
  cat /opt/ml/input/data/training_0 > /opt/ml/model/model.txt
else
  grep " /opt/ml/input/data/training " /proc/mounts | cut -d" " -f1,3 | sed "s/^/training mount: /"
  cat /opt/ml/input/data/training/*.txt > /opt/ml/model/model.txt
fi
echo "image keeps $(cat /opt/ml/code/kept.txt)"
case "$MODE" in
fail) echo "bad hyperparameter" > /opt/ml/output/failure; exit 3 ;;
wait)
  trap 'echo got TERM; echo saved > /opt/ml/model/saved.txt; exit 0' TERM
  echo ready
  while true; do sleep 0.2; done ;;
esac
echo done
"""


def _image_tag(engine: str, user: str = "") -> str:
    busybox = Path("/bin/busybox")
    inputs = TRAIN.encode() + user.encode() + busybox.read_bytes()
    key = hashlib.sha256(inputs).hexdigest()[:12]
    tag = f"localhost/trainport-test-byo:{key}"
    if image_present(engine, tag):
        return tag
    context = Path.home() / ".cache" / "trainport" / "images" / f"byo-{key}"
    context.mkdir(parents=True, exist_ok=True)
    shutil.copy(busybox, context / "busybox")
    (context / "train").write_text(TRAIN)
    (context / "train").chmod(0o755)
    (context / "kept.txt").write_text("its code\n")
    (context / "Containerfile").write_text(
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        "COPY train /usr/local/bin/train\n"
        "COPY kept.txt /opt/ml/code/kept.txt\n"
        + (f"USER {user}\n" if user else "")
        + 'ENTRYPOINT ["/usr/local/bin/train"]\n'
    )
    runtime = ["--runtime", "runc"] if engine_kind(engine) == "podman" else []
    containerfile = ["-f", str(context / "Containerfile")]
    subprocess.run(
        [engine, "build", *runtime, "-q", *containerfile, "-t", tag, str(context)],
        check=True,
        capture_output=True,
    )
    return tag


@pytest.fixture
def image(engine: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The BYO image in ``engine`` (conftest: podman, then docker), the engine jobs use."""
    monkeypatch.setenv("TRAINPORT_CONTAINER_ENGINE", engine)
    return _image_tag(engine)


def image_job(name: str, image: str, mode: str = "", input_mode: str = "File") -> dict[str, object]:
    return request(
        name,
        AlgorithmSpecification={"TrainingImage": image, "TrainingInputMode": input_mode},
        Environment={"FOO": "bar", "MODE": mode},
        InputDataConfig=[
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://data/{name}/"}
                },
            }
        ],
    )


def model(home: Path, uri: str) -> dict[str, bytes]:
    with tarfile.open(home / "store" / uri[len("s3://") :]) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_image_runs_train_with_the_contract_inside(
    home: Path, service: JobService, image: str, engine: str
) -> None:
    put(home, "data", "byo/a.txt", "hello data\n")
    service.create(image_job("byo", image))
    record = wait_for(service, "byo")
    lines = [line for _, line in service.logs("byo")]
    assert record.status == "Completed", (record.failure_reason, lines)
    assert "args=train host=algo-1 job=byo arn=arn foo=bar" in lines
    assert "algo-1 in hosts" in lines
    assert {"hyperparameters.json", "inputdataconfig.json", "resourceconfig.json"} <= set(lines)
    assert "image keeps its code" in lines  # /opt/ml/code of the image is not hidden
    assert model(home, str(record.model_artifacts))["model.txt"] == b"hello data\n"
    assert any(f"running image {image} in {engine}" in t.message for t in record.transitions)


@pytest.mark.parametrize("input_mode", ["Pipe", "FastFile"])
def test_pipe_fifos_and_fastfile_mounts_reach_the_container(
    home: Path, service: JobService, image: str, input_mode: str
) -> None:
    if input_mode == "FastFile":
        require(Path("/dev/fuse").exists(), "FastFile needs FUSE (/dev/fuse)")
    name = f"byo-{input_mode.lower()}"
    put(home, "data", f"{name}/a.txt", "streamed\n")
    service.create(image_job(name, image, input_mode=input_mode))
    record = wait_for(service, name)
    lines = [line for _, line in service.logs(name)]
    assert record.status == "Completed", (record.failure_reason, lines)
    assert model(home, str(record.model_artifacts))["model.txt"] == b"streamed\n"
    # The image reads whatever it finds: say which mode delivered the bytes, so that a
    # FIFO missing or a FastFile view quietly staged as File mode fails here.
    if input_mode == "Pipe":
        assert "training_0 is a FIFO" in lines
    else:
        mounts = [line for line in lines if line.startswith("training mount: ")]
        assert len(mounts) == 1, lines
        assert mounts[0].startswith("training mount: trainport-fastfile:")
        assert mounts[0].endswith(" fuse")


def test_files_of_an_image_running_as_another_user_are_uploaded_and_removable(
    home: Path, service: JobService, image: str, engine: str
) -> None:
    other = _image_tag(engine, user="1234:1234")
    put(home, "data", "byo-user/a.txt", "mine\n")
    service.create(image_job("byo-user", other, mode="fail"))
    record = wait_for(service, "byo-user")
    assert record.status == "Failed" and "bad hyperparameter" in (record.failure_reason or "")
    assert model(home, str(record.model_artifacts))["model.txt"] == b"mine\n"
    shutil.rmtree(home / "jobs" / "byo-user")  # what the next job's clean-up does


def test_failure_file_and_exit_code_as_for_other_jobs(
    home: Path, service: JobService, image: str
) -> None:
    put(home, "data", "byo-fail/a.txt", "x\n")
    service.create(image_job("byo-fail", image, mode="fail"))
    record = wait_for(service, "byo-fail")
    assert record.status == "Failed"
    assert "bad hyperparameter" in (record.failure_reason or "")
    assert model(home, str(record.model_artifacts))["model.txt"] == b"x\n"


def test_stop_sends_sigterm_into_the_container_and_the_saved_model_is_uploaded(
    home: Path, service: JobService, image: str
) -> None:
    put(home, "data", "byo-stop/a.txt", "x\n")
    service.create(image_job("byo-stop", image, mode="wait"))
    wait_until(lambda: "ready" in [line for _, line in service.logs("byo-stop")])
    service.stop("byo-stop")
    record = wait_for(service, "byo-stop")
    assert record.status == "Stopped"
    assert "got TERM" in [line for _, line in service.logs("byo-stop")]
    assert model(home, str(record.model_artifacts))["saved.txt"] == b"saved\n"


def test_missing_image_is_pulled_and_the_error_names_it(
    home: Path, service: JobService, image: str
) -> None:
    missing = "registry.invalid/nobody/missing-image:1"
    put(home, "data", "byo-missing/a.txt", "never read\n")
    service.create(image_job("byo-missing", missing))  # submission pulls nothing
    record = wait_for(service, "byo-missing")
    assert record.status == "Failed"
    reason = str(record.failure_reason)
    assert repr(missing) in reason, reason
    said = reason.split("could not be pulled: ")[1]
    assert not said.startswith("exit "), said  # the engine's own words


def test_engine_setting_none_means_no_engine() -> None:
    assert find_engine("none") is None


# busybox nc -l whose own input is empty may close before the peer's data arrives; a
# program on the connection (-e) reads it all.
TWO_HOSTS = r"""
if [ "$(hostname)" = algo-1 ]; then
  nc -l -p 5000 -e sh -c 'cat > /opt/ml/model/got'
  echo "algo-1 got: $(cat /opt/ml/model/got)"
else
  until echo "hello from $(hostname)" | nc algo-1 5000; do sleep 0.2; done
fi
"""


@pytest.mark.parametrize("engine", ["podman"], indirect=True)  # docker: see test_docker.py
def test_two_hosts_in_two_containers_on_a_namespace_network(
    home: Path, service: JobService, image: str
) -> None:
    from trainport.runners.netns import netns_problem

    require(netns_problem() is None, f"no network namespaces: {netns_problem()}")
    body = request(
        "byo-two",
        AlgorithmSpecification={
            "TrainingImage": image,
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["/bin/sh", "-c", TWO_HOSTS],
        },
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
        Tags=[{"Key": "trainport:network", "Value": "namespaces"}],
    )
    service.create(body)
    record = wait_for(service, "byo-two")
    lines = [line for _, line in service.logs("byo-two")]
    assert record.status == "Completed", (record.failure_reason, lines)
    assert "algo-1 got: hello from algo-2" in lines
