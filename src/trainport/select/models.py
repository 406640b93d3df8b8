"""Ready-made model builders for specs, examples, tests and benchmarks.

``trainer: trainport.select.models:mlp_trainer`` in a spec gives a
:class:`~trainport.select.pytorch.TorchTrainer` of :func:`build_mlp` with the spec's
``trainer_args``; configurations may then set ``hidden``, ``layers``, ``dropout``, ``lr``,
``momentum``, ``weight_decay``, ``batch_size`` and ``lr_decay``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from trainport.select.pytorch import TorchTrainer
from trainport.select.space import Config

__all__ = ["build_mlp", "mlp_trainer", "step_decay"]


def build_mlp(config: Config, *, in_features: int, out_features: int) -> nn.Module:
    """An MLP with ``layers`` hidden layers of ``hidden`` units, ReLU and optional dropout."""
    hidden = int(config.get("hidden", 64))
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(int(config.get("layers", 1))):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        if float(config.get("dropout", 0.0)) > 0:
            layers.append(nn.Dropout(float(config["dropout"])))
        width = hidden
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


def step_decay(config: Config, optimizer: torch.optim.Optimizer) -> Any:
    """Multiply the learning rate by ``lr_decay`` (default 1: constant) every epoch."""
    return torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=1, gamma=float(config.get("lr_decay", 1.0))
    )


def mlp_trainer(
    in_features: int,
    out_features: int = 2,
    task: str = "classification",
    batch_size: int = 256,
    threads: int = 1,
) -> TorchTrainer:
    return TorchTrainer(
        build_model=functools.partial(
            build_mlp, in_features=in_features, out_features=out_features
        ),
        build_schedule=step_decay,
        task=task,
        batch_size=batch_size,
        threads=threads,
    )
