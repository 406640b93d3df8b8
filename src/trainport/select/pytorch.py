"""The PyTorch trainer: hop state as bytes that resume training exactly.

Hop state is a ``torch.save`` of a dict with the model's ``state_dict``, the optimizer's,
the learning-rate schedule's, the model's own shuffling generator, the global torch RNG
(dropout and other in-model randomness), the step count and the logical epoch last
trained. Restoring all of it is what makes a unit on another worker continue the same SGD
trajectory, so replaying the logged visit order in one process gives the same weights.

Learning-rate schedules advance once per *logical* epoch: the first unit a model runs in
a new epoch steps the schedule, the other ``p - 1`` units of that epoch do not.

Callables given to :class:`TorchTrainer` must be picklable (module-level functions or
``functools.partial`` of them) because worker processes receive the trainer.
"""

from __future__ import annotations

import io
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainport.errors import ValidationError
from trainport.select.space import Config
from trainport.select.trainer import UnitMetrics

__all__ = ["TorchTrainer", "default_optimizer", "load_npz_files"]

log = logging.getLogger(__name__)

ModelBuilder = Callable[[Config], nn.Module]
OptimizerBuilder = Callable[[Config, Iterable[nn.Parameter]], torch.optim.Optimizer]
ScheduleBuilder = Callable[[Config, torch.optim.Optimizer], Any]


