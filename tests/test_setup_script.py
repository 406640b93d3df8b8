"""scripts/apt-install.sh (used by scripts/setup.sh) waits for another apt instead of failing.

Another apt is played by a process holding apt's locks the way apt itself does (fcntl
record locks on its lock files) until the script says it is waiting for them; only then
are they released, and the script must go on to finish without a lock error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "apt-install.sh"

_HOLDER = """
import fcntl, sys
held = [open(p, "a") for p in sys.argv[1:]]
for f in held:
    fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes it
"""


@pytest.fixture
def apt() -> None:
    require(os.geteuid() == 0, "installing packages with apt-get needs root")
    require(shutil.which("apt-get") is not None, "apt-get is not installed (not Debian-like)")


@pytest.fixture
def hold_locks() -> Iterator[list[subprocess.Popen[str]]]:
    holders: list[subprocess.Popen[str]] = []
    yield holders
    for holder in holders:
        holder.kill()
        holder.wait()


def _hold(holders: list[subprocess.Popen[str]], *locks: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, *locks],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    holders.append(holder)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def _install_releasing(holder: subprocess.Popen[str], *packages: str) -> tuple[int, str]:
    """Run the script; release ``holder``'s locks once it says it waits. Its exit and stderr."""
    env = {**os.environ, "TRAINPORT_APT_WAIT_SECONDS": "300"}
    script = subprocess.Popen(
        [str(SCRIPT), *packages],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert script.stderr is not None and holder.stdin is not None
    said = []
    for line in script.stderr:  # ends when the script does
        said.append(line)
        if WAITING in line:
            holder.stdin.close()
            assert holder.wait(timeout=60) == 0
    return script.wait(timeout=600), "".join(said)


WAITING = "another apt or dpkg is running; waiting up to 300 s"


def test_install_waits_for_the_dpkg_lock(
    apt: None, hold_locks: list[subprocess.Popen[str]]
) -> None:
    holder = _hold(hold_locks, "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")
    code, stderr = _install_releasing(holder, "bash")  # installed: apt needs only the lock
    assert WAITING in stderr
    assert "/var/lib/dpkg/lock-frontend" in stderr  # the note says what it waits for
    assert code == 0, stderr
    assert holder.poll() == 0


def test_update_waits_for_the_package_lists_lock(
    apt: None, hold_locks: list[subprocess.Popen[str]]
) -> None:
    holder = _hold(hold_locks, "/var/lib/apt/lists/lock")
    # A package no list holds: the install fails, so the script updates the lists (held
    # by the other apt) and tries again, failing on the package, not on the lock.
    code, stderr = _install_releasing(holder, "trainport-no-such-package")
    assert WAITING in stderr
    assert "/var/lib/apt/lists/lock" in stderr
    assert code == 1
    after_wait = stderr.split(WAITING)[-1].split("\n", 1)[-1]
    assert "Could not get lock" not in after_wait
    assert "Unable to lock" not in after_wait
    assert holder.poll() == 0
