"""ThroughputMeter: counting, stall time in wrapped iteration, intervals."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from trainport.data import ThroughputMeter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_wrap_counts_items_and_time_waiting_as_stall() -> None:
    clock = FakeClock()
    meter = ThroughputMeter(clock=clock)

    def slow_source() -> Iterator[bytes]:
        for _ in range(4):
            clock.now += 0.5  # waiting for input
            yield b"x" * 1_000_000

    for _item in meter.wrap(slow_source()):
        clock.now += 1.5  # training step
    total = meter.total()
    assert total.records == 4 and total.bytes == 4_000_000
    assert total.seconds == pytest.approx(8.0)
    assert total.stalled_seconds == pytest.approx(2.0)
    assert total.records_per_s == pytest.approx(0.5)
    assert total.mb_per_s == pytest.approx(0.5)
    assert total.stalled_fraction == pytest.approx(0.25)


def test_interval_reports_since_previous_call(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    meter = ThroughputMeter(clock=clock)
    meter.add(10, 1000)
    clock.now += 2
    first = meter.interval()
    assert (first.records, first.bytes, first.seconds) == (10, 1000, 2)
    meter.add(5, 500, stalled=0.5)
    clock.now += 1
    caplog.set_level(logging.INFO)
    meter.log(logging.getLogger("train"))
    assert "5.0 records/s" in caplog.text and "stalled 0.500 s" in caplog.text
    assert meter.total().records == 15
    assert set(meter.total().as_dict()) >= {"records_per_s", "mb_per_s", "stalled_fraction"}


def test_batches_of_bytes_count_each_record() -> None:
    meter = ThroughputMeter()
    list(meter.wrap([[b"ab", b"cde"], [b"f"]]))
    assert (meter.total().records, meter.total().bytes) == (3, 6)
