"""Extracting a tarball so that nothing it holds lands or points outside the target folder.

Python 3.11.4 gave :mod:`tarfile` extraction filters; its ``"data"`` filter refuses absolute
names, ``..`` escapes, links whose target leaves the folder (resolved on disk, so a chain of
links is caught too) and device files, drops ownership and strips setuid and group/other
write bits. Python 3.11.0-3.11.3 (Debian 12 ships 3.11.2) have no filters, and their
``extractall`` trusts every member. :func:`extract_within` is the one place trainport
extracts a tarball it did not write itself: it uses the standard filter where it exists and
otherwise applies the same rules itself, member by member, just before each is written, so
the safety does not depend on the patch release.
"""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Iterable
from pathlib import Path

from trainport.errors import ValidationError

__all__ = ["extract_within"]


def extract_within(tar: tarfile.TarFile, members: Iterable[tarfile.TarInfo], root: Path) -> None:
    """Extract ``members`` of ``tar`` under ``root``, refusing any that would escape it.

    A refused member raises :class:`ValidationError` naming it; members before it stay
    written, so callers that must leave nothing behind check the archive lexically first.
    """
    chosen = list(members)
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(str(root), members=chosen, filter="data")
        except tarfile.FilterError as exc:
            raise ValidationError(f"tarball member refused: {exc}") from exc
        return
    _extract_without_filters(tar, chosen, root)


def _extract_without_filters(
    tar: tarfile.TarFile, members: list[tarfile.TarInfo], root: Path
) -> None:
    # Each member is judged against the disk as the members before it left it, exactly
    # when it is about to be written: a link extracted earlier can redirect a later name.
    real_root = os.path.realpath(root)
    for member in members:
        safe = _as_data(member, real_root)
        tar.extract(safe, str(root), set_attrs=True)


def _as_data(member: tarfile.TarInfo, real_root: str) -> tarfile.TarInfo:
    """A copy of ``member`` that is safe to write under ``real_root``, or ValidationError.

    The same rules as the standard ``"data"`` filter: leading slashes dropped, the name and
    any link target resolved on disk and required inside the root, special files refused,
    modes limited to what a data file needs, ownership left to the extracting user.
    """
    name = member.name.lstrip("/")
    if os.path.isabs(name):
        raise _refused(member, "has an absolute path")
    landing = os.path.realpath(os.path.join(real_root, name))
    if not _inside(landing, real_root):
        raise _refused(member, f"would land at {landing}, outside {real_root}")
    if member.issym() or member.islnk():
        _check_link(member, name, real_root)
    safe = copy.copy(member)
    safe.name = name
    safe.mode = _data_mode(member)
    # The extracting user owns what it writes: as root, tarfile would chown to the archive's
    # owner names, which are the uploader's choice.
    safe.uid, safe.gid = os.geteuid(), os.getegid()
    safe.uname = safe.gname = ""
    return safe


def _check_link(member: tarfile.TarInfo, name: str, real_root: str) -> None:
    if os.path.isabs(member.linkname):
        raise _refused(member, f"is a link to the absolute path {member.linkname!r}")
    # A symbolic link's target is relative to its own folder, a hard link's to the root.
    base = os.path.join(real_root, os.path.dirname(name)) if member.issym() else real_root
    target = os.path.realpath(os.path.join(base, member.linkname))
    if not _inside(target, real_root):
        raise _refused(member, f"is a link to {target}, outside {real_root}")
    if member.islnk() and not os.path.isfile(target):
        # Without a file to link to, old tarfile copies the target's member with its own,
        # unfiltered attributes; refuse instead.
        raise _refused(member, f"is a hard link to {member.linkname!r}, not extracted before it")


def _data_mode(member: tarfile.TarInfo) -> int:
    if member.isreg() or member.islnk():
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o111
        return mode | 0o600
    if member.isdir() or member.issym():
        # The standard filter ignores these modes; a plain, owner-writable folder keeps
        # later members of the same archive writable whatever order they come in.
        return 0o755
    raise _refused(member, "is a device file, FIFO or other special file")


def _inside(path: str, real_root: str) -> bool:
    return os.path.commonpath([path, real_root]) == real_root


def _refused(member: tarfile.TarInfo, why: str) -> ValidationError:
    return ValidationError(f"tarball member {member.name!r} {why}; it was not extracted")
