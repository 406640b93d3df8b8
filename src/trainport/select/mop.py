"""The MOP driver: runs a model-selection workload on a backend, epoch by epoch.

Each epoch the driver (1) plans the visit order of the active models with
:func:`~trainport.select.scheduler.plan_epoch`, (2) repeatedly asks
:func:`~trainport.select.scheduler.assign` what idle workers should run and submits it,
(3) blocks in :meth:`Backend.wait` and applies what comes back (a finished unit replaces
the model's state; a lost worker puts its unit back at the head of the model's order and
is restarted or retired), then (4) validates every model, records step-weighted epoch
metrics and lets the procedure stop or add configurations.

A model's state only changes when a unit *finishes*, so a unit lost mid-way is re-run from
the model's last state and nothing is counted twice.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from trainport.errors import JobError, ValidationError
from trainport.select.backends.api import Backend, UnitDone, UnitTask, WorkerLost
from trainport.select.partition import DataFile, fetch, list_files, split_partitions
from trainport.select.procedures import Decision, ModelView, Procedure, model_id
from trainport.select.result import (
    EpochRecord,
    SelectionResult,
    UnitRecord,
    pick_best,
    unreported,
)
from trainport.select.scheduler import Placement, assign, plan_epoch
from trainport.select.space import Config
from trainport.select.trainer import Trainer, UnitMetrics, step_weighted

__all__ = ["Workload", "model_seed", "replay", "run_workload"]

log = logging.getLogger(__name__)


def model_seed(seed: int, index: int) -> int:
    """The seed a model is initialized with: a function of the run seed and its index."""
    return (seed * 1_000_003 + index) % (2**31 - 1)


@dataclass
class Workload:
    """Everything a selection run needs besides the backend."""

    procedure: Procedure
    trainer: Trainer
    train: str | Path
    validation: str | Path | None
    epochs: int
    metric: str = "val_loss"
    direction: str = "min"
    partitions: int = 2
    replicas: int = 1
    seed: int = 0
    schedule: str = "planned"  # "planned": seed-fixed visit orders; "dynamic": Algorithm 1 live
    output: Path | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValidationError(f"epochs={self.epochs}: train for at least one epoch")
        if self.direction not in ("min", "max"):
            raise ValidationError(f"metric direction={self.direction!r}: use 'min' or 'max'")
        if not self.metric.startswith(("train_", "val_")):
            raise ValidationError(
                f"metric={self.metric!r}: name a train_<name> or val_<name> metric, e.g. val_loss"
            )
        if self.metric.startswith("val_") and self.validation is None:
            raise ValidationError(
                f"metric={self.metric!r} needs a validation set; set validation or use train_*"
            )
        if self.schedule not in ("planned", "dynamic"):
            raise ValidationError(f"schedule={self.schedule!r}: use 'planned' or 'dynamic'")


def run_workload(work: Workload, backend: Backend) -> SelectionResult:
    """Run ``work`` on ``backend`` (started and closed here) and return the result."""
    minimize = work.direction == "min"
    placement = Placement(work.partitions, work.replicas)
    files = list_files(work.train, field="train")
    partitions = split_partitions(files, work.partitions, work.seed)
    sizes = [sum(f.size for f in part) or 1 for part in partitions]
    trainer = work.trainer

    configs: dict[str, Config] = {}
    states: dict[str, Any] = {}
    costs: dict[str, float] = {}
    model_epochs: dict[str, int] = {}
    stopped: dict[str, int] = {}
    records: list[EpochRecord] = []
    units: list[UnitRecord] = []
    last_worker: dict[str, int] = {}
    # Retired workers (lost with another copy of their partition alive) stay retired.
    alive = set(range(placement.workers))

    with tempfile.TemporaryDirectory(prefix="trainport-select-val-") as cache:
        val_data = _load_validation(trainer, work.validation, Path(cache))
        backend.start(trainer, partitions, placement)
        try:

            def add(config: Config) -> None:
                mid = model_id(len(configs))
                configs[mid] = dict(config)
                seed = model_seed(work.seed, len(configs) - 1)
                states[mid] = backend.put_state(trainer.init_state(config, seed))
                costs[mid] = float(trainer.cost(config))
                model_epochs[mid] = 0

            for config in work.procedure.initial():
                add(config)
            if not configs:
                raise ValidationError("search: the search space produced no configurations")
            log.info(
                "select: %d configurations, %d partitions x %d replicas, %d epochs on %s",
                len(configs),
                placement.partitions,
                placement.replicas,
                work.epochs,
                backend.name,
            )
            t0 = time.time()
            for rnd in range(1, work.epochs + 1):
                active = [m for m in configs if m not in stopped]
                if not active:
                    break
                done = _run_epoch(
                    work,
                    backend,
                    placement,
                    rnd,
                    active,
                    configs,
                    states,
                    model_epochs,
                    costs,
                    sizes,
                    units,
                    last_worker,
                    alive,
                    t0,
                )
                for mid in active:
                    model_epochs[mid] += 1
                    val = (
                        trainer.evaluate(backend.get_state(states[mid]), val_data, configs[mid])
                        if val_data is not None
                        else {}
                    )
                    per_unit = done[mid]
                    records.append(
                        EpochRecord(
                            mid,
                            model_epochs[mid],
                            rnd,
                            sum(u.steps for u in per_unit),
                            step_weighted(per_unit),
                            val,
                        )
                    )
                # A metric the trainer never reports would leave every model unranked:
                # say so after one epoch rather than train every epoch for nothing.
                if rnd == 1 and (problem := unreported(records, work.metric)):
                    raise ValidationError(problem)
                views = {
                    m: ModelView(
                        configs[m],
                        tuple(r.metric(work.metric) for r in records if r.model == m),
                        m not in stopped,
                    )
                    for m in configs
                }
                decision: Decision = work.procedure.after_epoch(rnd, views, minimize)
                for mid in sorted(decision.stop):
                    if mid in configs and mid not in stopped:
                        stopped[mid] = rnd
                        log.info("select: %s stopped after epoch %d", mid, rnd)
                for config in decision.add:
                    add(config)
                _log_epoch(rnd, records, work.metric, minimize)
            result = SelectionResult(
                configs=configs,
                epochs=records,
                units=units,
                metric=work.metric,
                minimize=minimize,
                backend=backend.name,
                seed=work.seed,
                stopped=stopped,
                workers=backend.stats(),
            )
            best = pick_best(records, work.metric, minimize)
            if best is not None:
                result.best_model, result.best_value = best
                if work.output is not None:
                    path = Path(work.output) / "best_model.pt"
                    trainer.save_model(backend.get_state(states[best[0]]), configs[best[0]], path)
                    result.model_path = path
            result.final_states = {m: backend.get_state(h) for m, h in states.items()}
        finally:
            backend.close()
    if work.output is not None:
        result.write(Path(work.output))
    return result


def _run_epoch(
    work: Workload,
    backend: Backend,
    placement: Placement,
    rnd: int,
    active: list[str],
    configs: dict[str, Config],
    states: dict[str, Any],
    model_epochs: dict[str, int],
    costs: dict[str, float],
    sizes: list[int],
    units: list[UnitRecord],
    last_worker: dict[str, int],
    alive: set[int],
    t0: float,
) -> dict[str, list[UnitMetrics]]:
    seed = f"{work.seed}/{rnd}"
    # Plan on one copy per partition: visit orders (and so every number a model ends up
    # with) then do not depend on how many replicas there are or which of them survive.
    single = Placement(placement.partitions)
    plan = plan_epoch(active, single, seed, lambda m, p: costs[m] * sizes[p])
    remaining: dict[str, list[int]] = {m: list(plan.visit_order[m]) for m in active}
    ordered = work.schedule == "planned"
    busy: set[str] = set()
    running: dict[int, Any] = {}
    done: dict[str, list[UnitMetrics]] = {m: [] for m in active}
    decision = 0
    total = len(active) * placement.partitions
    bar = tqdm(
        total=total,
        desc=f"epoch {rnd}/{work.epochs}",
        unit="unit",
        disable=not work.progress,
        leave=False,
    )
    try:
        while any(remaining.values()) or running:
            idle = sorted(w for w in alive if w not in running)
            for unit in assign(
                remaining, busy, idle, placement, f"{seed}/run/{decision}", ordered=ordered
            ):
                remaining[unit.model].remove(unit.partition)
                busy.add(unit.model)
                running[unit.worker] = unit
                backend.submit(
                    UnitTask(
                        unit, model_epochs[unit.model] + 1, configs[unit.model], states[unit.model]
                    )
                )
            decision += 1
            if not running:
                raise JobError(
                    f"epoch {rnd}: no live worker holds a partition that models still need"
                )
            for event in backend.wait():
                if isinstance(event, UnitDone):
                    u = event.unit
                    running.pop(u.worker, None)
                    busy.discard(u.model)
                    states[u.model] = event.state
                    done[u.model].append(event.metrics)
                    hopped = u.model in last_worker and last_worker[u.model] != u.worker
                    last_worker[u.model] = u.worker
                    units.append(
                        UnitRecord(
                            rnd,
                            u.model,
                            model_epochs[u.model] + 1,
                            u.partition,
                            u.worker,
                            event.started - t0,
                            event.ended - t0,
                            "done",
                            event.state_bytes,
                            hopped,
                            event.metrics.steps,
                            dict(event.metrics.metrics),
                        )
                    )
                    bar.update(1)
                elif isinstance(event, WorkerLost):
                    _recover(
                        event,
                        backend,
                        placement,
                        alive,
                        running,
                        busy,
                        remaining,
                        units,
                        rnd,
                        model_epochs,
                        t0,
                    )
    finally:
        bar.close()
    return done


def _recover(
    event: WorkerLost,
    backend: Backend,
    placement: Placement,
    alive: set[int],
    running: dict[int, Any],
    busy: set[str],
    remaining: dict[str, list[int]],
    units: list[UnitRecord],
    rnd: int,
    model_epochs: dict[str, int],
    t0: float,
) -> None:
    running.pop(event.worker, None)
    lost = event.unit
    log.warning("select: worker %d lost (%s) while running %s", event.worker, event.reason, lost)
    if lost is not None:
        busy.discard(lost.model)
        # Back to the head: the planned order of this model is unchanged.
        remaining[lost.model].insert(0, lost.partition)
        now = time.time() - t0
        units.append(
            UnitRecord(
                rnd,
                lost.model,
                model_epochs[lost.model] + 1,
                lost.partition,
                event.worker,
                now,
                now,
                "lost",
            )
        )
    partition = placement.partition_of(event.worker)
    others = [w for w in placement.holders(partition) if w in alive and w != event.worker]
    if others:
        # Another replica holds the data: finish the epoch there, no reload needed.
        alive.discard(event.worker)
        log.info("select: partition %d continues on worker(s) %s", partition, others)
    else:
        backend.restart(event.worker)


def _load_validation(trainer: Trainer, source: str | Path | None, cache: Path) -> Any:
    if source is None:
        return None
    files = list_files(source, field="validation")
    return trainer.load_partition([fetch(f, cache) for f in files])


def _log_epoch(rnd: int, records: Sequence[EpochRecord], metric: str, minimize: bool) -> None:
    current = [r for r in records if r.round == rnd]
    values = [r.metric(metric) for r in current if math.isfinite(r.metric(metric))]
    if values:
        best = min(values) if minimize else max(values)
        log.info("select: epoch %d done, %d models, best %s %.6g", rnd, len(current), metric, best)


def replay(
    trainer: Trainer,
    result: SelectionResult,
    partitions: Sequence[Sequence[DataFile]],
) -> dict[str, bytes]:
    """Re-run the logged visit order of every model sequentially in this process.

    Used to check that hopping loses nothing: the states must match the distributed run.
    """
    with tempfile.TemporaryDirectory(prefix="trainport-select-replay-") as cache:
        data = [
            trainer.load_partition([fetch(f, Path(cache)) for f in part]) for part in partitions
        ]
        states: dict[str, bytes] = {}
        for index, (mid, config) in enumerate(result.configs.items()):
            states[mid] = trainer.init_state(config, model_seed(result.seed, index))
        # The log is in completion order, and a model's units never overlap, so for each
        # model it is exactly its visit order.
        for u in (u for u in result.units if u.status == "done"):
            states[u.model], _ = trainer.train_unit(
                states[u.model], data[u.partition], result.configs[u.model], u.epoch
            )
        return states
