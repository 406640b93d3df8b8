"""Reading and removing a job's tree without following the links its job made.

Whatever the platform reads or copies out of a host's ``/opt/ml`` tree (the failure file,
checkpoints, the model and output folders) may have been replaced by the job with a
symbolic link to a host file, which the platform, outside the sandbox and often as root,
would otherwise follow. Every path here is opened one component at a time with
``O_NOFOLLOW``, from ``/``: trainport's own folders are real paths (``TRAINPORT_HOME`` is
resolved when settings are read), so a link anywhere on the way was made by a job.

What is opened is then used through its descriptor (``/proc/self/fd/N`` names the opened
object itself), so a link swapped in after the check changes nothing. Links *inside* a
folder that is archived stay links in the archive, as they always were: nothing follows
them.

Removing works the same way (:func:`remove_tree`, :func:`remove_at`): each folder is opened
without following links and emptied through its descriptor (``unlinkat``, ``rmdir`` with
``dir_fd``), so a link the job made is removed, never what it names, and a mount point
(a FastFile view) is left as it is. At most two descriptors are open at a time, however
deep the job made its tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "fd_path",
    "open_folder",
    "open_nofollow",
    "read_text",
    "remove_at",
    "remove_tree",
    "walk",
]

log = logging.getLogger(__name__)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_nofollow(path: Path, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``path`` opened with ``flags``; ``OSError`` (ELOOP, ENOTDIR) if any
    component is a symbolic link. The last component is opened non-blocking, so a FIFO
    put where a file was expected cannot hang the caller."""
    parts = Path(os.path.abspath(path)).parts
    fd = os.open("/", _DIR)
    try:
        for part in parts[1:-1]:
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        last = parts[-1] if len(parts) > 1 else "."
        return os.open(last, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def fd_path(fd: int) -> Path:
    """A path that names the open object ``fd`` itself, whatever its name is now."""
    return Path(f"/proc/self/fd/{fd}")


@contextlib.contextmanager
def open_folder(path: Path) -> Iterator[Path | None]:
    """``path`` as a folder reached without links, named by its descriptor; None if it is
    missing, a link, or not a folder."""
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield None
        return
    try:
        yield fd_path(fd)
    finally:
        os.close(fd)


def read_text(path: Path, limit: int) -> str | None:
    """The first ``limit`` characters of the regular file ``path``; None if it is missing,
    reached through a link, or not a regular file."""
    try:
        fd = open_nofollow(path)
    except OSError:
        return None
    with open(fd, "rb", closefd=True) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        return f.read(limit * 4).decode("utf-8", errors="replace")[:limit]


def walk(top: Path) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """Every entry below the folder ``top``, depth first and by name, as (path relative to
    ``top``, its ``lstat``, a descriptor of the folder holding it, its name there): read it
    through that descriptor, which stays open until the next entry. Nothing if ``top`` is
    missing or reached through a link; a link inside is an entry, never entered."""
    try:
        fd = open_nofollow(top, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    stack: list[tuple[int, str, Iterator[str]]] = [(fd, "", _names(fd))]
    try:
        while stack:
            folder, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            try:
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield prefix + name, st, folder, name
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                sub = os.open(name, _DIR, dir_fd=folder)
            except OSError:  # swapped for a link since: not entered
                continue
            if not os.path.samestat(st, os.fstat(sub)):
                os.close(sub)
                continue
            stack.append((sub, f"{prefix}{name}/", _names(sub)))
    finally:
        for folder, _, _ in stack:
            os.close(folder)


def _names(fd: int) -> Iterator[str]:
    try:
        return iter(sorted(os.listdir(fd)))
    except OSError:  # unreadable: nothing in it is read
        return iter(())


def remove_tree(path: Path) -> bool:
    """Remove ``path``: a file or link itself, a folder with everything in it. No link on
    the way to ``path`` or inside it is followed, and no other file system entered. True
    if nothing of it is left (or there was nothing); False if something stayed: a mount
    point and the folders holding it, a folder a link stood in for, what could not be
    removed."""
    try:
        parent = open_nofollow(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("not removing %s: its folder is not reached without links (%s)", path, exc)
        return False
    try:
        return remove_at(parent, path.name)
    finally:
        os.close(parent)


def remove_at(dir_fd: int, name: str) -> bool:
    """Remove the entry ``name`` of the open folder ``dir_fd`` as :func:`remove_tree` does."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return _unlink(dir_fd, name)
    if st.st_dev != os.fstat(dir_fd).st_dev:
        return False  # a mount point: its file system answers for itself
    try:
        return _remove_folder(dir_fd, name)
    except OSError as exc:
        log.warning("could not remove all of %s: %s", name, exc)
        return False


def _unlink(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)  # unlinkat: a link goes, what it names stays
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _remove_folder(parent_fd: int, name: str) -> bool:
    """Empty and remove the folder ``name`` of ``parent_fd``, depth first, holding one
    descriptor: going down opens a subfolder without following links, going up opens
    ``..`` and checks it is the folder it came from (one moved away meanwhile ends the
    removal there)."""
    fd = os.open(name, _DIR, dir_fd=parent_fd)
    device = os.fstat(fd).st_dev
    # From the top folder to the one open now: its name, identity, and entries kept in it.
    trail: list[tuple[str, tuple[int, int], set[str]]] = [(name, _identity(fd), set())]
    complete = True
    try:
        while True:
            kept = trail[-1][2]
            child, cleared = _clear_files(fd, device, kept)
            complete = complete and cleared
            if child is not None:
                try:
                    sub = os.open(child, _DIR, dir_fd=fd)
                except OSError:  # swapped for a link, or unreadable: leave it
                    kept.add(child)
                    complete = False
                    continue
                os.close(fd)
                fd = sub
                trail.append((child, _identity(fd), set()))
                continue
            done = trail.pop()[0]
            if not trail:
                break
            up = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = up
            if _identity(fd) != trail[-1][1]:
                log.warning("a folder under %s moved while it was removed; left as it is", name)
                return False
            try:
                os.rmdir(done, dir_fd=fd)
            except OSError:
                trail[-1][2].add(done)
                complete = False
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except OSError:
        return False
    return complete


def _clear_files(fd: int, device: int, kept: set[str]) -> tuple[str | None, bool]:
    """Remove every entry of folder ``fd`` but its subfolders; the first subfolder not in
    ``kept`` (None when none is left), and whether everything else went."""
    cleared = True
    for entry in os.listdir(fd):
        if entry in kept:
            continue
        try:
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            if not _unlink(fd, entry):
                kept.add(entry)
                cleared = False
        elif st.st_dev != device:
            kept.add(entry)  # a mount point
            cleared = False
        else:
            return entry, cleared
    return None, cleared
