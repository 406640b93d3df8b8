"""MOP's rules on the local backend (real worker processes), one shared run where possible."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from select_testkit import (
    GRID,
    KillOnce,
    assert_no_overlap,
    final_weights,
    marker_path,
    max_weight_diff,
    trainer,
    unit_intervals,
    workload,
)

from trainport.errors import ValidationError
from trainport.select import Decision, FixedSearch, GridSpace, ModelView, Procedure, select
from trainport.select.backends.local import LocalBackend
from trainport.select.mop import replay, run_workload
from trainport.select.partition import list_files, split_partitions
from trainport.select.pytorch import TorchTrainer
from trainport.select.space import Config


def test_completeness_each_epoch_runs_every_model_on_every_partition(local_run) -> None:
    models = list(local_run.configs)
    assert len(models) == 4
    for rnd in (1, 2, 3):
        pairs = [(u.model, u.partition) for u in local_run.units if u.round == rnd]
        assert sorted(pairs) == sorted(itertools.product(models, range(2)))
    assert all(u.status == "done" for u in local_run.units)


def test_model_isolation_and_worker_exclusivity(local_run) -> None:
    assert_no_overlap(unit_intervals(local_run, "model"))
    assert_no_overlap(unit_intervals(local_run, "worker"))
    for u in local_run.units:
        assert u.worker % 2 == u.partition  # only where its partition is


def test_sequential_replay_reproduces_every_model(local_run, dataset: Path) -> None:
    partitions = split_partitions(list_files(dataset / "train"), 2, local_run.seed)
    states = replay(trainer(), local_run, partitions)
    replayed = {m: TorchTrainer.weights(s) for m, s in states.items()}
    assert max_weight_diff(final_weights(local_run), replayed) <= 1e-6


def test_hop_state_carries_step_counters_and_per_epoch_lr(local_run) -> None:
    for mid, state in local_run.final_states.items():
        counters = TorchTrainer.counters(state)
        steps = sum(u.steps for u in local_run.units if u.model == mid)
        assert counters["step"] == steps > 0
        assert counters["epoch"] == 3
        # lr_decay 0.5 per *logical* epoch: two decays after three epochs, not 2 * 3 - 1.
        lr0 = local_run.configs[mid]["lr"]
        assert counters["lr"] == [pytest.approx(lr0 * 0.25)]


def test_epoch_metrics_are_step_weighted_means_of_units(local_run) -> None:
    sizes = {u.steps for u in local_run.units}
    assert len(sizes) > 1  # uneven partitions, so weighting matters
    for record in local_run.epochs:
        units = [u for u in local_run.units if u.model == record.model and u.round == record.round]
        steps = sum(u.steps for u in units)
        expected = sum(u.metrics["loss"] * u.steps for u in units) / steps
        assert record.steps == steps
        assert record.train["loss"] == pytest.approx(expected, rel=1e-12)


def test_outputs_best_model_table_and_gantt(local_run) -> None:
    out = local_run.model_path.parent
    finals = {m: local_run.final_metric(m) for m in local_run.configs}
    assert local_run.best_value == min(finals.values())
    assert local_run.best_config == local_run.configs[local_run.best_model]
    saved = torch.load(local_run.model_path, weights_only=False)
    assert saved["config"] == local_run.best_config
    header = (out / "epochs.csv").read_text().splitlines()[0]
    for column in ("model", "epoch", "train_loss", "val_loss", "val_accuracy", "config.lr"):
        assert column in header
    assert len((out / "epochs.csv").read_text().splitlines()) == 1 + 4 * 3
    assert (out / "gantt.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "result.json").read_text())
    assert summary["best_model"] == local_run.best_model
    assert set(summary["utilization"]) == {"0", "1"}
    assert len(local_run.table()) == 12


@pytest.mark.slow
def test_killed_worker_with_one_copy_is_restarted(local_run, dataset: Path, tmp_path: Path) -> None:
    killer = KillOnce(trainer(), marker_path(tmp_path), epoch=2)
    result = run_workload(workload(dataset, trainer=killer), LocalBackend())
    lost = [u for u in result.units if u.status == "lost"]
    assert len(lost) == 1
    # Nothing counted twice: still exactly one finished unit per (model, partition, epoch).
    done = [(u.round, u.model, u.partition) for u in result.units if u.status == "done"]
    assert len(done) == len(set(done)) == 3 * 4 * 2
    dead = lost[0].worker
    stats = {s.worker: s for s in result.workers}
    assert stats[dead].loads == 2  # restarted and reloaded its partition
    assert stats[1 - dead].loads == 1
    # Reloading means reading its partition's files again: twice their bytes, the other once.
    partitions = split_partitions(list_files(dataset / "train"), 2, result.seed)
    size = {i: sum(f.size for f in files) for i, files in enumerate(partitions)}
    assert stats[dead].bytes_read == 2 * size[lost[0].partition]
    assert stats[1 - dead].bytes_read == size[1 - lost[0].partition]
    # The model resumed from its last state: same numbers as the undisturbed run.
    assert max_weight_diff(final_weights(result), final_weights(local_run)) <= 1e-6


@pytest.mark.slow
def test_killed_worker_with_replicas_finishes_on_the_others(
    local_run, dataset: Path, tmp_path: Path
) -> None:
    killer = KillOnce(trainer(), marker_path(tmp_path), epoch=2)
    result = run_workload(workload(dataset, trainer=killer, replicas=2), LocalBackend())
    lost = [u for u in result.units if u.status == "lost"]
    assert len(lost) == 1
    dead = lost[0].worker
    after = [u for u in result.units if u.status == "done" and u.start > lost[0].start]
    assert after and all(u.worker != dead for u in after)
    assert {s.worker: s.loads for s in result.workers}[dead] == 1  # not restarted
    done = [(u.round, u.model, u.partition) for u in result.units if u.status == "done"]
    assert len(done) == len(set(done)) == 3 * 4 * 2
    assert_no_overlap(unit_intervals(result, "worker"))
    assert_no_overlap(unit_intervals(result, "model"))
    # Replicas hold the same data, so results do not depend on which copy ran a unit.
    assert max_weight_diff(final_weights(result), final_weights(local_run)) <= 1e-6


class AddAfterFirst(Procedure):
    """Stops the worst model and adds one configuration after epoch 1."""

    def initial(self) -> list[Config]:
        return GridSpace({"lr": [0.2, 0.001], "hidden": [4]}).configs()

    def after_epoch(self, epoch: int, models: dict[str, ModelView], minimize: bool) -> Decision:
        if epoch != 1:
            return Decision()
        worst = max(models, key=lambda m: models[m].scores[-1])
        return Decision(stop=frozenset({worst}), add=({"lr": 0.1, "hidden": 8},))


@pytest.mark.slow
def test_procedures_stop_and_add_between_epochs(dataset: Path, tmp_path: Path) -> None:
    result = select(
        AddAfterFirst(),
        trainer(),
        train=dataset / "train",
        validation=dataset / "val",
        epochs=2,
        seed=1,
        output=tmp_path,
        progress=False,
        schedule="dynamic",
    )
    assert result.stopped == {"c001": 1}  # lr 0.001 learns least in one epoch
    assert [(r.model, r.epoch, r.round) for r in result.epochs if r.round == 2] == [
        ("c000", 2, 2),
        ("c002", 1, 2),
    ]
    assert sorted((u.model, u.partition) for u in result.units if u.round == 2) == [
        ("c000", 0),
        ("c000", 1),
        ("c002", 0),
        ("c002", 1),
    ]


@pytest.mark.slow
def test_partitions_read_through_the_object_store(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    for name in ("train", "val"):
        dest = home / "store" / "bucket" / "data" / name
        dest.mkdir(parents=True)
        for f in (dataset / name).iterdir():
            (dest / f.name).write_bytes(f.read_bytes())
    monkeypatch.setenv("TRAINPORT_HOME", str(home))
    for var in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "TRAINPORT_STORE"):
        monkeypatch.delenv(var, raising=False)
    result = select(
        FixedSearch(GridSpace({"lr": [0.1]})),
        trainer(),
        train="s3://bucket/data/train/",
        validation="s3://bucket/data/val/",
        epochs=1,
        progress=False,
    )
    total = sum(f.stat().st_size for f in (dataset / "train").iterdir())
    assert sum(s.bytes_read for s in result.workers) == total
    assert len(result.units) == 2


def test_bad_input_names_the_field(dataset: Path) -> None:
    with pytest.raises(ValidationError, match="metric"):
        workload(dataset, metric="loss")
    with pytest.raises(ValidationError, match="validation"):
        workload(dataset, validation=None)
    with pytest.raises(ValidationError, match="epochs"):
        workload(dataset, epochs=0)
    with pytest.raises(ValidationError, match="train"):
        select(
            FixedSearch(GRID),
            trainer(),
            train=dataset / "nope",
            epochs=1,
            metric="train_loss",
            progress=False,
        )
