"""The runner contract: start one host's training command and let the agent signal it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trainport.errors import ValidationError

if TYPE_CHECKING:
    from trainport.runners.limits import Limits

__all__ = [
    "PROCESS_RUNNER_WARNING",
    "HostProcess",
    "Placement",
    "Runner",
    "pid_alive",
]

log = logging.getLogger(__name__)

# The PATH trainport finds its own tools on outside a sandbox: fixed, never a request's.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts: it is alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


PROCESS_RUNNER_WARNING = (
    "the process runner isolates nothing: a job runs as this user and can read and change "
    "whatever this user can, TRAINPORT_HOME (the store, the job database, the server's keys) "
    "and every other job included; use it only for code you trust"
)


@dataclass(frozen=True)
class Placement:
    """Everything a runner needs to start one host's training command."""

    root: Path  # the host's /opt/ml tree on disk
    hosts_file: Path  # what the job sees as /etc/hosts
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    # Folders no job may see (TRAINPORT_HOME), and folders under them whose entries a job
    # may use read-only (the requirements-environment cache).
    private: tuple[Path, ...] = field(default_factory=tuple)
    shared: tuple[Path, ...] = field(default_factory=tuple)
    netns: str | None = None  # the host's network namespace, in namespace-network mode
    hosts: tuple[str, ...] = ()  # every host of the job, each a name that must resolve
    limits: Limits | None = None  # the instance type's resources; None: the whole machine
    # Folders of a shared folder the command may write, at their own path: the cached
    # environment it builds (nothing else is ever writable but the job's own tree).
    writable: tuple[Path, ...] = ()


class HostProcess:
    """A started training command: its process group receives the signals."""

    def __init__(
        self, popen: subprocess.Popen[bytes], pgid: int, keep_open: IO[str] | None = None
    ) -> None:
        self.popen = popen
        self.pgid = pgid
        # A pipe the launcher writes to until it exits (bwrap's status fd): kept open so
        # the launcher never dies of SIGPIPE before reporting the exit code.
        self._keep_open = keep_open

    @property
    def stdout(self) -> IO[bytes]:
        assert self.popen.stdout is not None
        return self.popen.stdout

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, sig)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, with death by signal N reported as 128 + N (as containers do)."""
        code = self.popen.wait(timeout)
        if self._keep_open is not None:
            self._keep_open.close()
            self._keep_open = None
        return 128 - code if code < 0 else code

    def limit_reason(self) -> str | None:
        """Why the host ended, if a limit of its instance type ended it (its memory)."""
        return None

    def group_alive(self) -> bool:
        """Whether a process of the group still runs (zombies do not count: bubblewrap's
        PID-1 helper is left for the machine's init to reap, which may take seconds)."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _group_runs(self.pgid)


def _group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is not a zombie (True where /proc cannot tell)."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


class Runner(ABC):
    name: str

    @abstractmethod
    def base_dir(self, placement_root: Path) -> str:
        """Where the job sees its /opt/ml tree."""

    @abstractmethod
    def start(self, placement: Placement) -> HostProcess: ...

    def limit_notes(self, limits: Limits | None) -> list[str]:
        """What of the instance type's shape this runner does not enforce, to tell."""
        if limits is None:
            return []
        return [f"the instance type's limits ({limits.describe()}) are not enforced here"]

    def _popen(
        self,
        argv: list[str],
        placement: Placement,
        cwd: str | None = None,
        stdin: int = subprocess.DEVNULL,
        **kw: object,
    ) -> subprocess.Popen[bytes]:
        if placement.netns:
            # ip netns exec execs the command in place: the pid (and process group) stays
            # the training command's.
            ip = shutil.which("ip", path=SYSTEM_PATH) or "ip"
            argv = [ip, "netns", "exec", placement.netns, *argv]
        try:
            return subprocess.Popen(  # type: ignore[call-overload]
                argv,
                env=placement.env,
                cwd=cwd or placement.cwd,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **kw,
            )
        except FileNotFoundError as exc:
            raise ValidationError(
                f"cannot start the training command {placement.argv[0]!r}: {exc.strerror}. "
                "Check ContainerEntrypoint or the image directory"
            ) from exc
        except PermissionError as exc:
            raise ValidationError(
                f"the training command {placement.argv[0]!r} is not executable; chmod +x it"
            ) from exc


# Signals trainport forwards to the training process group.
TERM = signal.SIGTERM
KILL = signal.SIGKILL
