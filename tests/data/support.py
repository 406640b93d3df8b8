"""Helpers for trainport.data tests: record files on disk and real FIFO producers."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from trainport.data import encode_recordio, encode_tfrecord


def make_records(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i:05d}".encode() * (1 + i % 7) for i in range(count)]


def write_records(path: Path, records: list[bytes], fmt: str = "tfrecord") -> Path:
    encode = encode_tfrecord if fmt == "tfrecord" else encode_recordio
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(encode(r) for r in records))
    return path


class FifoProducer(threading.Thread):
    """Plays the host agent: FIFO ``<dir>/<name>_<epoch>`` per epoch, each made only once the
    previous one was consumed or closed, each carrying ``payload(epoch)``."""

    def __init__(
        self, directory: Path, name: str, payload: Callable[[int], bytes], epochs: int
    ) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.name = name
        self.payload = payload
        self.epochs = epochs
        self.broken: list[int] = []  # epochs whose reader closed early
        self.done: list[int] = []
        self._stop = threading.Event()
        self._current: Path | None = None

    def run(self) -> None:
        for epoch in range(self.epochs):
            if self._stop.is_set():
                return
            path = self.directory / f"{self.name}_{epoch}"
            os.mkfifo(path)
            self._current = path
            data = self.payload(epoch)
            with open(path, "wb", buffering=0) as fifo:  # blocks until a reader opens
                try:
                    view = memoryview(data)
                    while view:
                        written = fifo.write(view[: 1 << 16])
                        view = view[written or 0 :]
                    self.done.append(epoch)
                except BrokenPipeError:
                    self.broken.append(epoch)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def stop(self) -> None:
        """Release a writer blocked in open() so the thread can end."""
        self._stop.set()
        path = self._current
        if path is not None and path.exists():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        self.join(timeout=5)
