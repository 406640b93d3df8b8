"""What a job leaves: model.tar.gz and output.tar.gz, uploaded whatever the job's end."""

from __future__ import annotations

import logging
import os
import tarfile
import tempfile
from pathlib import Path

from trainport.store.api import ObjectStore, S3Uri

__all__ = ["artifact_prefix", "pack_dir", "upload_artifacts"]

log = logging.getLogger(__name__)


def artifact_prefix(output_path: str, job: str) -> S3Uri:
    """``<S3OutputPath>/<job>/output/``"""
    return S3Uri.parse(output_path, field="OutputDataConfig.S3OutputPath").child(f"{job}/output/")


def pack_dir(source: Path, target: Path) -> None:
    """Tar+gzip the contents of ``source`` with members at the archive's root.

    Level 1 compression: model files are mostly incompressible floats, and the upload
    waits on this.
    """
    with tarfile.open(target, "w:gz", compresslevel=1) as tar:
        if source.is_dir():
            for entry in sorted(os.listdir(source)):
                tar.add(source / entry, arcname=entry)


def upload_artifacts(
    store: ObjectStore, output_path: str, job: str, model_dir: Path, output_data_dir: Path
) -> str:
    """Pack and upload both archives; returns the model artifact's URI."""
    prefix = artifact_prefix(output_path, job)
    with tempfile.TemporaryDirectory(prefix="trainport-artifacts-") as tmp:
        for name, source in (("model.tar.gz", model_dir), ("output.tar.gz", output_data_dir)):
            archive = Path(tmp) / name
            pack_dir(source, archive)
            target = prefix.child(name)
            store.upload(archive, target.bucket, target.key)
            log.info("uploaded %s (%d bytes)", target, archive.stat().st_size)
    return str(prefix.child("model.tar.gz"))
