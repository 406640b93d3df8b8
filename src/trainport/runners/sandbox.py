"""The sandbox runner: carries out a :class:`~trainport.runners.plan.SandboxPlan`.

What the job sees is decided in :mod:`trainport.runners.plan`; this module only turns the
plan into a command line. Two ways:

- bubblewrap (``bwrap``), root or not: the plan's mounts map one to one onto its options.
  With ``--new-session`` the training command leads its own process group beneath bwrap's
  PID-1 helper; we read that helper's pid from ``--json-status-fd`` and signal its group,
  never bwrap itself (bwrap would die and leave the job running unwatched);
- as root, ``unshare`` (user, mount, PID and IPC namespaces) runs :mod:`.enter`, which
  builds the root from the plan, pivots into it, and starts the command under ``setpriv``
  with no capabilities and no_new_privs. It stays as the namespace's PID 1 and exits with
  the command's status; a stop reaches the command directly, in the same process group.
  ``unshare`` survives SIGTERM while its child runs and passes that status on.

``TRAINPORT_SANDBOX=unshare|bwrap`` forces one way.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from trainport.errors import SandboxError
from trainport.runners.api import HostProcess, Placement, Runner
from trainport.runners.plan import OPT_ML, HostView, MountKind, SandboxPlan, plan_sandbox

__all__ = ["SandboxRunner", "bwrap_options", "sandbox_problem", "unshare_argv", "unshare_plan"]

log = logging.getLogger(__name__)

# The unshare way's PID 1, run by path so that it imports nothing of trainport.
ENTER = Path(__file__).with_name("enter.py")


def _way() -> str:
    forced = os.environ.get("TRAINPORT_SANDBOX", "").lower()
    if forced in ("unshare", "bwrap"):
        return forced
    return "unshare" if os.geteuid() == 0 and shutil.which("unshare") else "bwrap"


@functools.cache
def _probe(way: str) -> str | None:
    """None if ``way`` can make the sandbox's namespaces here, else why not."""
    if way == "bwrap":
        if not shutil.which("bwrap"):
            return "bubblewrap (bwrap) is not installed"
        argv = ["bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"]
    else:
        if os.geteuid() != 0:
            return "namespaces without bubblewrap need root"
        if not shutil.which("setpriv"):
            return "setpriv (util-linux) is not installed"
        argv = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]} failed: {exc}"
    if done.returncode != 0:
        return (
            f"{argv[0]} cannot create a namespace: {done.stderr.decode(errors='replace').strip()}"
        )
    return None


def sandbox_problem() -> str | None:
    return _probe(_way())


def bwrap_options(plan: SandboxPlan, status_fd: int) -> list[str]:
    """bubblewrap's options for ``plan`` (given through ``--args``: bwrap's PID-1 helper
    keeps its command line, which every process in the sandbox can read)."""
    argv = ["--unshare-user", "--uid", str(plan.uid), "--gid", str(plan.uid)]
    argv += ["--unshare-pid", "--unshare-ipc", "--cap-drop", "ALL"]
    for cap in plan.capabilities:
        argv += ["--cap-add", cap]
    for m in plan.mounts:
        if m.kind is MountKind.RO_BIND:
            argv += ["--ro-bind", m.source, m.target]
        elif m.kind is MountKind.BIND:
            argv += ["--bind", m.source, m.target]
        elif m.kind is MountKind.DEV_BIND:
            argv += ["--dev-bind", m.source, m.target]
        elif m.kind is MountKind.SYMLINK:
            argv += ["--symlink", m.source, m.target]
        elif m.kind is MountKind.TMPFS:
            argv += ["--perms", m.source, "--tmpfs", m.target]
        elif m.kind is MountKind.PROC:
            argv += ["--proc", m.target]
        elif m.source == "dir":  # MASK
            argv += ["--tmpfs", m.target, "--remount-ro", m.target]
        else:
            argv += ["--ro-bind", "/dev/null", m.target]
    argv += ["--remount-ro", "/", "--chdir", plan.cwd, "--new-session"]
    argv += ["--json-status-fd", str(status_fd)]
    return argv


def unshare_plan(plan: SandboxPlan, new_root: Path) -> str:
    """What the ``unshare`` way's PID 1 reads on standard input (see :mod:`.enter`)."""
    mounts = [[m.kind.value, m.target, m.source] for m in plan.mounts]
    return json.dumps({"root": str(new_root), "mounts": mounts})


def unshare_argv(plan: SandboxPlan) -> list[str]:
    """The ``unshare`` command line for ``plan``; its mounts come on standard input."""
    argv = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
    argv += ["--pid", "--fork", "--kill-child", "--ipc", "--"]
    return [*argv, sys.executable, "-I", "-S", str(ENTER), plan.cwd, *plan.argv]


def _memfd(name: str, data: bytes) -> int:
    """A descriptor to read ``data`` from, for a child to inherit."""
    fd = os.memfd_create(name, 0)  # not close-on-exec: the child reads it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class SandboxRunner(Runner):
    name = "sandbox"

    def __init__(self) -> None:
        self.way = _way()

    def base_dir(self, placement_root: Path) -> str:
        return OPT_ML

    def plan(self, placement: Placement) -> SandboxPlan:
        plan = plan_sandbox(placement, HostView.probe(placement))
        for why in plan.refused:
            log.warning("not shown in the sandbox: %s", why)
        return plan

    def start(self, placement: Placement) -> HostProcess:
        plan = self.plan(placement)
        if self.way == "unshare":
            return self._start_unshare(plan, placement)
        return self._start_bwrap(plan, placement)

    def _start_unshare(self, plan: SandboxPlan, placement: Placement) -> HostProcess:
        # The new root is mounted over a folder beside the host's tree, in the sandbox's
        # own mount namespace: nothing appears there outside.
        new_root = placement.root.parent / f".{placement.root.name}.root"
        new_root.mkdir(exist_ok=True)
        plan_fd = _memfd("trainport-sandbox-plan", unshare_plan(plan, new_root).encode())
        try:
            popen = self._popen(unshare_argv(plan), placement, cwd="/", stdin=plan_fd)
        finally:
            os.close(plan_fd)
        return HostProcess(popen, popen.pid)

    def _start_bwrap(self, plan: SandboxPlan, placement: Placement) -> HostProcess:
        read_fd, write_fd = os.pipe()
        options = "".join(o + "\0" for o in bwrap_options(plan, write_fd))
        args_fd = _memfd("trainport-sandbox-args", options.encode())
        argv = ["bwrap", "--args", str(args_fd), "--", *plan.argv]
        try:
            popen = self._popen(argv, placement, cwd="/", pass_fds=(write_fd, args_fd))
        finally:
            os.close(write_fd)
            os.close(args_fd)
        status = os.fdopen(read_fd, "r")
        first = status.readline()
        try:
            child = int(json.loads(first)["child-pid"])
        except (ValueError, KeyError) as exc:
            status.close()
            popen.wait()
            out = popen.stdout.read().decode(errors="replace") if popen.stdout else ""
            raise SandboxError(f"bubblewrap did not start the job: {out.strip()}") from exc
        return HostProcess(popen, child, keep_open=status)
