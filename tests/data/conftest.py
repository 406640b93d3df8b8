"""Fixtures for trainport.data tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.data.support import FifoProducer


@pytest.fixture
def fifo_producers() -> Iterator[Callable[..., FifoProducer]]:
    started: list[FifoProducer] = []

    def start(
        directory: Path,
        name: str,
        payload: Callable[[int], bytes],
        epochs: int,
        start_delay: float = 0.0,
    ) -> FifoProducer:
        producer = FifoProducer(directory, name, payload, epochs, start_delay)
        producer.start()
        started.append(producer)
        return producer

    yield start
    for producer in started:
        producer.stop()
