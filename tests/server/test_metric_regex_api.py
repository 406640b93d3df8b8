"""A MetricDefinitions Regex that cannot compile is refused by CreateTrainingJob itself,
naming its field, as a ValidationException; nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.server.conftest import TRAIN, job


def test_uncompilable_regex_is_a_validation_exception(sm: Any) -> None:
    bad = job("bad-regex", TRAIN)
    bad["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "loss", "Regex": "(unclosed"}]
    with pytest.raises(ClientError) as err:
        sm.create_training_job(**bad)
    assert err.value.response["Error"]["Code"] == "ValidationException"
    message = err.value.response["Error"]["Message"]
    assert "AlgorithmSpecification.MetricDefinitions[0].Regex" in message
    with pytest.raises(ClientError):
        sm.describe_training_job(TrainingJobName="bad-regex")  # nothing was stored
