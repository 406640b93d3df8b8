"""Checkpoints: seeded from the store before training, synced back during and after.

Sync uploads files that are new or changed since the last sync (by size and mtime) so a
periodic sync of a large checkpoint folder costs only what changed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trainport.host.channels import relative_path
from trainport.store.api import ObjectStore, S3Uri
from trainport.store.transfer import Transfer, download_all, upload_all

__all__ = ["CheckpointSync"]

log = logging.getLogger(__name__)


class CheckpointSync:
    def __init__(self, store: ObjectStore, uri: str, local: Path, workers: int = 8) -> None:
        self.store = store
        self.uri = S3Uri.parse(uri, field="CheckpointConfig.S3Uri")
        self.prefix = (
            self.uri.key if self.uri.key.endswith("/") or not self.uri.key else self.uri.key + "/"
        )
        self.local = local
        self.workers = workers
        self._synced: dict[str, tuple[int, int]] = {}

    def seed(self) -> int:
        """Copy every checkpoint object into the local folder; returns how many."""
        self.local.mkdir(parents=True, exist_ok=True)
        items = []
        for obj in self.store.list_objects(self.uri.bucket, self.prefix):
            if obj.key.endswith("/"):
                continue  # a folder marker (the S3 console's "Create folder"): no file
            rel = relative_path(obj.key[len(self.prefix) :], what=f"checkpoint object {obj.key!r}")
            items.append(Transfer(self.uri.bucket, obj.key, self.local / rel, obj.size))
        download_all(self.store, items, workers=self.workers, label="checkpoints in")
        for t in items:
            st = t.path.stat()
            self._synced[str(t.path.relative_to(self.local))] = (st.st_size, st.st_mtime_ns)
        return len(items)

    def sync(self) -> int:
        """Upload what changed since the last sync; returns how many files went up."""
        if not self.local.is_dir():
            return 0
        changed: list[Transfer] = []
        for dirpath, _, filenames in os.walk(self.local):
            for name in filenames:
                path = Path(dirpath) / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue  # the job removed it while we walked
                rel = str(path.relative_to(self.local))
                if self._synced.get(rel) != (st.st_size, st.st_mtime_ns):
                    changed.append(Transfer(self.uri.bucket, self.prefix + rel, path, st.st_size))
                    self._synced[rel] = (st.st_size, st.st_mtime_ns)
        if changed:
            upload_all(self.store, changed, workers=self.workers, label="checkpoints out")
        return len(changed)
