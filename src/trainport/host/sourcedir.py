"""``sourcedir.tar.gz``: the user's code as the SageMaker SDK uploads it, and its safe unpacking.

:func:`pack_sourcedir` and :func:`pack_entry_point` build the tarball on the client side
(members relative to the source directory, as ``sagemaker.fw_utils.tar_and_upload_dir`` does).
:func:`unpack_sourcedir` extracts it into a host's code directory. A tarball is user input:
every member is checked before anything is written, and a member that would land outside the
code directory (absolute, ``..``, a link whose target escapes) or that is a device or FIFO is
refused with the member's name, so a bad upload leaves the code directory untouched.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from pathlib import Path, PurePosixPath

from trainport.config import DEFAULT_MAX_SOURCEDIR_MB
from trainport.errors import ValidationError
from trainport.host.tarball import extract_within

__all__ = ["pack_entry_point", "pack_sourcedir", "unpack_sourcedir"]


def pack_sourcedir(source_dir: Path, entry_point: str) -> bytes:
    """A gzip tarball of everything under ``source_dir``, members named relative to it.

    ``entry_point`` is the script's path relative to ``source_dir`` and must be a file there.
    Symbolic links are kept as links, as the SageMaker SDK does, so a link pointing outside
    ``source_dir`` is refused now rather than when a host unpacks the tarball.
    """
    source = Path(source_dir)
    if not source.is_dir():
        raise ValidationError(
            f"source_dir {source} is not a directory; pass the folder that holds {entry_point}"
        )
    entry = source / entry_point
    if PurePosixPath(entry_point).is_absolute() or ".." in PurePosixPath(entry_point).parts:
        raise ValidationError(
            f"entry_point {entry_point!r} must be a path relative to source_dir {source}"
        )
    if not entry.is_file():
        raise ValidationError(
            f"entry_point {entry} is not a file inside source_dir {source}; "
            "pass the script's path relative to source_dir"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source).as_posix()
            info = tar.gettarinfo(str(path), arcname=rel)
            problem = _member_problem(info, f"source_dir {source}")
            if problem is not None:
                raise ValidationError(
                    f"{path} {problem}; replace it with a copy of its target or remove it"
                )
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def pack_entry_point(entry: Path) -> bytes:
    """A gzip tarball holding just ``entry`` at its root (script mode without a source_dir)."""
    path = Path(entry)
    if not path.is_file():
        raise ValidationError(f"entry point {path} is not a file; pass the training script")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(str(path), arcname=path.name)
    return buf.getvalue()


def unpack_sourcedir(
    tarball: bytes | Path, code_dir: Path, *, max_bytes: int = DEFAULT_MAX_SOURCEDIR_MB << 20
) -> None:
    """Extract ``tarball`` (its bytes, or a path to it) into ``code_dir``, refusing escapes.

    All members are validated first; if any is unsafe, or the archive unpacks to more than
    ``max_bytes`` (headers and contents), a :class:`ValidationError` says so and nothing is
    written. Extraction then also goes through :func:`extract_within`, which resolves links
    on disk (a chain of links the lexical check cannot see), as a second line of defence.
    """
    code = Path(code_dir)
    with _open_tarball(tarball, code) as tar:
        members = _bounded_members(tar, code, max_bytes)
        for member in members:
            problem = _member_problem(member, str(code))
            if problem is not None:
                raise ValidationError(
                    f"sourcedir tarball member {member.name!r} {problem}; nothing was "
                    "extracted. Rebuild the tarball from the source directory alone"
                )
        code.mkdir(parents=True, exist_ok=True)
        try:
            extract_within(tar, members, code)
        except ValidationError as exc:
            raise ValidationError(
                f"sourcedir tarball refused while extracting into {code}: {exc}"
            ) from exc


def _bounded_members(tar: tarfile.TarFile, code: Path, max_bytes: int) -> list[tarfile.TarInfo]:
    """The archive's members, read one header at a time so that a gzip bomb is refused
    after decompressing at most about ``max_bytes``, never all of it."""
    members: list[tarfile.TarInfo] = []
    while True:
        try:
            member = tar.next()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ValidationError(
                f"sourcedir tarball for {code} is truncated or corrupt ({exc}); upload it again"
            ) from exc
        if member is None:
            return members
        # Where this member's contents end in the unpacked archive: the bytes read so far.
        if member.offset_data + member.size > max_bytes:
            raise ValidationError(
                f"sourcedir tarball for {code} unpacks to more than {max_bytes >> 20} MiB, "
                f"the limit (member {member.name!r} reaches past it); nothing was extracted. "
                "Leave data and build outputs out of the source directory (use a channel), "
                "or raise the limit with TRAINPORT_MAX_SOURCEDIR_MB where trainport runs "
                "(the server and its hosts)"
            )
        members.append(member)


def _open_tarball(tarball: bytes | Path, code: Path) -> tarfile.TarFile:
    try:
        data = (
            bytes(tarball) if isinstance(tarball, bytes | bytearray) else Path(tarball).read_bytes()
        )
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, OSError) as exc:
        raise ValidationError(
            f"sourcedir tarball for {code} cannot be read ({exc}); upload a .tar.gz of the "
            "source directory as sagemaker_submit_directory"
        ) from exc


def _member_problem(member: tarfile.TarInfo, root: str) -> str | None:
    """Why ``member`` is unsafe to extract into ``root``, worded to follow its name, or None.

    The checks are lexical, relative to the extraction root, so they need no files on disk:
    names and hard-link targets are relative to the root, symbolic-link targets to the
    member's own folder.
    """
    if member.ischr() or member.isblk():
        return "is a device file"
    if member.isfifo():
        return "is a FIFO"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "is not a file, folder or link"
    name = member.name
    if _escapes(name):
        return f"would land outside {root}"
    if member.islnk() and _escapes(member.linkname):
        return f"is a hard link to {member.linkname!r}, which is outside {root}"
    if member.issym():
        target = member.linkname
        if target.startswith("/"):
            return f"is a symlink to the absolute path {target!r}, outside {root}"
        parent = posixpath.dirname(name.rstrip("/"))
        if _escapes(posixpath.join(parent, target), allow_dotdot=True):
            return f"is a symlink to {target!r}, which points outside {root}"
    return None


def _escapes(name: str, *, allow_dotdot: bool = False) -> bool:
    if not name or name.startswith("/"):
        return True
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not allow_dotdot:
        return ".." in parts
    depth = 0
    for part in parts:
        depth = depth - 1 if part == ".." else depth + 1
        if depth < 0:
            return True
    return False
