"""The sandbox runner: carries out a :class:`~trainport.runners.plan.SandboxPlan` in an
established runtime.

What the job sees is decided in :mod:`trainport.runners.plan`; this module turns the plan
into a runtime's input and starts it. Two ways:

- as root, **runc** with a generated OCI bundle (:mod:`trainport.runners.oci`): uid 0
  inside is one unprivileged uid of the range kept for jobs outside, the host's tree
  belongs to that uid (0700), the instance type's memory, CPUs and processes are enforced
  by cgroups, a seccomp filter and masked ``/proc`` paths apply, and the host joins its
  job's network namespace. ``tini`` is the namespace's init; its process group is the one
  the agent signals (SIGTERM is passed on to the command's group, SIGKILL ends the whole
  PID namespace).
- not as root, **bubblewrap** (``bwrap``) run as the invoking user: uid 0 inside is that
  user outside, so the job has no more than the person who started trainport. Without
  root there are no cgroups to enforce limits with and no network namespaces to give a
  job; both are said at the job's start.

Whatever a request names reaches only the inside: the runtimes are found on a fixed PATH,
run with a fixed environment, argv and working folder; the job's environment is given to
the runtime as data (OCI ``process.env``, bwrap's ``--clearenv --setenv``).

``TRAINPORT_SANDBOX=runc|bwrap`` forces one way (bwrap is refused as root, where it would
make the job's root the machine's root).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from trainport.errors import SandboxError
from trainport.runners.api import SYSTEM_PATH, HostProcess, Placement, Runner, pid_alive
from trainport.runners.limits import Limits, job_uid, memory_outcome
from trainport.runners.oci import oci_config
from trainport.runners.plan import OPT_ML, HostView, MountKind, SandboxPlan, plan_sandbox

__all__ = [
    "LAUNCHER_ENV",
    "SandboxRunner",
    "bwrap_options",
    "give_tree",
    "remove_left_containers",
    "sandbox_problem",
    "sweep_orphans",
]

log = logging.getLogger(__name__)

# The environment and PATH of every process trainport starts outside a sandbox: fixed,
# never the request's nor the caller's.
LAUNCHER_ENV = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
# runc's state for trainport's containers, apart from any other runc user's (podman).
RUNC_STATE = "/run/trainport-runc"
_SEQUENCE = itertools.count()


def system_tool(name: str) -> str | None:
    """``name`` found on the fixed system PATH, never on a caller's."""
    return shutil.which(name, path=SYSTEM_PATH)


def _way() -> str:
    forced = os.environ.get("TRAINPORT_SANDBOX", "").lower()
    if forced in ("runc", "bwrap"):
        return forced
    return "runc" if os.geteuid() == 0 else "bwrap"


@functools.cache
def _probe(way: str) -> str | None:
    """None if ``way`` can make a sandbox here, else why not."""
    if way == "bwrap":
        if os.geteuid() == 0:
            return (
                "bubblewrap run by root would make the job's root the machine's root; as root "
                "the sandbox runs in runc"
            )
        bwrap = system_tool("bwrap")
        if not bwrap:
            return "bubblewrap (bwrap) is not installed"
        argv = [bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "true"]
    else:
        if os.geteuid() != 0:
            return "runc needs root; without it the sandbox is bubblewrap"
        missing = [t for t in ("runc", "tini") if not system_tool(t)]
        if missing:
            return f"{' and '.join(missing)} not installed (apt-get install runc tini)"
        return _probe_runc_once()
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, env=LAUNCHER_ENV)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]} failed: {exc}"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()
        return f"{argv[0]} cannot create a namespace: {why}"
    return None


def _probe_key() -> str:
    """What a successful probe holds for: this boot (kernel, settings) and these binaries."""
    parts = [Path("/proc/sys/kernel/random/boot_id").read_text().strip()]
    for tool in ("runc", "tini"):
        path = system_tool(tool) or tool
        info = os.stat(path)
        parts.append(f"{path}:{info.st_size}:{info.st_mtime_ns}")
    return "\n".join(parts)


