"""Helpers for trainport.data tests: record files on disk and real FIFO producers."""

from __future__ import annotations

import contextlib
import os
import threading
import time
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


def wait_exists(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.01)


class FifoProducer(threading.Thread):
    """Plays the host agent: FIFO ``<dir>/<name>_<epoch>`` per epoch, each made only once the
    previous one was consumed or closed, each carrying ``payload(epoch)``."""

    def __init__(
        self,
        directory: Path,
        name: str,
        payload: Callable[[int], bytes],
        epochs: int,
        start_delay: float = 0.0,
    ) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.name = name
        self.payload = payload
        self.epochs = epochs
        self.broken: list[int] = []  # epochs whose reader closed early
        self.done: list[int] = []
        self._halt = threading.Event()
        self._current: Path | None = None
        self.start_delay = start_delay

    def run(self) -> None:
        if self.start_delay:
            time.sleep(self.start_delay)
        for epoch in range(self.epochs):
            if self._halt.is_set():
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
        self._halt.set()
        path = self._current
        if path is not None and path.exists():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        self.join(timeout=5)