def default_optimizer(config: Config, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """SGD with ``lr``, ``momentum`` and ``weight_decay`` from the configuration."""
    return torch.optim.SGD(
        params,
        lr=float(config.get("lr", 0.01)),
        momentum=float(config.get("momentum", 0.0)),
        weight_decay=float(config.get("weight_decay", 0.0)),
    )


def load_npz_files(files: Sequence[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the ``x`` and ``y`` arrays of ``.npz`` files into two tensors."""
    xs, ys = [], []
    for path in files:
        try:
            with np.load(path) as arrays:
                xs.append(np.asarray(arrays["x"], dtype=np.float32))
                ys.append(np.asarray(arrays["y"]))
        except (KeyError, ValueError, OSError) as exc:
            raise ValidationError(
                f"data file {path}: cannot read arrays 'x' and 'y' from it as .npz ({exc})"
            ) from exc
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))


@dataclass(frozen=True)
class TorchTrainer:
    """A :class:`~trainport.select.trainer.Trainer` for PyTorch models on tensors.

    ``task`` "classification" uses cross-entropy and reports accuracy; "regression" uses
    mean squared error. ``batch_size`` may be overridden per configuration by a
    ``batch_size`` key. ``threads`` bounds torch's intra-op threads per worker, which also
    keeps results bit-identical across processes.
    """

    build_model: ModelBuilder
    build_optimizer: OptimizerBuilder = default_optimizer
    build_schedule: ScheduleBuilder | None = None
    task: str = "classification"
    batch_size: int = 256
    threads: int = 1

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise ValidationError(f"task={self.task!r}: use 'classification' or 'regression'")

    # -- data -------------------------------------------------------------------------
    def load_partition(self, files: Sequence[Path]) -> tuple[torch.Tensor, torch.Tensor]:
        torch.set_num_threads(self.threads)
        return load_npz_files(files)

    def data_bytes(self, data: Any) -> int:
        x, y = data
        return int(x.element_size() * x.nelement() + y.element_size() * y.nelement())

    # -- state ------------------------------------------------------------------------
    def _parts(self, config: Config) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
        model = self.build_model(config)
        optimizer = self.build_optimizer(config, model.parameters())
        schedule = self.build_schedule(config, optimizer) if self.build_schedule else None
        return model, optimizer, schedule

    def init_state(self, config: Config, seed: int) -> bytes:
        torch.set_num_threads(self.threads)
        torch.manual_seed(seed)
        model, optimizer, schedule = self._parts(config)
        shuffle = torch.Generator().manual_seed(seed + 1)
        return _dump(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict() if schedule is not None else None,
                "shuffle_rng": shuffle.get_state(),
                "torch_rng": torch.random.get_rng_state(),
                "step": 0,
                "epoch": 0,
            }
        )

    def _restore(self, state: bytes, config: Config) -> tuple[dict[str, Any], nn.Module, Any, Any]:
        saved = torch.load(io.BytesIO(state), weights_only=False)
        model, optimizer, schedule = self._parts(config)
        model.load_state_dict(saved["model"])
        # After the schedule's constructor: it resets the lr, the saved optimizer restores it.
        optimizer.load_state_dict(saved["optimizer"])
        if schedule is not None and saved["schedule"] is not None:
            schedule.load_state_dict(saved["schedule"])
        return saved, model, optimizer, schedule

    # -- training ---------------------------------------------------------------------
    def _batch(self, config: Config) -> int:
        return int(config.get("batch_size", self.batch_size))

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.task == "classification":
            return nn.functional.cross_entropy(out, y.long())
        return nn.functional.mse_loss(out.reshape(y.shape), y.float())

    def train_unit(
        self, state: bytes, data: Any, config: Config, epoch: int
    ) -> tuple[bytes, UnitMetrics]:
        torch.set_num_threads(self.threads)
        saved, model, optimizer, schedule = self._restore(state, config)
        if schedule is not None and saved["epoch"] > 0:
            # One schedule step per logical epoch entered, however many partitions it has.
            with warnings.catch_warnings():
                # The optimizer did step, in the units before, possibly on another worker.
                warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")
                for _ in range(max(0, epoch - saved["epoch"])):
                    schedule.step()
        torch.random.set_rng_state(saved["torch_rng"])
        shuffle = torch.Generator()
        shuffle.set_state(saved["shuffle_rng"])
        x, y = data
        order = torch.randperm(len(x), generator=shuffle)
        batch = self._batch(config)
        model.train()
        steps = 0
        loss_sum = 0.0
        correct = 0
        for start in range(0, len(x), batch):
            idx = order[start : start + batch]
            xb, yb = x[idx], y[idx]
            optimizer.zero_grad(set_to_none=True)
            out = model(xb)
            loss = self._loss(out, yb)
            loss.backward()
            optimizer.step()
            steps += 1
            loss_sum += float(loss.detach())
            if self.task == "classification":
                correct += int((out.detach().argmax(dim=1) == yb).sum())
        if steps and not math.isfinite(loss_sum):
            log.warning("config %s: training loss is not finite in epoch %d", config, epoch)
        metrics = {"loss": loss_sum / steps} if steps else {}
        if self.task == "classification" and steps:
            # Per-step mean of batch accuracy would weight a short last batch too much;
            # report the unit's accuracy, weighted by steps at the epoch level like loss.
            metrics["accuracy"] = correct / len(x)
        saved.update(
            model=model.state_dict(),
            optimizer=optimizer.state_dict(),
            schedule=schedule.state_dict() if schedule is not None else None,
            shuffle_rng=shuffle.get_state(),
            torch_rng=torch.random.get_rng_state(),
            step=saved["step"] + steps,
            epoch=epoch,
        )
        return _dump(saved), UnitMetrics(steps=steps, samples=len(x), metrics=metrics)

    @torch.no_grad()
    def evaluate(self, state: bytes, data: Any, config: Config) -> dict[str, float]:
        torch.set_num_threads(self.threads)
        saved = torch.load(io.BytesIO(state), weights_only=False)
        model = self.build_model(config)
        model.load_state_dict(saved["model"])
        model.eval()
        x, y = data
        loss_sum, correct = 0.0, 0
        chunk = 8192
        for start in range(0, len(x), chunk):
            xb, yb = x[start : start + chunk], y[start : start + chunk]
            out = model(xb)
            loss_sum += float(self._loss(out, yb)) * len(xb)
            if self.task == "classification":
                correct += int((out.argmax(dim=1) == yb).sum())
        result = {"loss": loss_sum / max(1, len(x))}
        if self.task == "classification":
            result["accuracy"] = correct / max(1, len(x))
        return result

    def save_model(self, state: bytes, config: Config, path: Path) -> None:
        saved = torch.load(io.BytesIO(state), weights_only=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"config": dict(config), "state_dict": saved["model"]}, path)

    def cost(self, config: Config) -> float:
        # FLOPs per sample scale with the parameter count for dense models.
        model = self.build_model(config)
        return float(sum(p.numel() for p in model.parameters()))

    # -- inspection (tests and replay) --------------------------------------------------
    @staticmethod
    def weights(state: bytes) -> dict[str, torch.Tensor]:
        return dict(torch.load(io.BytesIO(state), weights_only=False)["model"])

    @staticmethod
    def counters(state: bytes) -> dict[str, Any]:
        saved = torch.load(io.BytesIO(state), weights_only=False)
        lr = [g["lr"] for g in saved["optimizer"]["param_groups"]]
        return {"step": saved["step"], "epoch": saved["epoch"], "lr": lr}


def _dump(obj: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
