"""Hostile or careless input refused at submission with one line: a stop grace that is not
a finite number, a YAML alias bomb, a checkpoint folder no container engine can mount."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import request
from trainport.config import load_settings
from trainport.errors import ValidationError
from trainport.jobs.service import JobService
from trainport.spec import parse_request
from trainport.yamldoc import load_yaml

TRAINPORT = [sys.executable, "-m", "trainport.cli"]


def tp(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=timeout)


def grace(value: str) -> dict[str, Any]:
    return request("grace", Tags=[{"Key": "trainport:stop-grace-seconds", "Value": value}])


# -- the stop grace is a finite number of seconds in range -----------------------------------


@pytest.mark.parametrize("value", ["inf", "-inf", "Infinity", "nan", "-1", "1e9", "soon", ""])
def test_a_stop_grace_that_is_not_a_finite_number_in_range_is_refused(value: str) -> None:
    with pytest.raises(ValidationError, match=r"trainport:stop-grace-seconds=.* from 0 to 3600"):
        parse_request(grace(value))


@pytest.mark.parametrize("value", ["0", "2.5", "3600"])
def test_a_stop_grace_in_range_is_taken(value: str) -> None:
    assert parse_request(grace(value)).stop_grace_seconds == float(value)


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_the_stop_grace_setting_must_be_finite(value: str) -> None:
    with pytest.raises(ValidationError, match="TRAINPORT_STOP_GRACE_SECONDS"):
        load_settings({"TRAINPORT_STOP_GRACE_SECONDS": value})


def test_tags_from_the_cli_reach_the_request_and_are_checked(home: Path, tmp_path: Path) -> None:
    entry = tmp_path / "train.py"
    entry.write_text("print('tagged')\n")
    refused = tp("run", "--entry-point", str(entry), "--tag", "trainport:stop-grace-seconds=nan")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: Tags: trainport:stop-grace-seconds='nan' must be a number of seconds from 0 to 3600"
    ]
    done = tp("run", "--name", "tagged", "--entry-point", str(entry),
              "--tag", "team=vision", "--tag", "trainport:stop-grace-seconds=3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    tags = JobService(load_settings()).get("tagged").request["Tags"]
    assert {"Key": "team", "Value": "vision"} in tags
    assert {"Key": "trainport:stop-grace-seconds", "Value": "3"} in tags


# -- a YAML alias bomb is refused in one line ------------------------------------------------


def alias_bomb(levels: int = 9) -> str:
    """Each level repeats the one before nine times: 9**levels strings from ~700 bytes."""
    text = 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for level in range(1, levels):
        text += f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]\n"
    return text


def test_a_job_file_alias_bomb_is_refused_in_one_line(home: Path, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "TrainingJobName: bomb\n"
        + alias_bomb()
        + "HyperParameters: {x: *l8}\n"
        + "AlgorithmSpecification: {ContainerEntrypoint: [python3, -c, pass]}\n"
    )
    done = tp("run", str(bomb))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[:2000]
    assert lines[0].startswith(f"error: the job file {bomb} repeats YAML aliases"), lines[0]
    assert "Traceback" not in done.stderr and len(lines[0]) < 400


def test_a_node_that_holds_itself_is_refused() -> None:
    with pytest.raises(ValidationError, match="repeats YAML aliases"):
        load_yaml("HyperParameters: &h {again: *h}\n", "the job file x.yaml")


def test_a_few_aliases_still_load() -> None:
    text = (
        "a: &source {S3DataType: S3Prefix, S3Uri: 's3://b/p/'}\nb: *source\nc: [*source, *source]\n"
    )
    doc = load_yaml(text, "the job file x.yaml")
    assert doc["b"] == doc["c"][1] == {"S3DataType": "S3Prefix", "S3Uri": "s3://b/p/"}


def test_a_selection_spec_alias_bomb_is_refused(tmp_path: Path) -> None:
    from trainport.select.spec import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(alias_bomb() + "epochs: *l8\n")
    with pytest.raises(ValidationError, match=f"spec {spec} repeats YAML aliases"):
        load_spec(spec)


# -- a checkpoint folder with a colon ------------------------------------------------------


def test_a_colon_in_the_checkpoint_local_path_is_refused_at_submission() -> None:
    body = request(
        "colon", CheckpointConfig={"S3Uri": "s3://ck/p", "LocalPath": "/opt/ml/check:points"}
    )
    with pytest.raises(ValidationError, match=r"CheckpointConfig\.LocalPath .* holds a ':'"):
        parse_request(body)
