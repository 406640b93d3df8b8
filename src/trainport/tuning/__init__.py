"""Hyperparameter tuning jobs: SageMaker's CreateHyperParameterTuningJob on trainport.

A tuning job launches children, which are ordinary training jobs, with values its strategy
proposes (:mod:`.strategies`), holds ``MaxParallelTrainingJobs`` of them running, stops
weak ones early (:mod:`.stopping`) and ends when its budget or a completion criterion says.
The pieces: :mod:`.spec` (the request), :mod:`.records` and :mod:`.store` (the record in
the job database), :mod:`.plan` (the pure decision of each step), :mod:`.driver` (which
applies it), :mod:`.service` (what the API and the CLI call), :mod:`.autotune` (the
settings trainport chooses for a request with Autotune).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "TuningDriver",
    "TuningRecord",
    "TuningService",
    "TuningSpec",
    "TuningStatus",
    "parse_tuning_request",
]

# Imported when first used: ``trainport --help`` and every other command load this
# package's CLI, and should not pay for the jobs service it stands on.
_WHERE = {
    "TuningDriver": "driver",
    "TuningRecord": "records",
    "TuningService": "service",
    "TuningSpec": "spec",
    "TuningStatus": "records",
    "parse_tuning_request": "spec",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
