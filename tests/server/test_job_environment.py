"""A job sent to ``trainport server`` cannot read the server's keys from its environment:
the operator who started the server may well have them (or any cloud keys) exported."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tests.server.conftest import KEY_ID, SECRET, client, job, start_server, wait_for
from trainport.runners.sandbox import sandbox_problem
from trainport.server.app import TrainportServer

SHOW = "import json,os\nprint('ENV '+json.dumps(dict(os.environ)),flush=True)"


@pytest.fixture
def keyed_server(server_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TrainportServer]:
    """A server whose operator exported its own key pair (as its clients use it) and a
    cloud session, as a shell that also talks to AWS would have."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "operator-session-token")
    monkeypatch.setenv("https_proxy", "http://operator:pw@proxy.internal:3128")
    srv = start_server()
    yield srv
    srv.close()


@pytest.mark.parametrize("runner", ["sandbox", "process"])
def test_a_job_cannot_read_the_servers_keys(keyed_server: Any, runner: str) -> None:
    if runner == "sandbox":
        require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")
    sm = client(keyed_server)
    name = f"env-{runner}"
    sm.create_training_job(**job(name, SHOW, Tags=[{"Key": "trainport:runner", "Value": runner}]))
    described = wait_for(sm, name)
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    text = "\n".join(t for _, t in keyed_server.service.logs(name))
    found = re.search(r"ENV (\{.*\})", text)
    assert found, text
    env = json.loads(found.group(1))
    assert not [k for k in env if k.startswith("AWS_") or k.lower().endswith("_proxy")], env
    for secret in (KEY_ID, SECRET, "operator-session-token", "proxy.internal"):
        assert secret not in found.group(1)
