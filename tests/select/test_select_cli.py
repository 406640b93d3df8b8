"""``trainport select spec.yaml`` through click's runner, on the local backend."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trainport.select.cli import select_command

SPEC = {
    "trainer": "trainport.select.models:mlp_trainer",
    "trainer_args": {"in_features": 6, "batch_size": 32},
    "train": "data/train",
    "validation": "data/val",
    "epochs": 2,
    "metric": "val_accuracy",
    "direction": "max",
    "partitions": 2,
    "seed": 3,
    "search": {
        "procedure": "random",
        "samples": 3,
        "params": {
            "lr": {"loguniform": [0.01, 0.3]},
            "hidden": {"uniform": [4, 16], "q": 4},
            "layers": {"choice": [1, 2]},
        },
    },
    "output": "out",
}


def write_spec(tmp_path: Path, dataset: Path, **changes: object) -> Path:
    (tmp_path / "data").symlink_to(dataset, target_is_directory=True)
    spec = {**SPEC, **changes}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_select_command_runs_a_spec(tmp_path: Path, dataset: Path) -> None:
    path = write_spec(tmp_path, dataset)
    result = CliRunner().invoke(select_command, [str(path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "best: c00" in result.output
    summary = json.loads((tmp_path / "out" / "result.json").read_text())
    assert summary["direction"] == "max"
    assert len(summary["configs"]) == 3
    for config in summary["configs"].values():
        assert config["hidden"] % 4 == 0 and config["layers"] in (1, 2)
    assert (tmp_path / "out" / "best_model.pt").exists()
    assert (tmp_path / "out" / "gantt.png").exists()


@pytest.mark.slow
def test_hyperband_spec_stops_configurations(tmp_path: Path, dataset: Path) -> None:
    search = {
        "procedure": "hyperband",
        "eta": 2,
        "params": {"lr": {"loguniform": [0.001, 0.3]}, "hidden": {"choice": [4, 8]}},
    }
    path = write_spec(tmp_path, dataset, search=search, metric="val_loss", direction="min")
    result = CliRunner().invoke(select_command, [str(path), "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "result.json").read_text())
    # R = 2, eta = 2: brackets of 2 configurations (rung at epoch 1) and 2 (rung at 2).
    assert len(summary["configs"]) == 4
    assert list(summary["stopped_after_round"].values()) == [1, 2]
    assert "stopped after epoch 1" in result.output


def test_bad_spec_names_the_field(tmp_path: Path, dataset: Path) -> None:
    path = write_spec(tmp_path, dataset, epochs=0, backend="yarn")
    result = CliRunner().invoke(select_command, [str(path)])
    assert result.exit_code != 0
    assert "epochs" in result.output and "backend" in result.output


def test_random_search_without_samples_is_refused(tmp_path: Path, dataset: Path) -> None:
    search = {**SPEC["search"], "samples": None}  # type: ignore[dict-item]
    path = write_spec(tmp_path, dataset, search=search)
    result = CliRunner().invoke(select_command, [str(path)])
    assert result.exit_code != 0
    assert "search.samples" in result.output


def test_a_metric_the_trainer_never_reports_is_refused_after_the_first_epoch(
    tmp_path: Path, dataset: Path
) -> None:
    path = write_spec(tmp_path, dataset, metric="val_f1", epochs=3)
    result = CliRunner().invoke(select_command, [str(path), "--no-progress"])
    assert result.exit_code == 1, result.output
    assert "metric='val_f1': the trainer reported no such metric in the first epoch" in (
        result.output
    )
    assert "val_accuracy" in result.output and "train_loss" in result.output
    assert "best:" not in result.output
    assert not (tmp_path / "out" / "best_model.pt").exists()


def test_unreported_names_what_the_trainer_reports() -> None:
    from trainport.select.result import EpochRecord, unreported

    records = [EpochRecord("c000", 1, 1, 10, {"loss": 0.5}, {"loss": 0.6, "accuracy": math.nan})]
    assert unreported(records, "val_accuracy") is None  # reported, if not finite
    said = unreported(records, "val_f1")
    assert said is not None and said.endswith(
        "it reports train_loss, val_accuracy, val_loss. Set metric to one of those"
    )


def test_no_finite_metric_means_no_best_model(tmp_path: Path, dataset: Path) -> None:
    path = write_spec(
        tmp_path, dataset, trainer="tests.select.select_testkit:nan_trainer", epochs=1
    )
    result = CliRunner().invoke(select_command, [str(path), "--no-progress"])
    assert result.exit_code == 1, result.output
    assert "no model reported a finite val_accuracy in its last epoch" in result.output
    assert "best:" not in result.output and "best_model.pt" in result.output  # the refusal
    assert "(epochs.csv, schedule.csv, gantt.png, result.json)" in result.output
    assert not (tmp_path / "out" / "best_model.pt").exists()
