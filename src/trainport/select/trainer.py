"""The framework-neutral trainer contract that every backend drives.

A trainer turns a configuration into *hop state* and advances that state one unit at a
time. Hop state is opaque ``bytes`` holding everything training needs to resume exactly
where it stopped (weights, optimizer state, RNG state, step and epoch counters), so a
backend can move it between workers without knowing the framework, and the bytes moved
can be counted.

:class:`~trainport.select.pytorch.TorchTrainer` is the PyTorch implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainport.select.space import Config

__all__ = ["Trainer", "UnitMetrics", "step_weighted"]


@dataclass(frozen=True)
class UnitMetrics:
    """What one unit reports: how many optimizer steps it took and per-step means."""

    steps: int
    samples: int
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Trainer(Protocol):
    def load_partition(self, files: Sequence[Path]) -> Any:
        """Load a partition's files into memory once; workers keep the result."""
        ...

    def data_bytes(self, data: Any) -> int:
        """Bytes of memory the loaded partition occupies."""
        ...

    def init_state(self, config: Config, seed: int) -> bytes:
        """Fresh hop state for a configuration, fully determined by ``seed``."""
        ...

    def train_unit(
        self, state: bytes, data: Any, config: Config, epoch: int
    ) -> tuple[bytes, UnitMetrics]:
        """One pass over ``data`` in logical epoch ``epoch`` (1-based); returns new state."""
        ...

    def evaluate(self, state: bytes, data: Any, config: Config) -> dict[str, float]:
        """Metrics of the model in ``state`` on ``data`` (a loaded validation set)."""
        ...

    def save_model(self, state: bytes, config: Config, path: Path) -> None:
        """Write the model in a form its framework loads without trainport."""
        ...

    def cost(self, config: Config) -> float:
        """Relative cost of one unit of this configuration (used only to plan)."""
        ...


def step_weighted(units: Sequence[UnitMetrics]) -> dict[str, float]:
    """Epoch metrics as the step-weighted means of the units' per-step means.

    Partitions may differ in size, so a plain mean of unit means would over-weight
    the small ones; weighting by steps gives the mean over every step of the epoch.
    """
    total = sum(u.steps for u in units)
    if total == 0:
        return {}
    names = sorted({k for u in units for k in u.metrics})
    return {name: sum(u.metrics.get(name, 0.0) * u.steps for u in units) / total for name in names}
