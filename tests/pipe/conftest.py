"""Helpers for Pipe and FastFile tests: a store that counts reads, FIFO readers, FUSE gate."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import BinaryIO

from tests.conftest import require
from trainport.store.local import LocalStore


class CountingStore(LocalStore):
    """The local store, counting every read per key (and the ranges read)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: Counter[str] = Counter()
        self.ranges: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.reads[key] += 1

    def read_range(self, bucket: str, key: str, start: int, end: int) -> bytes:
        self._count(key)
        with self._lock:
            self.ranges.append((key, start, end))
        with open(self._path(bucket, key), "rb") as f:  # not via open_stream: one count
            f.seek(start)
            return f.read(max(0, end - start))

    def get_bytes(self, bucket: str, key: str) -> bytes:
        self._count(key)
        return super().get_bytes(bucket, key)

    def open_stream(self, bucket: str, key: str) -> BinaryIO:
        self._count(key)
        return super().open_stream(bucket, key)

    def download(self, bucket: str, key: str, dest: Path) -> int:
        self._count(key)
        return super().download(bucket, key, dest)


def wait_fifo(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.005)


def read_fifo(path: Path, limit: int | None = None) -> bytes:
    """Wait for a FIFO and read it to EOF (or only ``limit`` bytes, then close early)."""
    wait_fifo(path)
    with open(path, "rb", buffering=0) as f:
        if limit is not None:
            return f.read(limit)
        chunks = []
        while block := f.read(1 << 20):
            chunks.append(block)
        return b"".join(chunks)


def require_fuse() -> None:
    """Skip FUSE tests where FUSE cannot work (fail instead with TRAINPORT_CI_NO_SKIP=1)."""
    from trainport.host.fastfile import fuse_problem

    problem = fuse_problem()
    require(problem is None, f"FUSE unavailable: {problem}")
    require(os.geteuid() == 0 or os.access("/dev/fuse", os.W_OK), "no access to /dev/fuse")
