"""What a sandbox holds: the pure decision, read by tests and by every way of running it.

A job's code is untrusted, so its sandbox is built from an allow-list, never by hiding a
deny-list of trainport folders: a fresh root holds only

- the system's read-only folders the training code needs (``/usr``, the ``/lib*`` folders,
  part of ``/sys``);
- of ``/etc``, only an allow-list of what programs read (name resolution, TLS
  certificates, the dynamic loader's cache, pip's and Open MPI's configuration, ...), each
  entry read-only, plus ``passwd``, ``group`` and ``hostname`` written for the job: a key
  or password file an operator keeps in ``/etc`` is never there;
- the interpreter trainport runs script mode with (``sys.prefix`` and ``sys.base_prefix``),
  trainport's own package (the training-side libraries), and the cached requirements
  environment the job uses, each read-only and each exactly that folder;
- what the request names to run (an image folder, the entry point's files), read-only;
- the job's own tree at ``/opt/ml`` (its FIFOs and FastFile mounts inside), writable, and its
  hosts file at ``/etc/hosts``;
- a private ``/tmp``, a minimal ``/dev`` (plus GPU device nodes), and a ``/proc`` of its own
  PID namespace.

Nothing inside a *private* folder (``TRAINPORT_HOME``: the store, the database, the keys,
every job) is ever mounted, nor a folder that holds one, except the named entries of a
*shared* folder under it (the requirements cache).

The job runs in its own user, mount, PID, IPC and UTS namespaces (its hostname is its host
name) as uid 0 of its user namespace, with no capabilities and no_new_privs. That uid 0 is
not the machine's root: outside it is the job's own unprivileged identity (a uid of a range
kept for jobs when trainport runs as root, the invoking user otherwise), so kernel
settings, mounts and setuid bits give it nothing on the machine.

:func:`plan_sandbox` is a pure function of the placement and a :class:`HostView` (the facts
about this machine it needs, gathered once by :meth:`HostView.probe`); the command line
that carries the plan out is built at the edge, in :mod:`trainport.runners.sandbox`, so a
container or remote runner can carry out the same plan its own way.
"""

from __future__ import annotations

import glob
import os
import posixpath
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from trainport.runners.api import Placement

__all__ = ["HostView", "Mount", "MountKind", "SandboxPlan", "plan_sandbox"]

OPT_ML = "/opt/ml"

# Read-only system folders a training process may need. /sys comes in parts: its cgroup,
# security and debug file systems are mounted below it and must not come along.
SYSTEM_DIRS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/sys/devices",
    "/sys/bus",
    "/sys/class",
    "/sys/dev",
)
# What of /etc programs read: name resolution, TLS roots, the loader, locale and time zone,
# the links of update-alternatives (/usr/bin/* often point there), pip's and Open MPI's
# configuration, shells' start files. An allow-list: whatever else an operator keeps in
# /etc (keys, tokens, shadow files) stays outside.
ETC_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "ethertypes",
    "fonts",
    "gai.conf",
    "host.conf",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "openmpi",
    "os-release",
    "pip.conf",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "resolv.conf",
    "rpc",
    "services",
    "ssl",
    "terminfo",
    "timezone",
    "xdg",
)
# /etc files written for the job: its own identity's entries, nothing of the machine's.
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\nnogroup:x:65534:\n"
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)
GPU_DEVICE_PATTERNS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*", "/dev/kfd")


class MountKind(StrEnum):
    """One entry of the sandbox's root, applied in plan order."""

    RO_BIND = "ro-bind"  # a folder or file, read-only, with what is mounted below it
    BIND = "bind"  # read-write (the job's own tree only)
    DEV_BIND = "dev-bind"  # a device node
    SYMLINK = "symlink"  # source is the link's text (merged-/usr systems' /bin etc.)
    TMPFS = "tmpfs"  # an empty private folder; source is its mode
    PROC = "proc"  # the PID namespace's own /proc
    MASK = "mask"  # hides a host file or folder that an earlier mount brought in
    FILE = "file"  # a file written for the job (source is its text), read-only inside


@dataclass(frozen=True)
class Mount:
    kind: MountKind
    target: str
    source: str = ""


