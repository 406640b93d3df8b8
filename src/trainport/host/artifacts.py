"""What a job leaves: model.tar.gz and output.tar.gz, uploaded whatever the job's end."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from trainport.errors import JobError
from trainport.host import jobtree
from trainport.store.api import ObjectStore, S3Uri

__all__ = [
    "artifact_prefix",
    "pack_dir",
    "pack_merged",
    "scratch_dir",
    "upload_artifacts",
    "upload_merged",
]

log = logging.getLogger(__name__)

_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def artifact_prefix(output_path: str, job: str) -> S3Uri:
    """``<S3OutputPath>/<job>/output/``"""
    return S3Uri.parse(output_path, field="OutputDataConfig.S3OutputPath").child(f"{job}/output/")


def pack_dir(source: Path, target: Path) -> None:
    """Tar+gzip the contents of ``source`` with members at the archive's root.

    Level 1 compression: model files are mostly incompressible floats, and the upload
    waits on this.
    """
    with tarfile.open(target, "w:gz", compresslevel=1) as tar:
        for rel, st, folder, name in jobtree.walk(source):
            _add(tar, rel, st, folder, name)


def _add(tar: tarfile.TarFile, rel: str, st: os.stat_result, folder: int, name: str) -> None:
    """One entry of a job's folder, read through its folder's descriptor (see
    jobtree.walk): a link the job made is kept as a link, and a file is read only if it
    is still the file that was listed."""
    if stat.S_ISREG(st.st_mode):
        try:
            fd = os.open(name, _FILE, dir_fd=folder)
        except OSError:
            return  # gone, or a link put in its place since it was listed
        with open(fd, "rb") as f:
            if not os.path.samestat(st, os.fstat(fd)):
                return
            info = tar.gettarinfo(arcname=rel, fileobj=f)
            tar.addfile(info, f if info.isreg() else None)
        return
    info = tarfile.TarInfo(rel)
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    info.uid, info.gid = st.st_uid, st.st_gid
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        try:
            info.linkname = os.readlink(name, dir_fd=folder)
        except OSError:
            return
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
    else:
        return  # sockets and devices hold nothing to keep
    tar.addfile(info)


def scratch_dir(job_dir: Path) -> Path:
    """Where a job's archives are packed: beside its hosts' trees, out of every sandbox's
    sight, and removed with the job's other leftovers when its supervisor is gone."""
    return job_dir / "tmp"


def _packing_folder(scratch: Path) -> tempfile.TemporaryDirectory[str]:
    """A folder for the archives inside ``scratch`` (the job's own folder), not the system
    temp folder: a supervisor killed mid-upload leaves its half-made archive where the
    job's cleanup finds it, instead of in /tmp for good."""
    scratch.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="artifacts-", dir=scratch)


@contextlib.contextmanager
def _packing(archive: Path, sources: str, scratch: Path) -> Iterator[None]:
    """Say where an archive could not be written: a full disk's own error names no file.
    The folder named is ``scratch``, the job's, which outlives the archive's own."""
    try:
        yield
    except OSError as exc:
        what = f"packing {archive.name} from {sources}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise JobError(
                f"no space left on the device that holds {scratch} ({what}); free "
                "space there or move TRAINPORT_HOME to a larger disk"
            ) from exc
        raise JobError(f"cannot write {archive} ({what}): {exc.strerror or exc}") from exc


def upload_artifacts(
    store: ObjectStore,
    output_path: str,
    job: str,
    model_dir: Path,
    output_data_dir: Path,
    *,
    scratch: Path,
) -> str:
    """Pack (in a folder under ``scratch``) and upload both archives; returns the model
    artifact's URI."""
    prefix = artifact_prefix(output_path, job)
    with _packing_folder(scratch) as tmp:
        for name, source in (("model.tar.gz", model_dir), ("output.tar.gz", output_data_dir)):
            archive = Path(tmp) / name
            with _packing(archive, str(source), scratch):
                pack_dir(source, archive)
            target = prefix.child(name)
            store.upload(archive, target.bucket, target.key)
            log.info("uploaded %s (%d bytes)", target, archive.stat().st_size)
    return str(prefix.child("model.tar.gz"))


def pack_merged(sources: Sequence[tuple[str, Path]], target: Path) -> list[str]:
    """Tar+gzip several hosts' folders as one tree, hosts in order.

    A path written by more than one host is kept from the first host that has it (the
    lowest-numbered: algo-1 before algo-2), so the result does not depend on timing.
    Returns one line per such path, naming the hosts that wrote it.
    """
    owners: dict[str, list[str]] = {}
    with tarfile.open(target, "w:gz", compresslevel=1) as tar:
        for host, source in sources:
            # Nothing of a folder that is missing or a link the job put in its place.
            for rel, st, folder, name in jobtree.walk(source):
                if stat.S_ISDIR(st.st_mode):
                    continue
                owners.setdefault(rel, []).append(host)
                if len(owners[rel]) == 1:
                    _add(tar, rel, st, folder, name)
    return [
        f"{rel} ({', '.join(hosts)})" for rel, hosts in sorted(owners.items()) if len(hosts) > 1
    ]


def upload_merged(
    store: ObjectStore,
    output_path: str,
    job: str,
    model_dirs: Sequence[tuple[str, Path]],
    output_dirs: Sequence[tuple[str, Path]],
    *,
    scratch: Path,
) -> tuple[str, list[str]]:
    """Pack every host's model and output folders into one model.tar.gz and one
    output.tar.gz (in a folder under ``scratch``); returns the model URI and the model
    paths written by several hosts."""
    prefix = artifact_prefix(output_path, job)
    with _packing_folder(scratch) as tmp:
        conflicts: list[str] = []
        for name, sources in (("model.tar.gz", model_dirs), ("output.tar.gz", output_dirs)):
            archive = Path(tmp) / name
            with _packing(archive, ", ".join(str(f) for _, f in sources), scratch):
                clashes = pack_merged(sources, archive)
            if name == "model.tar.gz":
                conflicts = clashes
            target = prefix.child(name)
            store.upload(archive, target.bucket, target.key)
            log.info("uploaded %s (%d bytes)", target, archive.stat().st_size)
    return str(prefix.child("model.tar.gz")), conflicts
