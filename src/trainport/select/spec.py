"""``spec.yaml`` for ``trainport select``: a validated description of a selection run.

Example::

    trainer: trainport.select.models:mlp_trainer   # module:callable returning a Trainer
    trainer_args: {in_features: 32, out_features: 2}
    train: s3://bucket/data/train/                 # or a folder; relative to this file
    validation: s3://bucket/data/val/
    epochs: 5
    metric: val_loss
    direction: min
    partitions: 2
    backend: local                                 # local | ray | spark
    search:
      procedure: random                            # grid | random | successive_halving | hyperband
      samples: 8
      params:
        lr: {loguniform: [0.0001, 0.1]}
        hidden: {choice: [16, 32, 64]}
    output: ./select-out
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from trainport.errors import NotFoundError, ValidationError
from trainport.select.procedures import FixedSearch, HyperBand, Procedure, SuccessiveHalving
from trainport.select.space import GridSpace, RandomSpace, parse_distribution
from trainport.select.trainer import Trainer
from trainport.yamldoc import load_yaml

__all__ = ["SearchSpec", "SelectSpec", "load_spec"]


class SearchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    procedure: Literal["grid", "random", "successive_halving", "hyperband"] = "grid"
    params: dict[str, Any]
    samples: int | None = Field(default=None, ge=1)
    eta: int = Field(default=3, ge=2)
    min_epochs: int = Field(default=1, ge=1)


class SelectSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trainer: str
    trainer_args: dict[str, Any] = Field(default_factory=dict)
    train: str
    validation: str | None = None
    epochs: int = Field(ge=1)
    metric: str = "val_loss"
    direction: Literal["min", "max"] = "min"
    partitions: int = Field(default=2, ge=1)
    replicas: int = Field(default=1, ge=1)
    backend: Literal["local", "ray", "spark"] = "local"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    schedule: Literal["planned", "dynamic"] = "planned"
    search: SearchSpec
    output: str = "select-out"

    def build_trainer(self) -> Trainer:
        module_name, _, attr = self.trainer.partition(":")
        if not module_name or not attr:
            raise ValidationError(
                f"trainer: {self.trainer!r} should read module:callable, "
                "e.g. trainport.select.models:mlp_trainer"
            )
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValidationError(f"trainer: cannot import {self.trainer!r} ({exc})") from exc
        trainer = factory(**self.trainer_args)
        if not isinstance(trainer, Trainer):
            raise ValidationError(
                f"trainer: {self.trainer!r} returned {type(trainer).__name__}, which lacks the "
                "Trainer methods (init_state, train_unit, evaluate, ...)"
            )
        return trainer

    def build_procedure(self) -> Procedure:
        s = self.search
        if s.procedure == "grid":
            for name, values in s.params.items():
                if not isinstance(values, list):
                    raise ValidationError(
                        f"search.params.{name}: grid search needs a list of values"
                    )
            return FixedSearch(GridSpace(s.params), s.samples, self.seed)
        space = RandomSpace({k: parse_distribution(k, v) for k, v in s.params.items()})
        if s.procedure == "hyperband":
            return HyperBand(space, self.epochs, s.eta, self.seed)
        if s.samples is None:
            raise ValidationError(f"search.samples: {s.procedure} search needs a number of samples")
        if s.procedure == "random":
            return FixedSearch(space, s.samples, self.seed)
        return SuccessiveHalving(space, s.samples, s.eta, s.min_epochs, self.seed)


def load_spec(path: Path) -> SelectSpec:
    """Read and validate a spec; relative data and output paths are taken from its folder."""
    if not path.is_file():
        raise NotFoundError(f"spec: {path} does not exist")
    raw = load_yaml(path.read_text(), f"spec {path}")
    if not isinstance(raw, dict):
        raise ValidationError(f"spec {path}: expected a mapping of fields at the top level")
    try:
        spec = SelectSpec.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ValidationError(f"spec {path}: {problems}") from exc
    base = path.parent

    def resolve(value: str | None) -> str | None:
        if value is None or value.startswith("s3://") or Path(value).is_absolute():
            return value
        return str((base / value).resolve())

    return spec.model_copy(
        update={
            "train": resolve(spec.train),
            "validation": resolve(spec.validation),
            "output": resolve(spec.output),
        }
    )