def _probe_runc_once() -> str | None:
    """The probe's verdict, remembered in runc's state folder (a tmpfs: gone at reboot) once
    it has passed: every ``trainport`` command asks, and a container costs ~70 ms."""
    remembered = Path(RUNC_STATE) / "probe-passed"
    try:
        key = _probe_key()
    except OSError:
        key = ""
    with contextlib.suppress(OSError):
        if key and remembered.read_text() == key:
            return None
    problem = _probe_runc()
    if problem is None and key:
        with contextlib.suppress(OSError):
            Path(RUNC_STATE).mkdir(mode=0o711, exist_ok=True)
            remembered.write_text(key)
    return problem


def _probe_runc() -> str | None:
    """Run ``true`` in a minimal container of the kind jobs get (user namespace included)."""
    import tempfile

    from trainport.runners.plan import Mount

    with tempfile.TemporaryDirectory(prefix="trainport-probe-") as tmp:
        root = Path(tmp) / "hosts" / "algo-1"
        root.mkdir(parents=True)
        mounts = [Mount(MountKind.RO_BIND, "/usr", "/usr"), Mount(MountKind.PROC, "/proc")]
        mounts.append(Mount(MountKind.TMPFS, "/dev", "0755"))
        mounts += [Mount(MountKind.SYMLINK, p, f"usr{p}") for p in ("/bin", "/lib", "/lib64")]
        plan = SandboxPlan(mounts=tuple(mounts), argv=("/usr/bin/true",), cwd="/", env={})
        try:
            process = _RuncStart(plan, root, None, None).start()
            code = process.wait(timeout=30)
            out = process.stdout.read().decode(errors="replace").strip()
        except (OSError, SandboxError, subprocess.TimeoutExpired) as exc:
            return f"runc cannot start a container here: {exc}"
    return None if code == 0 else f"runc cannot start a container here: {out or code}"


def sandbox_problem() -> str | None:
    return _probe(_way())