@dataclass(frozen=True)
class SandboxPlan:
    """Everything one sandboxed host is: its root, its namespaces, its privileges."""

    mounts: tuple[Mount, ...]
    argv: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    hostname: str = ""
    namespaces: tuple[str, ...] = ("user", "mount", "pid", "ipc", "uts")
    uid: int = 0  # inside the user namespace; the real uid outside
    capabilities: tuple[str, ...] = ()
    no_new_privs: bool = True
    refused: tuple[str, ...] = ()  # paths the request named that stay outside, and why

    def sources(self) -> list[str]:
        """Every host path the sandbox shows (for tests and logs)."""
        return [
            m.source
            for m in self.mounts
            if m.kind in (MountKind.RO_BIND, MountKind.BIND, MountKind.DEV_BIND)
        ]


@dataclass(frozen=True)
class HostView:
    """The facts about this machine a plan depends on."""

    # System folders that exist: path -> symlink text, or "" for a real folder.
    system: dict[str, str]
    etc: tuple[str, ...]  # the ETC_ENTRIES that exist, as paths
    gpu_devices: tuple[str, ...]
    interpreter: tuple[str, ...]  # sys.prefix, sys.base_prefix (resolved), deduplicated
    package: str  # the folder of the trainport package the job may import
    existing: frozenset[str] = field(default_factory=frozenset)  # request paths that exist
    folders: frozenset[str] = field(default_factory=frozenset)  # those that are folders

    @classmethod
    def probe(cls, placement: Placement) -> HostView:
        system = {}
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                system[path] = os.readlink(path)
            elif os.path.isdir(path):
                system[path] = ""
        etc = tuple(f"/etc/{e}" for e in ETC_ENTRIES if os.path.exists(f"/etc/{e}"))
        gpus = sorted({p for pat in GPU_DEVICE_PATTERNS for p in glob.glob(pat)})
        prefixes = []
        for prefix in (sys.prefix, sys.base_prefix):
            real = os.path.realpath(prefix)
            for p in (os.path.abspath(prefix), real):
                if p not in prefixes:
                    prefixes.append(p)
        import trainport

        package = os.path.dirname(os.path.realpath(trainport.__file__))
        named = list(request_paths(placement))
        existing = frozenset(p for p in named if os.path.exists(p))
        folders = frozenset(p for p in existing if os.path.isdir(p))
        return cls(system, etc, tuple(gpus), tuple(prefixes), package, existing, folders)


def request_paths(placement: Placement) -> Iterable[str]:
    """Absolute host paths the command names: its argv and its cwd.

    The folders on its PATH are not among them (the caller's PATH may name a home
    folder's tools): only those inside a shared folder, the job's cached environment."""
    yield from (a for a in placement.argv if a.startswith("/"))
    if placement.cwd.startswith("/"):
        yield placement.cwd
    for entry in placement.env.get("PATH", "").split(os.pathsep):
        if any(_inside(entry, str(s)) for s in placement.shared):
            yield entry


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _covered(path: str, mounted: list[str]) -> bool:
    return any(_inside(path, m) for m in mounted)


