"""The sandbox runner: the job's tree appears at the real ``/opt/ml`` in a mount namespace.

Two ways to make the namespace:

- as root, ``unshare --mount`` and bind mounts, then ``exec`` of the training command, so the
  process trainport started *is* the training process (true exit code, signals go straight
  to its group);
- otherwise bubblewrap (``bwrap``), with ``--new-session`` so the training command leads its
  own process group and bwrap stays alive to report its exit code; we read the child's pid
  from ``--json-status-fd`` and signal that group, never bwrap itself (bwrap would die and
  leave the job running unwatched).

In both, the job also gets its own ``/etc/hosts`` (so ``algo-1`` resolves) and empty
folders over trainport's job and store folders, so two jobs never see each other's files.
``TRAINPORT_SANDBOX=unshare|bwrap`` forces one way.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

from trainport.errors import SandboxError
from trainport.runners.api import HostProcess, Placement, Runner

__all__ = ["SandboxRunner", "sandbox_problem"]

OPT_ML = "/opt/ml"

_UNSHARE_SCRIPT = r"""
set -e
root="$1"; hosts="$2"; cwd="$3"; shift 3
mkdir -p /opt/ml
mount --rbind "$root" /opt/ml
mount --bind "$hosts" /etc/hosts
while [ "$1" != "--" ]; do mount -t tmpfs -o size=1m,mode=0755 trainport-hidden "$1"; shift; done
shift
cd "$cwd"
exec "$@"
"""


def _way() -> str:
    forced = os.environ.get("TRAINPORT_SANDBOX", "").lower()
    if forced in ("unshare", "bwrap"):
        return forced
    return "unshare" if os.geteuid() == 0 and shutil.which("unshare") else "bwrap"


@functools.cache
def _probe(way: str) -> str | None:
    """None if ``way`` can make a namespace here, else why not."""
    if way == "bwrap":
        if not shutil.which("bwrap"):
            return "bubblewrap (bwrap) is not installed"
        argv = ["bwrap", "--dev-bind", "/", "/", "true"]
    else:
        if os.geteuid() != 0:
            return "mount namespaces without bubblewrap need root"
        argv = ["unshare", "--mount", "--propagation", "private", "true"]
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


class SandboxRunner(Runner):
    name = "sandbox"

    def __init__(self) -> None:
        self.way = _way()

    def base_dir(self, placement_root: Path) -> str:
        return OPT_ML

    def start(self, placement: Placement) -> HostProcess:
        if self.way == "unshare":
            return self._start_unshare(placement)
        return self._start_bwrap(placement)

    def _start_unshare(self, placement: Placement) -> HostProcess:
        hidden = [str(p) for p in placement.hide if p.is_dir()]
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            _UNSHARE_SCRIPT,
            "trainport-sandbox",
            str(placement.root),
            str(placement.hosts_file),
            placement.cwd,
            *hidden,
            "--",
            *placement.argv,
        ]
        popen = self._popen(argv, placement, cwd="/")
        return HostProcess(popen, popen.pid)

    def _start_bwrap(self, placement: Placement) -> HostProcess:
        argv = ["bwrap", "--dev-bind", "/", "/"]
        if not Path(OPT_ML).exists() and os.geteuid() != 0:
            # bwrap cannot create /opt/ml on the real disk without root: put a tmpfs on
            # /opt and bind back what was there.
            argv += ["--tmpfs", "/opt"]
            for entry in sorted(Path("/opt").iterdir()) if Path("/opt").is_dir() else []:
                argv += ["--bind", str(entry), str(entry)]
        argv += ["--bind", str(placement.root), OPT_ML]
        argv += ["--ro-bind", str(placement.hosts_file), "/etc/hosts"]
        for hidden in placement.hide:
            if hidden.is_dir():
                argv += ["--tmpfs", str(hidden)]
        read_fd, write_fd = os.pipe()
        argv += ["--chdir", placement.cwd, "--new-session", "--json-status-fd", str(write_fd)]
        argv += ["--", *placement.argv]
        try:
            popen = self._popen(argv, placement, cwd="/", pass_fds=(write_fd,))
        finally:
            os.close(write_fd)
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
