"""Checkpoints: seeded from the store before training, synced back during and after.

Sync uploads files that are new or changed since the last sync (by size and mtime) so a
periodic sync of a large checkpoint folder costs only what changed.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from trainport.host import jobtree
from trainport.host.channels import relative_path
from trainport.store.api import ObjectStore, S3Uri
from trainport.store.transfer import Transfer, download_all, upload_all

__all__ = ["CheckpointSync"]

log = logging.getLogger(__name__)

_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_BATCH = 256


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
        """Upload what changed since the last sync; returns how many files went up.

        The folder belongs to a running job: it is walked and each file opened without
        following links (a link to a host file would upload that file), and each upload
        reads the file it checked, through its descriptor."""
        try:
            top = jobtree.open_nofollow(self.local, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return 0  # not made yet, or a link the job put in its place
        count = 0
        batch: list[Transfer] = []
        held: list[int] = []
        try:
            for dirpath, _, filenames, dir_fd in os.fwalk(".", dir_fd=top):
                for name in filenames:
                    try:
                        fd = os.open(name, _FILE, dir_fd=dir_fd)
                    except OSError:
                        continue  # a link, or removed while we walked
                    st = os.fstat(fd)
                    rel = os.path.normpath(os.path.join(dirpath, name))
                    seen = (st.st_size, st.st_mtime_ns)
                    if not stat.S_ISREG(st.st_mode) or self._synced.get(rel) == seen:
                        os.close(fd)
                        continue
                    held.append(fd)
                    path = jobtree.fd_path(fd)
                    batch.append(Transfer(self.uri.bucket, self.prefix + rel, path, st.st_size))
                    self._synced[rel] = seen
                    if len(held) >= _BATCH:  # stay well inside the descriptor limit
                        count += self._upload(batch, held)
            count += self._upload(batch, held)
        finally:
            for fd in held:
                os.close(fd)
            os.close(top)
        return count

    def _upload(self, batch: list[Transfer], held: list[int]) -> int:
        count = len(batch)
        if batch:
            upload_all(self.store, batch, workers=self.workers, label="checkpoints out")
        for fd in held:
            os.close(fd)
        held.clear()
        batch.clear()
        return count
