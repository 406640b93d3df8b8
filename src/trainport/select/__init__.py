"""Model selection with model hopper parallelism (MOP), after Cerebro (VLDB 2020).

Many configurations are trained on the same data: the data is split once into partitions,
one per worker, and models hop between workers so every model trains on every partition
each epoch while the data never moves.

Pieces, from pure to effectful:

- :mod:`~trainport.select.space`: search spaces (grid; random with uniform, log-uniform,
  quantized and choice distributions);
- :mod:`~trainport.select.procedures`: grid/random search, successive halving, HyperBand;
- :mod:`~trainport.select.scheduler`: the MOP scheduler (Algorithm 1) as pure functions;
- :mod:`~trainport.select.trainer`: the framework-neutral trainer contract, with
  :mod:`~trainport.select.pytorch` its PyTorch implementation;
- :mod:`~trainport.select.backends`: local processes, Ray actors, a Spark barrier stage;
- :mod:`~trainport.select.mop`: the driver; :mod:`~trainport.select.result`: its output.

:func:`select` is the Python API; ``trainport select spec.yaml`` the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainport.select.backends import Backend, make_backend
from trainport.select.mop import Workload, run_workload
from trainport.select.procedures import (
    Decision,
    FixedSearch,
    HyperBand,
    ModelView,
    Procedure,
    SuccessiveHalving,
)
from trainport.select.result import SelectionResult
from trainport.select.space import (
    Choice,
    GridSpace,
    LogUniform,
    Quantized,
    RandomSpace,
    Uniform,
)
from trainport.select.trainer import Trainer, UnitMetrics

__all__ = [
    "Choice",
    "Decision",
    "FixedSearch",
    "GridSpace",
    "HyperBand",
    "LogUniform",
    "ModelView",
    "Procedure",
    "Quantized",
    "RandomSpace",
    "SelectionResult",
    "SuccessiveHalving",
    "Trainer",
    "Uniform",
    "UnitMetrics",
    "Workload",
    "select",
]


def select(
    procedure: Procedure,
    trainer: Trainer,
    *,
    train: str | Path,
    validation: str | Path | None = None,
    epochs: int,
    metric: str = "val_loss",
    direction: str = "min",
    partitions: int = 2,
    replicas: int = 1,
    backend: str | Backend = "local",
    backend_options: dict[str, Any] | None = None,
    seed: int = 0,
    schedule: str = "planned",
    output: str | Path | None = None,
    progress: bool = True,
) -> SelectionResult:
    """Train every configuration of ``procedure`` with MOP and return the result.

    ``train`` and ``validation`` are folders or ``s3://`` prefixes of data files;
    ``metric`` is ``train_<name>`` or ``val_<name>`` and ``direction`` ``min`` or ``max``.
    """
    work = Workload(
        procedure=procedure,
        trainer=trainer,
        train=train,
        validation=validation,
        epochs=epochs,
        metric=metric,
        direction=direction,
        partitions=partitions,
        replicas=replicas,
        seed=seed,
        schedule=schedule,
        output=Path(output) if output is not None else None,
        progress=progress,
    )
    runner = (
        backend
        if isinstance(backend, Backend)
        else make_backend(backend, **(backend_options or {}))
    )
    return run_workload(work, runner)
