"""Helpers shared by the select tests (imported by worker processes too, so no pytest)."""

from __future__ import annotations

import itertools
import math
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainport.select import FixedSearch, GridSpace, Workload
from trainport.select.models import mlp_trainer
from trainport.select.pytorch import TorchTrainer
from trainport.select.space import Config
from trainport.select.trainer import UnitMetrics

FEATURES = 6

GRID = GridSpace({"lr": [0.2, 0.05], "hidden": [4, 8], "lr_decay": [0.5]})


def trainer() -> TorchTrainer:
    return mlp_trainer(FEATURES, batch_size=32)


@dataclass(frozen=True)
class KillOnce:
    """A trainer that kills its own worker process after training one unit of ``epoch``.

    The unit's work is done but its result never reaches the driver, which is what a
    crash mid-unit looks like from outside. A marker file claimed with O_EXCL makes it
    happen exactly once across all workers.
    """

    inner: TorchTrainer
    marker: str
    epoch: int = 2

    def load_partition(self, files: Any) -> Any:
        return self.inner.load_partition(files)

    def data_bytes(self, data: Any) -> int:
        return self.inner.data_bytes(data)

    def init_state(self, config: Config, seed: int) -> bytes:
        return self.inner.init_state(config, seed)

    def evaluate(self, state: bytes, data: Any, config: Config) -> dict[str, float]:
        return self.inner.evaluate(state, data, config)

    def save_model(self, state: bytes, config: Config, path: Path) -> None:
        self.inner.save_model(state, config, path)

    def cost(self, config: Config) -> float:
        return self.inner.cost(config)

    def train_unit(
        self, state: bytes, data: Any, config: Config, epoch: int
    ) -> tuple[bytes, UnitMetrics]:
        result = self.inner.train_unit(state, data, config, epoch)
        if epoch == self.epoch:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return result
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def workload(dataset: Path, **overrides: Any) -> Workload:
    options: dict[str, Any] = dict(
        procedure=FixedSearch(GRID),
        trainer=trainer(),
        train=dataset / "train",
        validation=dataset / "val",
        epochs=3,
        metric="val_loss",
        partitions=2,
        seed=7,
        progress=False,
    )
    options.update(overrides)
    return Workload(**options)


def unit_intervals(result: Any, key: str) -> dict[Any, list[tuple[float, float]]]:
    out: dict[Any, list[tuple[float, float]]] = {}
    for u in result.units:
        if u.status == "done":
            out.setdefault(getattr(u, key), []).append((u.start, u.end))
    return out


def assert_no_overlap(intervals: dict[Any, list[tuple[float, float]]]) -> None:
    for owner, spans in intervals.items():
        spans = sorted(spans)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"{owner}: units overlap ({start} < {end})"


def final_weights(result: Any) -> dict[str, dict[str, Any]]:
    return {m: TorchTrainer.weights(s) for m, s in result.final_states.items()}


def max_weight_diff(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for m in a:
        for name, tensor in a[m].items():
            worst = max(worst, float((tensor - b[m][name]).abs().max()))
    return worst


def marker_path(tmp: Path) -> str:
    return str(tmp / "killed.marker")


@dataclass(frozen=True)
class NaNValidation:
    """A trainer whose validation metrics are all NaN, as a diverged model's are."""

    inner: TorchTrainer

    def load_partition(self, files: Any) -> Any:
        return self.inner.load_partition(files)

    def data_bytes(self, data: Any) -> int:
        return self.inner.data_bytes(data)

    def init_state(self, config: Config, seed: int) -> bytes:
        return self.inner.init_state(config, seed)

    def evaluate(self, state: bytes, data: Any, config: Config) -> dict[str, float]:
        return {name: math.nan for name in self.inner.evaluate(state, data, config)}

    def save_model(self, state: bytes, config: Config, path: Path) -> None:
        self.inner.save_model(state, config, path)

    def cost(self, config: Config) -> float:
        return self.inner.cost(config)

    def train_unit(
        self, state: bytes, data: Any, config: Config, epoch: int
    ) -> tuple[bytes, UnitMetrics]:
        return self.inner.train_unit(state, data, config, epoch)


def nan_trainer(in_features: int, batch_size: int) -> NaNValidation:
    """``trainer:`` of a spec: the MLP, its validation metrics NaN."""
    return NaNValidation(mlp_trainer(in_features, batch_size=batch_size))