def plan_sandbox(placement: Placement, host: HostView) -> SandboxPlan:
    """The sandbox of one host: pure, so a test can read exactly what a job will see."""
    private = [os.path.normpath(str(p)) for p in placement.private]
    shared = [os.path.normpath(str(p)) for p in placement.shared]
    mounts: list[Mount] = []
    mounted: list[str] = []  # host paths shown at the same path
    refused: list[str] = []

    def show(path: str, why: str) -> None:
        path = posixpath.normpath(path)
        if _covered(path, mounted) or _inside(path, OPT_ML):
            return
        for folder in shared:
            if _inside(path, folder) and path != folder:
                # Exactly the entry of the shared folder in use (one cached environment).
                entry = posixpath.join(folder, path[len(folder) :].lstrip("/").split("/")[0])
                if entry not in mounted:
                    mounts.append(Mount(MountKind.RO_BIND, entry, entry))
                    mounted.append(entry)
                return
        if any(_inside(path, p) or _inside(p, path) for p in private):
            # The platform's own folders, or one that holds them (a home folder that
            # holds TRAINPORT_HOME): never inside, whatever the request names.
            refused.append(f"{path} ({why}: trainport's private files)")
            return
        mounts.append(Mount(MountKind.RO_BIND, path, path))
        mounted.append(path)

    for path, link in host.system.items():
        if link:
            mounts.append(Mount(MountKind.SYMLINK, path, link))
        else:
            mounts.append(Mount(MountKind.RO_BIND, path, path))
            mounted.append(path)
    for entry in host.etc:
        mounts.append(Mount(MountKind.RO_BIND, entry, entry))
        mounted.append(entry)
    hostname = _hostname(placement)
    mounts += [
        Mount(MountKind.FILE, "/etc/passwd", PASSWD),
        Mount(MountKind.FILE, "/etc/group", GROUP),
        Mount(MountKind.FILE, "/etc/hostname", f"{hostname}\n"),
    ]
    home = _private_home(placement.env.get("HOME", ""), host)
    if home:
        # Tools write to ~ (caches, configs): as in a container, the job's home is its own,
        # empty and writable, made before anything is shown inside it (an interpreter
        # under /root).
        mounts.append(Mount(MountKind.TMPFS, home, "0700"))
    wanted = [(p, "the interpreter") for p in host.interpreter]
    wanted.append((host.package, "trainport's package"))
    # What the request runs: its image folder or entry point's files. A missing path needs
    # nothing (the command fails inside as it would on its own machine).
    for path in request_paths(placement):
        # An argument names a file to run or read; only the working folder (an image
        # folder) or a cached environment is shown whole, never a folder an argument names.
        whole = path == placement.cwd or any(_inside(path, str(s)) for s in placement.shared)
        if path in host.existing and (whole or path not in host.folders):
            wanted.append((path, "named by the request"))
    # Folders before what lies in them: a folder mounted over a mount hides it.
    for path, why in sorted(wanted, key=lambda w: posixpath.normpath(w[0]).count("/")):
        show(path, why)
    for folder in placement.writable:
        path = posixpath.normpath(str(folder))
        if any(posixpath.dirname(path) == s for s in shared):
            mounts.append(Mount(MountKind.BIND, path, path))
            mounted.append(path)
        else:
            refused.append(f"{path} (to write: only an entry of a shared folder may be)")
    mounts += [
        Mount(MountKind.TMPFS, "/tmp", "1777"),
        Mount(MountKind.TMPFS, "/dev", "0755"),
        *(Mount(MountKind.DEV_BIND, d, d) for d in DEVICES),
        *(Mount(MountKind.SYMLINK, f"/dev/{n}", t) for n, t in DEV_LINKS),
        Mount(MountKind.TMPFS, "/dev/shm", "1777"),
        *(Mount(MountKind.DEV_BIND, d, d) for d in host.gpu_devices),
        Mount(MountKind.PROC, "/proc"),
        Mount(MountKind.BIND, OPT_ML, str(placement.root)),
        Mount(MountKind.RO_BIND, "/etc/hosts", str(placement.hosts_file)),
    ]
    # The request's files may lie under /tmp or /dev: shown after those are made empty.
    late = [m for m in mounts if m.kind in (MountKind.RO_BIND, MountKind.BIND) and _late(m.target)]
    mounts = [m for m in mounts if m not in late] + late
    return SandboxPlan(
        mounts=tuple(mounts),
        argv=placement.argv,
        cwd=placement.cwd,
        env=placement.env,
        hostname=hostname,
        refused=tuple(refused),
    )


def _hostname(placement: Placement) -> str:
    """The host's own name (algo-k), as SageMaker's containers answer gethostname()."""
    name = placement.root.name
    return name if name in placement.hosts or not placement.hosts else placement.hosts[0]


def _private_home(home: str, host: HostView) -> str:
    """The job's home folder to make empty and writable, or "" to leave it alone (one the
    system folders or the sandbox's own mounts already provide)."""
    if not home.startswith("/"):
        return ""
    home = posixpath.normpath(home)
    taken = [*host.system, OPT_ML, "/tmp", "/dev", "/proc"]
    return "" if home == "/" or any(_inside(home, t) for t in taken) else home


def _late(target: str) -> bool:
    return _inside(target, "/tmp") or _inside(target, "/dev")
