"""The ``unshare`` way's PID 1: builds a sandbox's root from its plan and runs the command.

Run by path (``python -I -S enter.py CWD COMMAND...``) inside fresh user, mount, PID and IPC
namespaces, as their root; it imports nothing of trainport and nothing outside the standard
library, so it starts in a few milliseconds. The plan comes as JSON on standard input, not
as arguments, because every process in the sandbox can read PID 1's command line: ``root``
(where to build the new root) and ``mounts`` (``[kind, target, source]`` in order, as
:class:`trainport.runners.plan.Mount` has them).

It mounts with the system calls directly (one ``mount(8)`` per entry cost more than the
rest of a job's start), pivots into the new root, and starts the command under ``setpriv``
with no capabilities and no_new_privs. It stays as PID 1: the command's signals reach it
directly through its process group, PID 1 only waits, reaps, and exits with the command's
status (128 + N for death by signal N).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import platform
import re
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# Flags a remount must keep: a mount made outside the user namespace has them locked.
KEPT = 1 | 2 | 4 | 8 | 16 | 64 | 1024 | 2048 | 4096  # ST_* are MS_* on Linux
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode() if data else None),
        f"mount {source} on {target}",
    )  # fmt: skip


def mount_points_under(target: str) -> list[str]:
    """Mount points at or below ``target``, from this namespace's table."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            # Spaces and the like are written as octal escapes (\040).
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point == target or point.startswith(target.rstrip("/") + "/"):
                found.append(point)
    return found


def read_only(target: str) -> None:
    """``target`` and everything mounted below it read-only, keeping their locked flags."""
    for point in mount_points_under(target):
        kept = os.statvfs(point).f_flag & KEPT
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | kept
        mount("none", point, None, flags)


def place(target: str, source: str) -> None:
    """Make the mount point: a folder for a folder, an empty file for anything else."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.lexists(target):
        open(target, "w").close()  # an empty mount point


def build(root: str, mounts: list[list[str]]) -> None:
    mount("trainport-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for kind, target, source in mounts:
        where = root + target
        if kind in ("ro-bind", "bind", "dev-bind"):
            place(where, source)
            mount(source, where, None, MS_BIND | MS_REC)
            if kind == "ro-bind":
                read_only(where)
        elif kind == "symlink":
            os.makedirs(os.path.dirname(where), exist_ok=True)
            os.symlink(source, where)
        elif kind == "tmpfs":
            os.makedirs(where, exist_ok=True)
            mount("trainport", where, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={source}")
        elif kind == "proc":
            os.makedirs(where, exist_ok=True)
            mount("proc", where, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif kind == "mask" and source == "dir":
            mount("trainport-mask", where, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755")
        elif kind == "mask":
            mount("/dev/null", where, None, MS_BIND)
        else:
            raise ValueError(f"unknown mount kind {kind!r}")


def pivot(root: str) -> None:
    os.chdir(root)
    os.mkdir(".old")
    number = PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {platform.machine()}")
    _check(libc.syscall(number, b".", b".old"), "pivot_root")
    _check(libc.umount2(b"/.old", MNT_DETACH), "umount /.old")
    os.rmdir("/.old")
    mount("none", "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/")


def main() -> int:
    cwd, argv = sys.argv[1], sys.argv[2:]
    plan = json.load(sys.stdin)
    try:
        build(plan["root"], plan["mounts"])
        pivot(plan["root"])
        os.chdir(cwd)
    except OSError as exc:
        print(f"trainport sandbox: {exc}", file=sys.stderr, flush=True)
        return 126
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        # A handler, not SIG_IGN: exec resets it, so the command gets its signals as usual.
        signal.signal(sig, lambda *_: None)
    child = os.fork()
    if child == 0:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        caps = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
        try:
            os.execvp("setpriv", ["setpriv", "--no-new-privs", *caps, "--", *argv])
        except OSError as exc:
            print(f"trainport sandbox: cannot start setpriv: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
    while True:  # reap everything; the command's end is the sandbox's
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child:
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
