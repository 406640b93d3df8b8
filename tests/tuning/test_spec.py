"""CreateHyperParameterTuningJob requests as the spec reads and refuses them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.tuning_support import tuning_request
from trainport.errors import ValidationError
from trainport.tuning.spec import child_request, parse_tuning_request


def _hyperband(static: dict[str, str], **strategy: int) -> dict[str, Any]:
    config = {"HyperbandStrategyConfig": strategy} if strategy else {}
    return tuning_request("hb", "Hyperband", static=static, StrategyConfig=config)


def test_hyperband_takes_max_resource_from_the_epochs() -> None:
    spec = parse_tuning_request(_hyperband({"epochs": "27"}))
    assert (spec.min_resource, spec.max_resource, spec.stop_at_max_resource) == (1, 27, False)
    given = parse_tuning_request(_hyperband({"epochs": "27"}, MinResource=3, MaxResource=9))
    assert (given.min_resource, given.max_resource, given.stop_at_max_resource) == (3, 9, True)
    with pytest.raises(ValidationError, match="MaxResource: required"):
        parse_tuning_request(_hyperband({}))


def test_grid_size_is_the_number_of_children() -> None:
    ranges = {"CategoricalParameterRanges": [{"Name": "a", "Values": ["1", "2", "3"]},
                                             {"Name": "b", "Values": ["x", "y"]}]}  # fmt: skip
    spec = parse_tuning_request(tuning_request("g", "Grid", max_jobs=None, ranges=ranges))
    assert spec.max_jobs == 6
    with pytest.raises(ValidationError, match="leave it out with Strategy Grid"):
        parse_tuning_request(tuning_request("g", "Grid", max_jobs=6, ranges=ranges))


@pytest.mark.parametrize(
    ("rng", "said"),
    [
        ({"Name": "m", "MinValue": "0.5", "MaxValue": "1.5", "ScalingType": "ReverseLogarithmic"},
         "ReverseLogarithmic scaling applies"),
        ({"Name": "m", "MinValue": "0", "MaxValue": "1", "ScalingType": "Logarithmic"},
         "Logarithmic scaling needs MinValue greater than 0"),
        ({"Name": "m", "MinValue": "x", "MaxValue": "1"}, "'x' is not a number"),
    ],
)  # fmt: skip
def test_ranges_are_checked(rng: dict[str, str], said: str) -> None:
    request = tuning_request("r", "Random", ranges={"ContinuousParameterRanges": [rng]})
    with pytest.raises(ValidationError, match=said):
        parse_tuning_request(request)


def test_definitions_must_share_their_objective() -> None:
    request = tuning_request("d", "Random")
    body = request.pop("TrainingJobDefinition")
    config = request["HyperParameterTuningJobConfig"]
    ranges = config.pop("ParameterRanges")
    del config["HyperParameterTuningJobObjective"]
    request["TrainingJobDefinitions"] = [
        {**body, "DefinitionName": "a", "HyperParameterRanges": ranges,
         "TuningObjective": {"Type": "Minimize", "MetricName": "loss"}},
        {**body, "DefinitionName": "b", "HyperParameterRanges": ranges,
         "TuningObjective": {"Type": "Maximize", "MetricName": "loss"}},
    ]  # fmt: skip
    with pytest.raises(ValidationError, match="must be the same metric and type"):
        parse_tuning_request(request)


def test_a_child_gets_the_definition_tags_values_and_its_own_checkpoints() -> None:
    request = tuning_request("c", "Random")
    request["Tags"] = [{"Key": "team", "Value": "vision"}]
    request["TrainingJobDefinition"]["CheckpointConfig"] = {"S3Uri": "s3://ck/run/"}
    spec = parse_tuning_request(request)
    child = child_request(spec, spec.definitions[0], "c-001-abc", {"shift": "1.5", "kind": "a"})
    assert child["TrainingJobName"] == "c-001-abc"
    assert child["HyperParameters"]["shift"] == "1.5"
    assert child["HyperParameters"]["_tuning_objective_metric"] == "loss"
    assert child["Tags"] == [{"Key": "team", "Value": "vision"}]
    assert child["CheckpointConfig"] == {"S3Uri": "s3://ck/run/c-001-abc"}
