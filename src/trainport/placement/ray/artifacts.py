"""A host's model and output folders, from its node to the submitting side.

The node packs them into one tar and puts it in the job's store; the driver fetches it
and unpacks it into the host's tree on its own machine, for the supervisor's merged upload.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tarfile
import uuid
from pathlib import Path
from typing import Any

from trainport.config import Settings
from trainport.host import jobtree
from trainport.host.layout import HostLayout
from trainport.host.tarball import extract_within
from trainport.spec import JobSpec
from trainport.store.api import S3Uri
from trainport.store.registry import open_store

__all__ = ["fetch_artifacts", "send_artifacts"]

log = logging.getLogger(__name__)


def send_artifacts(layout: HostLayout | None, settings: Settings, bucket: str, key: str) -> None:
    """On the node: pack the host's model and output data folders into one tar (``model/``,
    ``output/``) and put it in the store at ``bucket/key``. Through the store, which every
    node reaches (checked before the job started), not Ray's object store: a model of
    gigabytes goes from node to store in one stream. Links the job made are not followed.
    ``layout`` None (the host never started): an empty tar."""
    packed = settings.home / "packed" / f"{uuid.uuid4().hex}.tar"
    packed.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(packed, mode="w") as tar:
            if layout is not None:
                folders = (("model", layout.model_dir), ("output", layout.output_data_dir))
                for name, folder in folders:
                    # Reached without links; tarfile keeps links inside as links.
                    with jobtree.open_folder(folder) as top:
                        if top is None:
                            continue
                        for entry in sorted(os.listdir(top)):
                            tar.add(top / entry, arcname=f"{name}/{entry}")
        open_store(settings).upload(packed, bucket, key)
    finally:
        packed.unlink(missing_ok=True)


def fetch_artifacts(
    actor: Any, spec: JobSpec, host: str, layout: HostLayout, settings: Settings
) -> None:
    """On the submitting side: have ``actor`` send its host's folders through the store,
    and unpack them into ``layout`` on this machine. A dead node's files are lost with it
    (said in the supervisor's log)."""
    import ray

    out = S3Uri.parse(spec.output_path)
    # Beside the job's archives, and gone once read.
    parts = (out.key.strip("/"), spec.name, "output", ".hosts", f"{host}.tar")
    key = "/".join(p for p in parts if p)
    packed = layout.root / "packed.tar"
    store = open_store(settings)
    try:
        ray.get(actor.send_artifacts.remote(out.bucket, key), timeout=3600)
        store.download(out.bucket, key, packed)
    except Exception as exc:  # a dead node: its host's files are lost with it
        log.warning("host %s: its artifacts could not be fetched: %s", host, exc)
        return
    finally:
        with contextlib.suppress(Exception):
            store.delete(out.bucket, key)
    try:
        _unpack(packed, layout)
    finally:
        packed.unlink(missing_ok=True)


def _unpack(packed: Path, layout: HostLayout) -> None:
    """A host's packed folders into its tree on this machine; members confined to it."""
    with tarfile.open(packed, mode="r") as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            target = {"model": layout.model_dir, "output": layout.output_data_dir}.get(top)
            if target is None or not rest:
                continue
            member.name = rest
            extract_within(tar, [member], target)
