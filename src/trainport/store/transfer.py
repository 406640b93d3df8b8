"""Many objects in or out at once, in parallel, behind one progress bar.

The progress bar (tqdm, on stderr) appears only when stderr is a terminal or when the caller
asks for it; inside a job's supervisor the same progress is reported as log lines instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainport.store.api import ObjectStore

__all__ = ["Progress", "Transfer", "TransferStats", "download_all", "upload_all"]

#: Called with (objects done, objects in all, bytes done, bytes in all), at most twice a second.
Progress = Callable[[int, int, int, int], None]
_PROGRESS_EVERY = 0.5

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transfer:
    bucket: str
    key: str
    path: Path
    size: int = 0


@dataclass(frozen=True)
class TransferStats:
    objects: int
    bytes: int
    seconds: float

    @property
    def mib_per_second(self) -> float:
        return self.bytes / (1 << 20) / self.seconds if self.seconds > 0 else 0.0


def _progress_bar(total: int, label: str, leave: bool) -> Any:
    # Imported only when a bar is shown: tqdm costs a job's supervisor tens of ms to import.
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, leave=leave)


def _run_all(
    items: Sequence[Transfer],
    one: Callable[[Transfer], int],
    *,
    workers: int,
    label: str,
    progress: bool,
    on_progress: Progress | None = None,
    keep_bar: bool = False,
) -> TransferStats:
    start = time.monotonic()
    total = sum(t.size for t in items)
    done_bytes = 0
    done_objects = 0
    last_report = start
    bar = _progress_bar(total, label, keep_bar) if progress else None
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items) or 1))) as pool:
            futures = [pool.submit(one, t) for t in items]
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
                for fut in finished:
                    n = fut.result()  # re-raises the first failure; the pool drains the rest
                    done_bytes += n
                    done_objects += 1
                    if bar is not None:
                        bar.update(n)
                if on_progress is not None and (
                    not pending or time.monotonic() - last_report >= _PROGRESS_EVERY
                ):
                    on_progress(done_objects, len(items), done_bytes, total)
                    last_report = time.monotonic()
    finally:
        if bar is not None:
            bar.close()
    stats = TransferStats(len(items), done_bytes, time.monotonic() - start)
    log.info(
        "%s: %d objects, %.1f MiB in %.2f s (%.0f MiB/s)",
        label,
        stats.objects,
        stats.bytes / (1 << 20),
        stats.seconds,
        stats.mib_per_second,
    )
    return stats


def download_all(
    store: ObjectStore,
    items: Sequence[Transfer],
    *,
    workers: int = 16,
    label: str = "download",
    progress: bool = False,
    on_progress: Progress | None = None,
) -> TransferStats:
    return _run_all(
        items,
        lambda t: store.download(t.bucket, t.key, t.path),
        workers=workers,
        label=label,
        progress=progress,
        on_progress=on_progress,
    )


def upload_all(
    store: ObjectStore,
    items: Sequence[Transfer],
    *,
    workers: int = 16,
    label: str = "upload",
    progress: bool = False,
    on_progress: Progress | None = None,
    keep_bar: bool = False,
) -> TransferStats:
    """Upload ``items`` with ``workers`` in flight; ``keep_bar`` leaves the finished bar on
    the terminal (a command's own upload), else it goes when done."""

    def one(t: Transfer) -> int:
        store.upload(t.path, t.bucket, t.key)
        return t.path.stat().st_size

    return _run_all(
        items,
        one,
        workers=workers,
        label=label,
        progress=progress,
        on_progress=on_progress,
        keep_bar=keep_bar,
    )
