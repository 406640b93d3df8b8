"""``trainport select spec.yaml``: run a model-selection workload from a spec file.

:data:`select_command` is registered on the ``trainport`` click group by trainport.cli.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import click

from trainport.errors import TrainportError
from trainport.select import select
from trainport.select.spec import load_spec

__all__ = ["select_command"]

log = logging.getLogger(__name__)


@click.command("select")
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(path_type=Path))
@click.option("--backend", type=click.Choice(["local", "ray", "spark"]), help="Override backend.")
@click.option("--output", type=click.Path(path_type=Path), help="Override the output folder.")
@click.option("--seed", type=int, help="Override the seed.")
@click.option("--progress/--no-progress", default=True, help="Show live progress bars.")
def select_command(
    spec_path: Path,
    backend: str | None,
    output: Path | None,
    seed: int | None,
    progress: bool,
) -> None:
    """Train the configurations of SPEC.yaml with model hopper parallelism."""
    try:
        spec = load_spec(spec_path)
        updates: dict[str, object] = {}
        if backend:
            updates["backend"] = backend
        if output:
            updates["output"] = str(output.resolve())
        if seed is not None:
            updates["seed"] = seed
        spec = spec.model_copy(update=updates)
        result = select(
            spec.build_procedure(),
            spec.build_trainer(),
            train=spec.train,
            validation=spec.validation,
            epochs=spec.epochs,
            metric=spec.metric,
            direction=spec.direction,
            partitions=spec.partitions,
            replicas=spec.replicas,
            backend=spec.backend,
            backend_options=spec.backend_options,
            seed=spec.seed,
            schedule=spec.schedule,
            output=spec.output,
            progress=progress,
        )
    except TrainportError as exc:
        raise click.ClickException(str(exc)) from exc
    width = max(len(k) for k in result.configs)
    click.echo(f"{'model':<{width}}  {spec.metric:>12}  config")
    for mid, config in result.configs.items():
        value = result.final_metric(mid)
        mark = "*" if mid == result.best_model else " "
        shown = f"{value:12.6g}" if math.isfinite(value) else f"{'-':>12}"
        stopped = result.stopped.get(mid)
        note = f"  (stopped after epoch {stopped})" if stopped is not None else ""
        click.echo(f"{mid:<{width}}{mark} {shown}  {config}{note}")
    written = "epochs.csv, schedule.csv, gantt.png, result.json"
    if result.best_model is None:
        click.echo(f"results: {spec.output} ({written})")
        raise click.ClickException(
            f"no model reported a finite {spec.metric} in its last epoch, so none is best "
            "and no best_model.pt was written"
        )
    click.echo(
        f"best: {result.best_model} {spec.metric}={result.best_value:.6g} {result.best_config}"
    )
    saved = ", best_model.pt" if result.model_path is not None else ""
    click.echo(f"results: {spec.output} ({written}{saved})")
