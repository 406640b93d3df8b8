"""A throughput meter for the input pipeline: records/s, MB/s and time stalled on input.

The usual way to find out whether input limits training is to iterate the dataset without
training and print steps/s every 100 steps. :class:`ThroughputMeter` keeps that count
inside real training code:

    meter = ThroughputMeter()
    for batch in meter.wrap(loader, size=lambda b: (len(b), sum(map(len, b)))):
        train_step(batch)
        if step % 100 == 0:
            logger.info("input: %s", meter.interval())

Time spent inside ``next()`` of a wrapped iterable is *stalled* time: the training loop was
waiting for input. A stall fraction near zero means input is not the bottleneck. A
:class:`~trainport.data.dataset.ChannelDataset` given a meter also adds its own blocking
reads (FIFO waits, file and network reads) as stall, per record, in the process it runs in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Throughput", "ThroughputMeter", "default_size"]

T = TypeVar("T")


@dataclass(frozen=True)
class Throughput:
    """Counts over a span of wall-clock time, with the rates derived from them."""

    records: int
    bytes: int
    seconds: float
    stalled_seconds: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Decimal megabytes (10**6 bytes) per second, as network links are quoted."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def stalled_fraction(self) -> float:
        return min(1.0, self.stalled_seconds / self.seconds) if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """Flat numbers for a metrics logger (TensorBoard, MLflow, a log line)."""
        return {
            "records": float(self.records),
            "bytes": float(self.bytes),
            "seconds": self.seconds,
            "records_per_s": self.records_per_s,
            "mb_per_s": self.mb_per_s,
            "stalled_s": self.stalled_seconds,
            "stalled_fraction": self.stalled_fraction,
        }

    def __str__(self) -> str:
        return (
            f"{self.records_per_s:.1f} records/s, {self.mb_per_s:.2f} MB/s, "
            f"stalled {self.stalled_seconds:.3f} s ({self.stalled_fraction:.1%}) "
            f"over {self.seconds:.2f} s"
        )


def default_size(item: Any) -> tuple[int, int]:
    """(records, bytes) of one item: bytes-like is one record, a list/tuple of them many."""
    if isinstance(item, bytes | bytearray | memoryview):
        return 1, len(item)
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):
        return 1, nbytes
    if isinstance(item, list | tuple) and all(isinstance(x, bytes | bytearray) for x in item):
        return len(item), sum(len(x) for x in item)
    return 1, 0


class ThroughputMeter:
    """Counts records, bytes and stalled time; thread-safe; cheap enough to call per record."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._records = 0
        self._bytes = 0
        self._stalled = 0.0
        self._mark = (self._start, 0, 0, 0.0)

    def add(self, records: int = 1, nbytes: int = 0, stalled: float = 0.0) -> None:
        with self._lock:
            self._records += records
            self._bytes += nbytes
            self._stalled += stalled

    def add_stall(self, seconds: float) -> None:
        with self._lock:
            self._stalled += seconds

    def wrap(
        self, iterable: Iterable[T], size: Callable[[T], tuple[int, int]] = default_size
    ) -> Iterator[T]:
        """Yield from ``iterable``, counting each item and the time ``next()`` took as stall."""
        iterator = iter(iterable)
        while True:
            t0 = self._clock()
            try:
                item = next(iterator)
            except StopIteration:
                self.add_stall(self._clock() - t0)
                return
            waited = self._clock() - t0
            records, nbytes = size(item)
            self.add(records, nbytes, waited)
            yield item

    def total(self) -> Throughput:
        """Everything since the meter was made."""
        with self._lock:
            return Throughput(
                self._records, self._bytes, self._clock() - self._start, self._stalled
            )

    def interval(self) -> Throughput:
        """What happened since the previous ``interval()`` call (or since the start)."""
        with self._lock:
            now = self._clock()
            then, records, nbytes, stalled = self._mark
            self._mark = (now, self._records, self._bytes, self._stalled)
            return Throughput(
                self._records - records, self._bytes - nbytes, now - then, self._stalled - stalled
            )

    def log(self, logger: logging.Logger, label: str = "input", *, interval: bool = True) -> None:
        """One INFO line with the interval's (or the total's) throughput."""
        logger.info("%s: %s", label, self.interval() if interval else self.total())
