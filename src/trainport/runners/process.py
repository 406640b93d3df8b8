"""The process runner: no isolation, the job's tree stays where it is on disk.

**It isolates nothing, by design.** The job runs as the user trainport runs as and can read
and change whatever that user can: TRAINPORT_HOME (the store, the job database, the
server's keys) and every other job included. It is for code you trust; the server refuses
it unless its operator opts in (``TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER=1``).

Code written for SageMaker finds its tree through ``SAGEMAKER_BASE_DIR`` and the ``SM_*``
variables; code that hard-codes ``/opt/ml`` needs the sandbox runner.

Host names: every name in ``hosts`` must resolve for every process of a job (the toolkit
waits 15 minutes for them; collectives are set up by name), without touching the machine's
``/etc/hosts``. Where the machine allows, the command starts in a mount namespace whose one
change is the job's hosts file bound over ``/etc/hosts`` (root: ``unshare --mount``; else
an unprivileged user namespace that keeps the real uid), so it still sees FUSE mounts, FIFOs
and everything else as it is. Where no namespace can be made, a multi-host job fails at
once saying so; a single-host job runs, with a warning: most single-host code never looks
its own name up, and refusing it would leave such machines with no runner at all.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from trainport.errors import SandboxError
from trainport.runners.api import SYSTEM_PATH, HostProcess, Placement, Runner

__all__ = ["ProcessRunner", "hosts_namespace_argv", "hosts_namespace_problem"]

log = logging.getLogger(__name__)

# $0 is the hosts file; exec keeps the pid (and process group) the training command's.
# The tools by their system path: the request's PATH is the command's, not the launcher's.
_BIND_HOSTS = '"$0" --bind "$1" /etc/hosts && shift && exec "$@"'


def _tool(name: str) -> str:
    return shutil.which(name, path=SYSTEM_PATH) or name


def hosts_namespace_argv(way: str, hosts_file: Path) -> list[str]:
    """The prefix that runs a command with ``hosts_file`` as its /etc/hosts."""
    unshare = _tool("unshare")
    if way == "root":
        argv = [unshare, "--mount", "--propagation", "private"]
    else:
        argv = [unshare, "--user", "--map-current-user", "--mount", "--propagation", "private"]
    return [*argv, "--", _tool("sh"), "-c", _BIND_HOSTS, _tool("mount"), str(hosts_file)]


@functools.cache
def _hosts_way() -> tuple[str | None, str | None]:
    """(way, None) for the way this machine can give a command its own /etc/hosts, or
    (None, why not)."""
    if not shutil.which("unshare", path=SYSTEM_PATH):
        return None, "unshare (util-linux) is not installed"
    way = "root" if os.geteuid() == 0 else "user"
    probe = [*hosts_namespace_argv(way, Path("/etc/hosts")), "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"unshare failed: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        return None, f"no mount namespace can be made here ({why})"
    return way, None


def hosts_namespace_problem() -> str | None:
    return _hosts_way()[1]


class ProcessRunner(Runner):
    name = "process"

    def base_dir(self, placement_root: Path) -> str:
        return str(placement_root)

    def start(self, placement: Placement) -> HostProcess:
        way, problem = _hosts_way()
        argv = list(placement.argv)
        if way is not None:
            argv = hosts_namespace_argv(way, placement.hosts_file) + argv
        elif len(placement.hosts) > 1:
            raise SandboxError(
                f"the hosts {', '.join(placement.hosts)} cannot be made to resolve under the "
                f"process runner on this machine: {problem}. Run as root, allow unprivileged "
                "user namespaces, or use the sandbox runner"
            )
        else:
            log.warning(
                "algo-1 will not resolve inside this job: %s; code that looks its host "
                "name up needs root, user namespaces or the sandbox runner",
                problem,
            )
        popen = self._popen(argv, placement)
        return HostProcess(popen, popen.pid)
