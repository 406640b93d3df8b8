"""FastFile mode: a read-only, lazily fetched file view of an S3Prefix channel, over FUSE.

The channel's folder (``/opt/ml/input/data/<channel>``) becomes a FUSE mount whose tree is
the channel's object list (each object at its key relative to the prefix, as in File mode),
known from one listing before training starts. Nothing is downloaded up front: a read of
one file fetches byte ranges of that object only, in blocks that grow while a reader reads
sequentially (so a whole-file read costs a few large requests) and stay small after a seek
(so a seek costs one small ranged read). Objects are immutable for the job's life, so the
kernel may cache pages and attributes.

FUSE needs ``/dev/fuse``, libfuse 2 (Debian: ``libfuse2``, ``fuse`` for ``fusermount``) and
the ``fusepy`` package. Where any is missing, or the mount fails, :func:`mount_channel`
raises :class:`FastFileUnavailable` saying why, and the host agent stages the channel in
File mode instead and says so in the job's status message.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainport.errors import JobError
from trainport.host.channels import ChannelObject
from trainport.store.api import ObjectStore

__all__ = [
    "FastFileMount",
    "FastFileUnavailable",
    "fuse_problem",
    "mount_channel",
    "mounts_under",
    "unmount",
    "unmount_under",
]

log = logging.getLogger(__name__)

_MIN_BLOCK = 1 << 20
_MAX_BLOCK = 16 << 20


class FastFileUnavailable(JobError):
    """FUSE cannot serve this channel here; the message says why."""


def _fuse_module() -> Any:
    import fuse  # fusepy; raises OSError when libfuse is not installed

    return fuse


def fuse_problem() -> str | None:
    """None if FUSE mounts can work on this machine, else why not."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (in a container, pass --device /dev/fuse)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    try:
        _fuse_module()
    except ImportError:
        return "the fusepy package is not installed (pip install fusepy)"
    except OSError as exc:
        return f"libfuse is not installed (apt-get install libfuse2 fuse): {exc}"
    if os.geteuid() != 0 and not shutil.which("fusermount"):
        return "fusermount is not installed (apt-get install fuse)"
    return None


class _OpenObject:
    """One open file: reads served from the last fetched block of its object."""

    def __init__(self, store: ObjectStore, obj: ChannelObject) -> None:
        self.store = store
        self.obj = obj
        self.lock = threading.Lock()
        self.start = 0
        self.data = b""
        self.block = _MIN_BLOCK

    def read(self, size: int, offset: int) -> bytes:
        with self.lock:
            end = min(offset + size, self.obj.size)
            if offset >= end:
                return b""
            if not (self.start <= offset and end <= self.start + len(self.data)):
                sequential = offset == self.start + len(self.data)
                self.block = min(self.block * 2, _MAX_BLOCK) if sequential else _MIN_BLOCK
                fetch_end = min(self.obj.size, max(end, offset + self.block))
                self.data = self.store.read_range(self.obj.bucket, self.obj.key, offset, fetch_end)
                self.start = offset
            rel = offset - self.start
            return self.data[rel : rel + (end - offset)]


def _operations_class() -> type:
    fuse = _fuse_module()
    operations: Any = fuse.Operations

    class ChannelFS(operations):
        use_ns = True  # times in nanoseconds (fusepy's float seconds are deprecated)

        def __init__(self, store: ObjectStore, objects: Sequence[ChannelObject]) -> None:
            self.store = store
            self.files = {"/" + o.rel_path: o for o in objects}
            self.dirs: dict[str, set[str]] = {"/": set()}
            for path in self.files:
                parts = path.strip("/").split("/")
                for depth, name in enumerate(parts):
                    parent = "/" + "/".join(parts[:depth])
                    self.dirs.setdefault(parent, set()).add(name)
            self.handles: dict[int, _OpenObject] = {}
            self.next_fh = 1
            self.handles_lock = threading.Lock()  # not `lock`: that is a FUSE operation
            self.now = time.time_ns()

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            base = {"st_uid": os.getuid(), "st_gid": os.getgid(), "st_mtime": self.now}
            base["st_atime"] = base["st_ctime"] = self.now
            if path in self.dirs:
                return {**base, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2}
            obj = self.files.get(path)
            if obj is None:
                raise fuse.FuseOSError(errno.ENOENT)
            return {**base, "st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": obj.size}

        def readdir(self, path: str, fh: int) -> list[str]:
            if path not in self.dirs:
                raise fuse.FuseOSError(errno.ENOTDIR)
            return [".", "..", *sorted(self.dirs[path])]

        def open(self, path: str, flags: int) -> int:
            obj = self.files.get(path)
            if obj is None:
                raise fuse.FuseOSError(errno.ENOENT)
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC):
                raise fuse.FuseOSError(errno.EROFS)
            with self.handles_lock:
                fh = self.next_fh
                self.next_fh += 1
                self.handles[fh] = _OpenObject(self.store, obj)
            return fh

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            handle = self.handles.get(fh)
            if handle is None:
                raise fuse.FuseOSError(errno.EBADF)
            try:
                return handle.read(size, offset)
            except Exception as exc:
                log.error("FastFile read of %s failed: %s", path, exc)
                raise fuse.FuseOSError(errno.EIO) from exc

        def release(self, path: str, fh: int) -> int:
            with self.handles_lock:
                self.handles.pop(fh, None)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    return ChannelFS


