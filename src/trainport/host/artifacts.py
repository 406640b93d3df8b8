"""What a job leaves: model.tar.gz and output.tar.gz, uploaded whatever the job's end."""

from __future__ import annotations

import logging
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

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


def artifact_prefix(output_path: str, job: str) -> S3Uri:
    """``<S3OutputPath>/<job>/output/``"""
    return S3Uri.parse(output_path, field="OutputDataConfig.S3OutputPath").child(f"{job}/output/")


def pack_dir(source: Path, target: Path) -> None:
    """Tar+gzip the contents of ``source`` with members at the archive's root.

    Level 1 compression: model files are mostly incompressible floats, and the upload
    waits on this.
    """
    with tarfile.open(target, "w:gz", compresslevel=1) as tar, jobtree.open_folder(source) as top:
        # Reached without links (a job may have put one where its folder was); tarfile
        # keeps the links inside as links and never descends through them.
        if top is not None:
            for entry in sorted(os.listdir(top)):
                tar.add(top / entry, arcname=entry)


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
            with jobtree.open_folder(source) as folder:
                if folder is None:
                    continue  # missing, or a link the job put in its place
                for dirpath, dirnames, filenames in os.walk(folder):
                    dirnames.sort()
                    for name in sorted(filenames):
                        path = Path(dirpath) / name
                        rel = str(path.relative_to(folder))
                        owners.setdefault(rel, []).append(host)
                        if len(owners[rel]) == 1:
                            tar.add(path, arcname=rel, recursive=False)
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
            clashes = pack_merged(sources, archive)
            if name == "model.tar.gz":
                conflicts = clashes
            target = prefix.child(name)
            store.upload(archive, target.bucket, target.key)
            log.info("uploaded %s (%d bytes)", target, archive.stat().st_size)
    return str(prefix.child("model.tar.gz")), conflicts
