"""A job's source tarball through the server: its unpacked size is bounded, and checking it
holds up no other submission."""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import SLEEP, client, job, put, start_server


def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _script_job(name: str, source: str) -> dict[str, Any]:
    request = job(name, "print(1)")
    # Script mode, as the SageMaker SDK sends it: no entrypoint of its own.
    del request["AlgorithmSpecification"]["ContainerEntrypoint"]
    request["HyperParameters"] = {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": f'"{source}"',
    }
    return request


@pytest.fixture
def small_limit_server(server_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("TRAINPORT_MAX_SOURCEDIR_MB", "1")
    srv = start_server()
    yield srv
    srv.close()


def test_a_source_tarball_over_the_limit_is_refused(
    small_limit_server: Any, server_home: Path
) -> None:
    # 2 MiB of zeros: a few KiB compressed, over the 1 MiB limit unpacked.
    bomb = _tarball({"train.py": b"print(1)\n", "zeros.bin": bytes(2 << 20)})
    assert len(bomb) < 64 << 10
    put(server_home, "src", "bomb/sourcedir.tar.gz", bomb)
    with pytest.raises(ClientError) as caught:
        client(small_limit_server).create_training_job(
            **_script_job("bomb", "s3://src/bomb/sourcedir.tar.gz")
        )
    message = caught.value.response["Error"]["Message"]
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "1 MiB" in message and "TRAINPORT_MAX_SOURCEDIR_MB" in message


def test_a_source_tarball_within_the_limit_is_accepted(
    small_limit_server: Any, server_home: Path
) -> None:
    put(server_home, "src", "ok/sourcedir.tar.gz", _tarball({"train.py": b"print(1)\n"}))
    sm = client(small_limit_server)
    sm.create_training_job(**_script_job("within", "s3://src/ok/sourcedir.tar.gz"))
    sm.stop_training_job(TrainingJobName="within")


def test_checking_one_request_holds_up_no_other(server: Any) -> None:
    """While one CreateTrainingJob is being checked (held here at the check itself),
    another is accepted: the check runs outside the scheduler's lock."""
    service = server.service
    held, release = threading.Event(), threading.Event()
    real_check = service.check

    def check(request: dict[str, Any]) -> Any:
        if request.get("TrainingJobName") == "slow-check":
            held.set()
            release.wait(60)
        return real_check(request)

    service.check = check
    errors: list[BaseException] = []

    def submit_slow() -> None:
        try:
            client(server).create_training_job(**job("slow-check", SLEEP))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    slow = threading.Thread(target=submit_slow)
    slow.start()
    try:
        assert held.wait(30)
        done = threading.Event()

        def submit_other() -> None:
            client(server).create_training_job(**job("meanwhile", SLEEP))
            done.set()

        threading.Thread(target=submit_other, daemon=True).start()
        accepted = done.wait(30)
    finally:
        release.set()
        slow.join(60)
    assert accepted, "a CreateTrainingJob waited for another request's check"
    assert not errors
    sm = client(server)
    for name in ("slow-check", "meanwhile"):
        sm.stop_training_job(TrainingJobName=name)