def give_tree(root: Path, uid: int, mode: int = 0o700) -> None:
    """Make the host's tree ``uid``'s, its top folder ``mode`` (private to it by default),
    never following a link and never entering another file system (a FastFile mount)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        device = os.fstat(fd).st_dev
        os.fchown(fd, uid, uid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    for folder, dirs, files in os.walk(root):
        for name in list(dirs):
            path = os.path.join(folder, name)
            if os.lstat(path).st_dev != device:
                dirs.remove(name)  # a mount point: its file system answers for itself
                continue
            os.chown(path, uid, uid, follow_symlinks=False)
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)


def bwrap_options(plan: SandboxPlan, status_fd: int, files: dict[str, str]) -> list[str]:
    """bubblewrap's options for ``plan`` (given through ``--args``: bwrap's PID-1 helper
    keeps its command line, which every process in the sandbox can read)."""
    argv = ["--unshare-user", "--uid", str(plan.uid), "--gid", str(plan.uid)]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--cap-drop", "ALL"]
    if plan.hostname:
        argv += ["--hostname", plan.hostname]
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
        elif m.kind is MountKind.FILE:
            argv += ["--ro-bind", files[m.target], m.target]
        elif m.source == "dir":  # MASK
            argv += ["--tmpfs", m.target, "--remount-ro", m.target]
        else:
            argv += ["--ro-bind", "/dev/null", m.target]
    argv += ["--remount-ro", "/", "--chdir", plan.cwd, "--new-session", "--clearenv"]
    for key, value in plan.env.items():
        argv += ["--setenv", key, value]
    argv += ["--json-status-fd", str(status_fd)]
    return argv


def _launch(argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """A runtime started as trainport starts every process outside a sandbox: fixed
    environment and folder, its output (and the job's) on one pipe, a session of its own."""
    return subprocess.Popen(
        argv,
        env=LAUNCHER_ENV,
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=pass_fds,
    )


def _memfd(name: str, data: bytes) -> int:
    """A descriptor to read ``data`` from, for a child to inherit."""
    fd = os.memfd_create(name, 0)  # not close-on-exec: the child reads it
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_files(plan: SandboxPlan, folder: Path) -> dict[str, str]:
    """The plan's generated files, written under ``folder``: target -> host path."""
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for m in plan.mounts:
        if m.kind is MountKind.FILE:
            path = folder / m.target.strip("/").replace("/", "_")
            path.write_text(m.source)
            path.chmod(0o644)
            written[m.target] = str(path)
    return written


class RuncProcess(HostProcess):
    """A job host in a runc container: ``popen`` is ``runc run``, the process group is
    tini's. Its end reads the memory limit's verdict, then removes the container."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        init_pid: int,
        container: str,
        limits: Limits | None,
    ) -> None:
        super().__init__(popen, init_pid)
        self.container = container
        self.limits = limits
        self._ended = False
        self._limit_reason: str | None = None

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._finish()
        return code

    def limit_reason(self) -> str | None:
        return self._limit_reason

    def _finish(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.limits is not None:
            self._limit_reason = memory_outcome(_cgroup(self.container), self.limits)
        _remove_container(self.container)


def _container_prefix(root: Path) -> str:
    """What every runc container of the host whose tree is ``root`` is named from."""
    return f"tp-{hashlib.sha256(str(root).encode()).hexdigest()[:10]}-"


def remove_left_containers(roots: list[Path]) -> list[str]:
    """Remove the runc containers a dead supervisor left for the hosts whose trees are
    ``roots`` (stopped already, or killed here), with their cgroups and bundles; their
    names."""
    runc = system_tool("runc")
    if runc is None or os.geteuid() != 0 or not Path(RUNC_STATE).is_dir():
        return []
    prefixes = tuple(_container_prefix(root) for root in roots)
    removed = []
    for entry in os.listdir(RUNC_STATE):
        if entry.startswith(prefixes):
            _remove_container(entry)
            removed.append(entry)
    return removed


def sweep_orphans() -> list[str]:
    """Remove the runc containers whose starter is gone (a supervisor or a Ray worker
    killed before it could delete them): their names carry the starter's pid."""
    entries: set[str] = set()
    for folder in (Path(RUNC_STATE), Path(RUNC_STATE) / "bundles"):
        with contextlib.suppress(OSError):
            entries.update(e for e in os.listdir(folder) if e.startswith("tp-"))
    removed = []
    for entry in sorted(entries):
        try:
            starter = int(entry.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid_alive(starter):
            continue
        _remove_container(entry)
        removed.append(entry)
    return removed


def _cgroup(container: str) -> str:
    return f"/trainport/{container}"


def _remove_container(container: str) -> None:
    """The container gone (killed if it still runs), with runc's record and its bundle."""
    if (Path(RUNC_STATE) / container).exists():
        runc = system_tool("runc") or "runc"
        subprocess.run(
            [runc, "--root", RUNC_STATE, "delete", "--force", container],
            capture_output=True,
            env=LAUNCHER_ENV,
            timeout=60,
        )
    shutil.rmtree(_bundle(container), ignore_errors=True)


def _bundle(container: str) -> Path:
    # Outside the job's tree and TRAINPORT_HOME: runc mounts the root from inside the user
    # namespace, as the job's uid, which must be able to reach it.
    return Path(RUNC_STATE) / "bundles" / container


# The network part of /sys (interfaces, their queues) from a sysfs mounted inside the
# host's namespace, over the machine's, in a mount namespace of runc's own: the /sys the
# job is shown then names its host's interfaces only. The rest of /sys (and the cgroup
# mounts runc needs) stays.
_NET_SYSFS = """set -e
view=$(mktemp -d /run/trainport-runc/sysfs.XXXXXX)
mount -t sysfs sysfs "$view"
mount --bind "$view/class/net" /sys/class/net
mount --bind "$view/devices/virtual/net" /sys/devices/virtual/net
umount -l "$view"
rmdir "$view"
exec "$@"
"""


def _in_netns(netns: str) -> list[str]:
    """The prefix that starts runc in ``netns`` with that namespace's view of /sys."""
    return [
        system_tool("nsenter") or "nsenter",
        f"--net=/run/netns/{netns}",
        "--",
        system_tool("unshare") or "unshare",
        "--mount",
        "--propagation",
        "slave",
        "--",
        system_tool("sh") or "/bin/sh",
        "-c",
        _NET_SYSFS,
        "sh",
    ]


class _RuncStart:
    """One container's bundle and start (the edge of :func:`oci_config`)."""

    def __init__(
        self,
        plan: SandboxPlan,
        root: Path,
        limits: Limits | None,
        netns: str | None,
        writable: tuple[Path, ...] = (),
    ) -> None:
        self.plan = plan
        self.writable = writable
        self.root = root
        self.limits = limits
        self.netns = netns
        self.container = f"{_container_prefix(root)}{os.getpid()}-{next(_SEQUENCE)}"
        self.bundle = _bundle(self.container)

    def start(self) -> RuncProcess:
        for left in sweep_orphans():
            log.info("removed the sandbox %s, whose starter is gone", left)
        uid = job_uid(self.root)
        give_tree(self.root, uid)
        for folder in self.writable:  # a cached environment, for every later job to read
            give_tree(folder, uid, 0o755)
        shutil.rmtree(self.bundle, ignore_errors=True)
        for folder in (Path(RUNC_STATE), self.bundle.parent, self.bundle):
            folder.mkdir(exist_ok=True)
            folder.chmod(0o711)
        rootfs = self.bundle / "rootfs"
        rootfs.mkdir()
        for m in self.plan.mounts:  # runc makes /dev's own links
            if m.kind is MountKind.SYMLINK and not m.target.startswith("/dev/"):
                link = rootfs / m.target.lstrip("/")
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(m.source)
        # runc, inside the user namespace, makes the mount points: the root is the job's.
        os.chown(rootfs, uid, uid)
        files = _write_files(self.plan, self.bundle / "files")
        init = system_tool("tini") or "/usr/bin/tini"
        netns_path = f"/run/netns/{self.netns}" if self.netns else None
        config = oci_config(
            self.plan,
            uid=uid,
            init=init,
            files=files,
            cgroup=_cgroup(self.container),
            limits=self.limits,
            netns_path=netns_path,
        )
        (self.bundle / "config.json").write_text(json.dumps(config))
        pid_file = self.bundle / "init.pid"
        runc = system_tool("runc") or "runc"
        argv = [runc, "--root", RUNC_STATE, "run", "--keep", "--bundle", str(self.bundle)]
        argv += ["--pid-file", str(pid_file), self.container]
        if self.netns:
            argv = [*_in_netns(self.netns), *argv]
        # runc goes with the thread that started it (a supervisor's host, a Ray worker's
        # actor), and with runc its container (tini -p): nothing trains unowned.
        argv = [system_tool("setpriv") or "setpriv", "--pdeathsig", "KILL", "--", *argv]
        popen = _launch(argv)
        init_pid = self._init_pid(popen, pid_file)
        return RuncProcess(popen, init_pid, self.container, self.limits)

    def _init_pid(self, popen: subprocess.Popen[bytes], pid_file: Path) -> int:
        deadline = time.monotonic() + 60
        delay = 0.001
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                return int(pid_file.read_text())
            if popen.poll() is not None:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        else:
            popen.kill()
        popen.wait()
        out = popen.stdout.read().decode(errors="replace").strip() if popen.stdout else ""
        _remove_container(self.container)
        raise SandboxError(f"runc did not start the job: {out or f'exit {popen.returncode}'}")


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

    def limit_notes(self, limits: Limits | None) -> list[str]:
        if self.way == "runc" or limits is None:
            return []
        return [
            f"the instance type's limits ({limits.describe()}) are not enforced: the "
            "sandbox's cgroups need root"
        ]

    def start(self, placement: Placement) -> HostProcess:
        plan = self.plan(placement)
        if self.way == "runc":
            return _RuncStart(
                plan, placement.root, placement.limits, placement.netns, placement.writable
            ).start()
        if self.way == "bwrap" and os.geteuid() == 0:
            raise SandboxError(_probe("bwrap") or "bubblewrap cannot run as root")
        return self._start_bwrap(plan, placement)

    def _start_bwrap(self, plan: SandboxPlan, placement: Placement) -> HostProcess:
        files = _write_files(plan, placement.root.parent / f".{placement.root.name}.etc")
        read_fd, write_fd = os.pipe()
        options = "".join(o + "\0" for o in bwrap_options(plan, write_fd, files))
        args_fd = _memfd("trainport-sandbox-args", options.encode())
        argv = [system_tool("bwrap") or "bwrap", "--args", str(args_fd), "--", *plan.argv]
        try:
            popen = _launch(argv, pass_fds=(write_fd, args_fd))
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