class FastFileMount:
    """A mounted channel view; :meth:`close` unmounts it."""

    def __init__(self, mountpoint: Path, thread: threading.Thread, label: str) -> None:
        self.mountpoint = mountpoint
        self.thread = thread
        self.label = label

    def close(self, timeout: float = 10.0) -> None:
        if os.path.ismount(self.mountpoint):
            unmount(self.mountpoint)
        self.thread.join(timeout)
        _ignore_sigpipe()
        log.info("%s: FastFile view unmounted", self.label)


def unmount(mountpoint: Path) -> None:
    """Unmount a FastFile view, lazily if a process still has a file of it open."""
    argv = ["fusermount", "-u", str(mountpoint)]
    if os.geteuid() == 0 or not shutil.which("fusermount"):
        argv = ["umount", str(mountpoint)]
    done = subprocess.run(argv, capture_output=True, timeout=30)
    if done.returncode != 0:
        # A process outside the job still has a file open: detach lazily.
        lazy = ["umount", "-l"] if argv[0] == "umount" else ["fusermount", "-uz"]
        subprocess.run([*lazy, str(mountpoint)], capture_output=True, timeout=30)


def _unescape(field: str) -> str:
    """A mountinfo field as the path it names (the kernel writes space as \\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts_under(mountinfo: str, root: Path) -> list[Path]:
    """The FUSE mount points at or below ``root`` in ``mountinfo`` (the text of
    /proc/self/mountinfo), deepest first so that nested ones go before their parents."""
    top = str(root).rstrip("/")
    found: set[Path] = set()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if "-" not in fields[6:]:
            continue  # not a mountinfo line
        fstype = fields[fields.index("-", 6) + 1]
        point = _unescape(fields[4])
        if fstype.startswith("fuse") and (point == top or point.startswith(top + "/")):
            found.add(Path(point))
    return sorted(found, key=lambda p: (-len(p.parts), str(p)))


def unmount_under(root: Path) -> list[Path]:
    """Unmount every FUSE mount left at or below ``root``, also those whose daemon died
    (which ``os.path.ismount`` cannot see: stat fails on them); returns them."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    left = mounts_under(text, Path(os.path.realpath(root)))
    for mountpoint in left:
        unmount(mountpoint)
    return left


def _ignore_sigpipe() -> None:
    """Put SIGPIPE back to ignored, as Python keeps it: libfuse's teardown resets it to the
    default (terminate), which would let any later write to a closed pipe or socket kill
    this process. Through libc, because ``signal.signal`` works only in the main thread."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(signal.SIGPIPE, 1)  # 1 is SIG_IGN
    except (OSError, AttributeError) as exc:  # pragma: no cover - not on glibc/musl
        log.warning("could not restore SIGPIPE to ignored: %s", exc)


def mount_channel(
    store: ObjectStore,
    objects: Sequence[ChannelObject],
    mountpoint: Path,
    *,
    label: str,
    timeout: float = 10.0,
) -> FastFileMount:
    """Mount the read-only view of ``objects`` at ``mountpoint`` (created, must be empty)."""
    problem = fuse_problem()
    if problem:
        raise FastFileUnavailable(problem)
    fuse = _fuse_module()
    mountpoint.mkdir(parents=True, exist_ok=True)
    ops = _operations_class()(store, objects)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            fuse.FUSE(
                ops,
                str(mountpoint),
                foreground=True,
                ro=True,
                # As root the job runs as a uid of its own, which a FUSE mount refuses
                # unless it allows others (read-only, 0444, whatever the uid).
                **({"allow_other": True} if os.geteuid() == 0 else {}),
                nothreads=False,
                fsname=f"trainport-fastfile:{label}",
                kernel_cache=True,
                entry_timeout=3600,
                attr_timeout=3600,
                max_read=1 << 20,
            )
        except BaseException as exc:  # reported to the mounting thread below
            failure.append(exc)

    thread = threading.Thread(target=serve, name=f"fastfile-{label}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if failure or not thread.is_alive():
            why = f"{failure[0]!r}" if failure else "fuse_main returned"
            raise FastFileUnavailable(f"the FUSE mount at {mountpoint} failed: {why}")
        if time.monotonic() > deadline:
            raise FastFileUnavailable(f"the FUSE mount at {mountpoint} did not appear in time")
        time.sleep(0.02)
    log.info("%s: FastFile view of %d objects mounted at %s", label, len(objects), mountpoint)
    return FastFileMount(mountpoint, thread, label)
