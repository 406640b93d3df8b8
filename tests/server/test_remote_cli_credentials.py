"""Which key ``trainport --endpoint`` signs with: real ``trainport`` subprocesses against a
real server, with the user's AWS variables and a proxy set as many machines have them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import KEY_ID, SECRET, start_server

TRAINPORT = [sys.executable, "-m", "trainport.cli"]


class _Listener:
    """A socket that counts who connects to it: a dead proxy, or instance metadata."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


@pytest.fixture
def traps() -> Iterator[tuple[_Listener, _Listener]]:
    proxy, metadata = _Listener(), _Listener()
    yield proxy, metadata
    proxy.sock.close()
    metadata.sock.close()


def _env(home: Path, traps: tuple[_Listener, _Listener], **extra: str) -> dict[str, str]:
    """The user's AWS credentials and a proxy set; instance metadata at a socket we watch."""
    proxy, metadata = traps
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "TRAINPORT_")) and k.lower() not in ("no_proxy",)
    }
    env.update(
        TRAINPORT_HOME=str(home),
        AWS_ACCESS_KEY_ID="AKIAUSERSOWNAWSKEY01",
        AWS_SECRET_ACCESS_KEY="the-users-own-aws-secret",
        HTTP_PROXY=proxy.url,
        HTTPS_PROXY=proxy.url,
        http_proxy=proxy.url,
        https_proxy=proxy.url,
        AWS_EC2_METADATA_SERVICE_ENDPOINT=metadata.url,
        AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{metadata.url}/creds",
        AWS_SHARED_CREDENTIALS_FILE=str(home / "no-such-aws-credentials"),
        AWS_CONFIG_FILE=str(home / "no-such-aws-config"),
    )
    env.update(extra)
    return env


def tp(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRAINPORT, *args], capture_output=True, text=True, timeout=120, env=env)


def _clean(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr


def test_the_server_on_this_home_is_signed_with_its_own_key(
    server_home: Path, monkeypatch: pytest.MonkeyPatch, traps: Any
) -> None:
    monkeypatch.delenv("TRAINPORT_SERVER_KEYS")  # the server makes its key file
    srv = start_server()
    try:
        done = tp(_env(server_home, traps), "--endpoint", srv.url, "jobs", "list")
    finally:
        srv.close()
    _clean(done)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("NAME")
    proxy, metadata = traps
    assert (proxy.connections, metadata.connections) == (0, 0)


def test_elsewhere_without_a_trainport_key_is_one_clear_line(
    server: Any, tmp_path: Path, traps: Any
) -> None:
    done = tp(_env(tmp_path / "elsewhere", traps), "--endpoint", server.url, "jobs", "list")
    _clean(done)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "TRAINPORT_ACCESS_KEY_ID" in done.stderr and "--aws-credentials" in done.stderr
    assert traps[1].connections == 0


def test_trainport_variables_or_profile_sign_from_elsewhere(
    server: Any, tmp_path: Path, traps: Any
) -> None:
    elsewhere = tmp_path / "elsewhere"
    keyed = _env(
        elsewhere, traps, TRAINPORT_ACCESS_KEY_ID=KEY_ID, TRAINPORT_SECRET_ACCESS_KEY=SECRET
    )
    done = tp(keyed, "--endpoint", server.url, "jobs", "list")
    _clean(done)
    assert done.returncode == 0, done.stderr

    credentials = tmp_path / "aws-credentials"
    credentials.write_text(
        "[default]\naws_access_key_id = AKIAOTHER\naws_secret_access_key = other\n"
        f"[trainport]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
    )
    profiled = _env(elsewhere, traps, AWS_SHARED_CREDENTIALS_FILE=str(credentials))
    done = tp(profiled, "--endpoint", server.url, "jobs", "list")
    _clean(done)
    assert done.returncode == 0, done.stderr

    half = _env(elsewhere, traps, TRAINPORT_ACCESS_KEY_ID=KEY_ID)
    done = tp(half, "--endpoint", server.url, "jobs", "list")
    assert done.returncode == 2 and "TRAINPORT_SECRET_ACCESS_KEY is not set" in done.stderr
    assert traps[1].connections == 0


def test_aws_credentials_only_when_asked(server: Any, tmp_path: Path, traps: Any) -> None:
    elsewhere = tmp_path / "elsewhere"
    # The user's own AWS key is not the server's: said in one line, naming where it came from.
    done = tp(_env(elsewhere, traps), "--endpoint", server.url, "--aws-credentials", "jobs", "list")
    _clean(done)
    assert done.returncode == 2
    assert "AKIAUSERSOWNAWSKEY01 (your AWS credentials)" in done.stderr, done.stderr

    asked = _env(elsewhere, traps, AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET)
    done = tp(asked, "--endpoint", server.url, "--aws-credentials", "jobs", "list")
    _clean(done)
    assert done.returncode == 0, done.stderr

    # None anywhere: the chain ends without asking instance metadata.
    bare = _env(elsewhere, traps)
    del bare["AWS_ACCESS_KEY_ID"], bare["AWS_SECRET_ACCESS_KEY"]
    done = tp(bare, "--endpoint", server.url, "--aws-credentials", "jobs", "list")
    _clean(done)
    assert done.returncode == 2 and "no AWS credentials found" in done.stderr, done.stderr
    assert traps[1].connections == 0
