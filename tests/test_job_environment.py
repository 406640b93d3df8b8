"""A job's environment is an allow-list: nothing of whoever started trainport reaches it,
and a job gets its role's credentials only where the operator mapped that role.

Written as an attacker would: the job prints everything it can see, and the test looks for
what the process that started it had.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import python_job, require, wait_for
from trainport.config import RoleCredentials, load_settings
from trainport.errors import ValidationError
from trainport.host.jobenv import SYSTEM_PATH, job_environment, job_path, role_environment
from trainport.jobs.service import JobService
from trainport.runners.sandbox import sandbox_problem

# What the starter of trainport has that a job must never see.
LEAKS = {
    "AWS_ACCESS_KEY_ID": "AKIASERVERSOWNKEY000",
    "AWS_SECRET_ACCESS_KEY": "the-servers-own-secret",
    "AWS_SESSION_TOKEN": "the-servers-own-token",
    "AWS_DEFAULT_REGION": "eu-west-9",
    "AWS_CA_BUNDLE": "/home/operator/ca.pem",
    "http_proxy": "http://proxy.internal:3128",
    "HTTPS_PROXY": "http://proxy.internal:3128",
    "PIP_INDEX_URL": "https://user:password@pypi.internal/simple",
    "VIRTUAL_ENV": "/home/operator/.venv",
    "SAGEMAKER_USER_CONFIG_OVERRIDE": "/home/operator/sagemaker.yaml",
    "SECRET_X": "s3cr3t-value-of-the-operator",
    "LD_LIBRARY_PATH": "/home/operator/lib",
    "TRAINPORT_SERVER_KEYS": "AKIDSERVER:server-secret",
}
# The base every job gets, the contract trainport adds, and what a shell or launcher in
# between may add of its own.
BASE = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONUNBUFFERED"}
BASE |= {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES"}
CONTRACT = {"TRAINING_JOB_NAME", "TRAINING_JOB_ARN", "SAGEMAKER_BASE_DIR"}
SHELL = {"PWD", "OLDPWD", "SHLVL", "_", "container"}

SHOW = "import json, os\nprint('ENV ' + json.dumps(dict(os.environ)), flush=True)\n"
ROLE = "arn:aws:iam::111122223333:role/trainer"
ROLE_KEYS = {
    "AccessKeyId": "AKIATRAINERROLE00001",
    "SecretAccessKey": "trainer-secret",
    "SessionToken": "trainer-token",
    "EndpointUrl": "http://127.0.0.1:9000",
    "Region": "us-west-2",
}


def runner_ok(runner: str) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")


def seen_env(service: JobService, name: str) -> dict[str, str]:
    record = wait_for(service, name)
    assert record.status == "Completed", (record.failure_reason, service.logs(name))
    for _, text in service.logs(name):
        if match := re.search(r"ENV (\{.*\})", text):
            return dict(json.loads(match.group(1)))
    raise AssertionError(f"the job printed no environment: {service.logs(name)}")


@pytest.fixture
def leaky(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process that runs trainport (and so each job's supervisor) has all of LEAKS."""
    for key, value in LEAKS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("HOME", "/home/operator")


def write_roles(home: Path, doc: Any) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "roles.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("runner", ["process", "sandbox"])
def test_a_job_sees_nothing_of_its_starters_environment(
    home: Path, leaky: None, runner: str
) -> None:
    runner_ok(runner)
    service = JobService(load_settings())
    body = python_job(f"env-{runner}", SHOW, Environment={"MINE": "the request's"})
    service.create(body, runner=runner)
    env = seen_env(service, f"env-{runner}")
    assert not set(LEAKS) & set(env), {k: env[k] for k in set(LEAKS) & set(env)}
    # The region names the job's ARN too; every other value must be nowhere.
    values = [v for k, v in LEAKS.items() if k != "AWS_DEFAULT_REGION"]
    assert not [v for v in values if v in json.dumps(env)], json.dumps(env)
    strangers = set(env) - BASE - CONTRACT - SHELL - {"MINE"}
    assert not strangers, {k: env[k] for k in strangers}
    assert env["MINE"] == "the request's" and env["TRAINING_JOB_NAME"] == f"env-{runner}"
    assert env["PATH"] == job_path() and env["LANG"] == "C.UTF-8"
    assert job_path() == f"{os.path.dirname(sys.executable)}:{SYSTEM_PATH}"
    # HOME is the job's own and writable, never the starter's.
    assert env["HOME"] != "/home/operator"
    if runner == "sandbox":
        assert env["HOME"] == "/root"
    else:
        assert env["HOME"].startswith(str(home / "jobs" / "env-process" / "hosts" / "algo-1"))


