"""A server's answers to requests that name paths say nothing of which files the server's
machine has: each path is refused by its form, whether or not it exists there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import client, job, put, start_server, wait_for
from trainport.config import container_engine_setting
from trainport.host.script_mode import pack_entry_point
from trainport.runners import container


def refusal(sm: Any, body: dict[str, Any], path: str) -> str:
    """The message of the refusal of ``body``, with ``path`` replaced by a placeholder."""
    with pytest.raises(ClientError) as caught:
        sm.create_training_job(**body)
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    return str(error["Message"]).replace(path, "<path>")


def script_job(name: str, program: str) -> dict[str, Any]:
    body = job(name, "")
    del body["AlgorithmSpecification"]["ContainerEntrypoint"]
    body["HyperParameters"] = {
        "sagemaker_program": json.dumps(program),
        "sagemaker_submit_directory": json.dumps("s3://data/code/sourcedir.tar.gz"),
    }
    return body


def test_an_entry_point_outside_the_source_archive_is_refused_by_its_form(
    server_home: Path, tmp_path: Path
) -> None:
    entry = tmp_path / "train.py"
    entry.write_text("print(1)\n")
    put(server_home, "data", "code/sourcedir.tar.gz", pack_entry_point(entry))
    srv = start_server()
    try:
        sm = client(srv)
        there = "../../../../../../../../etc/passwd"
        missing = "../../../../../../../../etc/no-such-file-here"
        said = refusal(sm, script_job("escape-there", there), there)
        assert said == refusal(sm, script_job("escape-missing", missing), missing)
        assert "HyperParameters sagemaker_program" in said
        assert "not a plain relative path" in said
    finally:
        srv.close()


@pytest.mark.parametrize("field_name", ["ContainerEntrypoint", "ContainerArguments"])
def test_a_host_path_is_refused_alike_whether_it_exists_or_not(
    server_home: Path, tmp_path: Path, field_name: str
) -> None:
    there = tmp_path / "operator-tool"
    there.write_text("#!/bin/sh\necho secret\n")
    there.chmod(0o755)
    missing = tmp_path / "no-such-tool"

    def body(name: str, path: Path) -> dict[str, Any]:
        out = job(name, "print(1)")
        algo = out["AlgorithmSpecification"]
        if field_name == "ContainerEntrypoint":
            algo["ContainerEntrypoint"] = [str(path)]
        else:
            algo["ContainerEntrypoint"] = ["python3", "-c", "print(1)"]
            algo["ContainerArguments"] = [str(path)]
        return out

    srv = start_server()
    try:
        sm = client(srv)
        said = refusal(sm, body("names-an-existing-file", there), str(there))
        assert said == refusal(sm, body("names-a-missing-file", missing), str(missing))
        assert f"AlgorithmSpecification.{field_name}[0]" in said
        assert "TRAINPORT_SERVER_ALLOW_HOST_PATHS" in said
    finally:
        srv.close()


def test_a_relative_image_name_is_never_a_folder_of_the_servers(
    server_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bare TrainingImage is an image's name: a folder of that name where the server runs
    changes nothing in the answer (and is never run)."""
    there = tmp_path / "cwd" / "probe-image"
    there.mkdir(parents=True)
    (there / "train").write_text("#!/bin/sh\necho from the server's folder\n")
    (there / "train").chmod(0o755)
    monkeypatch.chdir(there.parent)

    def body(name: str) -> dict[str, Any]:
        out = job(f"image-{name}", "")
        del out["AlgorithmSpecification"]["ContainerEntrypoint"]
        out["AlgorithmSpecification"]["TrainingImage"] = name
        out["HyperParameters"] = {}
        return out

    srv = start_server()
    try:
        sm = client(srv)
        if container.installed_engine(container_engine_setting()) is None:
            said = refusal(sm, body("probe-image"), "probe-image")
            assert said == refusal(sm, body("missing-image"), "missing-image")
            assert "AlgorithmSpecification.TrainingImage '<path>'" in said
        else:  # an engine would pull either name when its job starts: both fail alike
            reasons = []
            for name in ("probe-image", "missing-image"):
                sm.create_training_job(**body(name))
                ended = wait_for(sm, f"image-{name}", timeout=120)
                assert ended["TrainingJobStatus"] == "Failed"
                reasons.append(ended["FailureReason"].replace(name, "<path>"))
            assert reasons[0] == reasons[1]
            logs = Path(server_home) / "jobs" / "image-probe-image"
            said = "".join(p.read_text() for p in logs.rglob("*.log"))
            assert "from the server's folder" not in said
    finally:
        srv.close()
