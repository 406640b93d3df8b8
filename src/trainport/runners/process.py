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

# $0 is mount, $1 the hosts file, $2 the host's name, $3 the host's tree ("" to leave /opt/ml
# alone); exec keeps the pid (and process group) the training command's. The tools by their
# system path: the request's PATH is the command's, not the launcher's.
_BIND_HOSTS = (
    '"$0" --bind "$1" /etc/hosts && hostname "$2" && '
    '{ [ -z "$3" ] || "$0" --bind "$3" /opt/ml; } && shift 3 && exec "$@"'
)
OPT_ML = "/opt/ml"


def _tool(name: str) -> str:
    return shutil.which(name, path=SYSTEM_PATH) or name


def hosts_namespace_argv(
    way: str, hosts_file: Path, hostname: str = "localhost", tree: Path | None = None
) -> list[str]:
    """The prefix that runs a command with ``hosts_file`` as its /etc/hosts, ``hostname``
    as its host name (a UTS namespace of its own) and, given ``tree``, the host's tree at
    /opt/ml, so code that hard-codes /opt/ml finds its files, FIFOs included."""
    unshare = _tool("unshare")
    if way == "root":
        argv = [unshare, "--mount", "--uts", "--propagation", "private"]
    else:
        argv = [unshare, "--user", "--map-current-user", "--mount", "--uts"]
        argv += ["--propagation", "private"]
    where = str(tree) if tree is not None else ""
    return [
        *argv,
        "--",
        _tool("sh"),
        "-c",
        _BIND_HOSTS,
        _tool("mount"),
        str(hosts_file),
        hostname,
        where,
    ]


def _opt_ml_mountpoint(way: str) -> bool:
    """Whether /opt/ml can take a host's tree: it exists, or (as root) is made, empty, once;
    a bind mount needs a folder to cover."""
    if os.path.isdir(OPT_ML) and not os.path.islink(OPT_ML):
        return True
    if way != "root" or os.path.lexists(OPT_ML):
        return False
    try:
        os.makedirs(OPT_ML, mode=0o755, exist_ok=True)
    except OSError as exc:
        log.info("no /opt/ml for the process runner's jobs: %s", exc)
        return False
    return True


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
            tree = placement.root if _opt_ml_mountpoint(way) else None
            name = placement.root.name if placement.root.name in placement.hosts else "localhost"
            argv = hosts_namespace_argv(way, placement.hosts_file, name, tree) + argv
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