def test_a_mapped_role_gets_exactly_its_credentials(home: Path, leaky: None) -> None:
    write_roles(home, {ROLE: ROLE_KEYS})
    service = JobService(load_settings())
    service.create(python_job("env-role", SHOW, RoleArn=ROLE))
    env = seen_env(service, "env-role")
    aws = {k: v for k, v in env.items() if k.startswith("AWS_")}
    assert aws == {
        "AWS_ACCESS_KEY_ID": "AKIATRAINERROLE00001",
        "AWS_SECRET_ACCESS_KEY": "trainer-secret",
        "AWS_SESSION_TOKEN": "trainer-token",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_DEFAULT_REGION": "us-west-2",
    }


def test_an_unmapped_role_gets_no_credentials(home: Path, leaky: None) -> None:
    write_roles(home, {ROLE: ROLE_KEYS})
    service = JobService(load_settings())
    other = "arn:aws:iam::111122223333:role/someone-else"
    service.create(python_job("env-norole", SHOW, RoleArn=other))
    env = seen_env(service, "env-norole")
    assert not [k for k in env if k.startswith("AWS_")], env


def test_the_requests_own_keys_win_over_its_roles_as_a_set() -> None:
    role = RoleCredentials(
        (
            ("AWS_ACCESS_KEY_ID", "ROLE"),
            ("AWS_SECRET_ACCESS_KEY", "r"),
            ("AWS_SESSION_TOKEN", "t"),
            ("AWS_DEFAULT_REGION", "us-west-2"),
        )
    )
    mine = {"AWS_ACCESS_KEY_ID": "MINE", "AWS_SECRET_ACCESS_KEY": "m"}
    env = job_environment(request=mine, home="/root", interface="lo", credentials=role)
    assert env["AWS_ACCESS_KEY_ID"] == "MINE" and env["AWS_SECRET_ACCESS_KEY"] == "m"
    assert "AWS_SESSION_TOKEN" not in env  # the role's token would break the user's key
    assert env["AWS_DEFAULT_REGION"] == "us-west-2"
    assert role_environment(None, {}) == {}
    # A request that picks a locale keeps it whole.
    chosen = job_environment(request={"LANG": "de_DE.UTF-8"}, home="/root", interface="lo")
    assert chosen["LANG"] == "de_DE.UTF-8" and "LC_ALL" not in chosen


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "must be a JSON object"),
        ('{"trainer": {"AccessKeyId": "a", "SecretAccessKey": "b"}}', "is not a role ARN"),
        (json.dumps({ROLE: {"AccessKeyId": "a"}}), "SecretAccessKey missing"),
        (json.dumps({ROLE: {**ROLE_KEYS, "Password": "x"}}), "unknown field(s) Password"),
        (json.dumps({ROLE: {**ROLE_KEYS, "Region": 3}}), "Region must be a non-empty"),
        (json.dumps({ROLE: {**ROLE_KEYS, "EndpointUrl": "file:///etc"}}), "EndpointUrl"),
    ],
)
def test_a_malformed_roles_file_is_a_clear_error(home: Path, content: str, said: str) -> None:
    path = home / "roles.json"
    home.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(ValidationError) as caught:
        load_settings()
    assert str(path) in str(caught.value) and said in str(caught.value)


def test_a_missing_named_roles_file_fails_the_cli_at_start(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "roles.json"
    monkeypatch.setenv("TRAINPORT_ROLE_CREDENTIALS", str(missing))
    with pytest.raises(ValidationError, match="cannot read it"):
        load_settings()
    monkeypatch.setenv("TRAINPORT_ROLE_CREDENTIALS", str(write_roles(tmp_path, {ROLE: {}})))
    for command in (["jobs", "list"], ["server", "--port", "0"]):
        done = subprocess.run(
            [sys.executable, "-m", "trainport.cli", *command],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith("error: role credentials file "), done.stderr
        assert str(tmp_path / "roles.json") in done.stderr, done.stderr
        assert "AccessKeyId and SecretAccessKey missing" in done.stderr, done.stderr


def test_role_secrets_stay_out_of_settings_repr(home: Path) -> None:
    write_roles(home, {ROLE: ROLE_KEYS})
    settings = load_settings()
    assert settings.credentials_for(ROLE) is not None
    assert "trainer-secret" not in repr(settings)
