"""What a selection run gives back: the epoch table, the best model and the schedule.

:class:`SelectionResult` holds plain records; :meth:`SelectionResult.write` lays them out
in a folder (``epochs.csv``, ``schedule.csv``, ``result.json``, ``gantt.png``; the best
model is saved there by the driver). The best configuration is the one whose *last*
epoch's metric is best in the metric's direction, since that is the model that was saved.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainport.select.backends.api import WorkerStats
from trainport.select.space import Config

__all__ = ["EpochRecord", "SelectionResult", "UnitRecord", "pick_best", "unreported"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpochRecord:
    model: str
    epoch: int  # the model's logical epoch (1-based)
    round: int  # the MOP epoch of the whole workload it ran in
    steps: int
    train: dict[str, float]
    validation: dict[str, float]

    def metric(self, name: str) -> float:
        """``train_<m>`` or ``val_<m>``; NaN when missing."""
        prefix, _, key = name.partition("_")
        source = self.train if prefix == "train" else self.validation if prefix == "val" else {}
        return float(source.get(key, math.nan))

    def names(self) -> list[str]:
        """The metrics this epoch reported, as a spec names them (``train_<m>``, ``val_<m>``)."""
        return [f"train_{k}" for k in self.train] + [f"val_{k}" for k in self.validation]


@dataclass(frozen=True)
class UnitRecord:
    round: int
    model: str
    epoch: int
    partition: int
    worker: int
    start: float  # seconds since training started
    end: float
    status: str  # "done" or "lost"
    state_bytes: int = 0
    hopped: bool = False  # the model came from another worker
    steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def unreported(records: Sequence[EpochRecord], metric: str) -> str | None:
    """None if some epoch in ``records`` reported ``metric`` (a NaN value counts: a model
    may diverge); else a sentence that names the metrics the trainer does report."""
    if not records or any(metric in r.names() for r in records):
        return None
    reported = sorted({name for r in records for name in r.names()})
    return (
        f"metric={metric!r}: the trainer reported no such metric in the first epoch; it "
        f"reports {', '.join(reported) or 'none'}. Set metric to one of those"
    )


def pick_best(
    records: Sequence[EpochRecord], metric: str, minimize: bool
) -> tuple[str, float] | None:
    """The model whose last epoch has the best finite ``metric``; ties go to the lower name."""
    last: dict[str, EpochRecord] = {}
    for r in records:
        if r.model not in last or r.epoch > last[r.model].epoch:
            last[r.model] = r
    scored = [(r.metric(metric), m) for m, r in last.items() if math.isfinite(r.metric(metric))]
    if not scored:
        return None
    value, model = min(scored, key=lambda t: (t[0] if minimize else -t[0], t[1]))
    return model, value


@dataclass
class SelectionResult:
    configs: dict[str, Config]
    epochs: list[EpochRecord]
    units: list[UnitRecord]
    metric: str
    minimize: bool
    backend: str
    seed: int
    best_model: str | None = None
    best_value: float = math.nan
    model_path: Path | None = None
    stopped: dict[str, int] = field(default_factory=dict)  # model -> round it was stopped after
    workers: list[WorkerStats] = field(default_factory=list)
    # Every model's final hop state; kept in memory for inspection, not written out.
    final_states: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def best_config(self) -> Config | None:
        return self.configs.get(self.best_model) if self.best_model else None

    # -- figures ------------------------------------------------------------------------
    @property
    def makespan(self) -> float:
        done = [u for u in self.units if u.status == "done"]
        if not done:
            return 0.0
        return max(u.end for u in done) - min(u.start for u in done)

    def busy_seconds(self) -> dict[int, float]:
        busy: dict[int, float] = {}
        for u in self.units:
            busy[u.worker] = busy.get(u.worker, 0.0) + (u.end - u.start)
        return busy

    def utilization(self) -> dict[int, float]:
        span = self.makespan or 1.0
        return {w: s / span for w, s in sorted(self.busy_seconds().items())}

    @property
    def bytes_hopped(self) -> int:
        return sum(u.state_bytes for u in self.units if u.hopped and u.status == "done")

    def final_metric(self, model: str) -> float:
        rows = [r for r in self.epochs if r.model == model]
        return rows[-1].metric(self.metric) if rows else math.nan

    def table(self) -> list[dict[str, Any]]:
        """One row per configuration per epoch: config values, train and val metrics."""
        rows = []
        for r in sorted(self.epochs, key=lambda r: (r.model, r.epoch)):
            row: dict[str, Any] = {
                "model": r.model,
                "epoch": r.epoch,
                "round": r.round,
                "steps": r.steps,
            }
            row.update({f"train_{k}": v for k, v in r.train.items()})
            row.update({f"val_{k}": v for k, v in r.validation.items()})
            row.update({f"config.{k}": v for k, v in self.configs[r.model].items()})
            rows.append(row)
        return rows

    # -- output -------------------------------------------------------------------------
    def write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        rows = self.table()
        _write_csv(out / "epochs.csv", rows)
        _write_csv(out / "schedule.csv", [asdict(u) for u in self.units])
        summary = {
            "metric": self.metric,
            "direction": "min" if self.minimize else "max",
            "backend": self.backend,
            "seed": self.seed,
            "best_model": self.best_model,
            "best_config": self.best_config,
            "best_value": self.best_value,
            "model_path": str(self.model_path) if self.model_path else None,
            "configs": self.configs,
            "stopped_after_round": self.stopped,
            "makespan_s": self.makespan,
            "utilization": self.utilization(),
            "bytes_hopped": self.bytes_hopped,
            "workers": [asdict(w) for w in self.workers],
        }
        (out / "result.json").write_text(json.dumps(summary, indent=2, default=str))
        gantt(self.units, out / "gantt.png")
        log.info("select: wrote results to %s", out)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    names: list[str] = []
    for row in rows:
        names += [k for k in row if k not in names]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


def gantt(units: Sequence[UnitRecord], path: Path, title: str = "MOP schedule") -> None:
    """One row per worker, one bar per unit coloured by model; lost units hatched."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    workers = sorted({u.worker for u in units})
    models = sorted({u.model for u in units})
    cmap = plt.get_cmap("tab20")
    colour = {m: cmap(i % 20) for i, m in enumerate(models)}
    span = max((u.end for u in units), default=1.0) - min((u.start for u in units), default=0.0)
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.6 * max(1, len(workers))))
    busy: dict[int, float] = {}
    for u in units:
        ax.barh(
            u.worker,
            u.end - u.start,
            left=u.start,
            color=colour[u.model],
            edgecolor="black",
            linewidth=0.3,
            hatch="//" if u.status == "lost" else None,
        )
        busy[u.worker] = busy.get(u.worker, 0.0) + u.end - u.start
    ax.set_yticks(workers)
    ax.set_yticklabels(
        [f"worker {w} ({100 * busy.get(w, 0) / (span or 1):.0f}% busy)" for w in workers]
    )
    ax.set_xlabel("seconds")
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[m]) for m in models[:20]]
    ax.legend(handles, models[:20], loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
