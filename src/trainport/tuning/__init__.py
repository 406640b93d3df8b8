"""Hyperparameter tuning jobs: SageMaker's CreateHyperParameterTuningJob on trainport.

A tuning job launches children, which are ordinary training jobs, with values its strategy
proposes (:mod:`.strategies`), holds ``MaxParallelTrainingJobs`` of them running, stops
weak ones early (:mod:`.stopping`) and ends when its budget or a completion criterion says.
The pieces: :mod:`.spec` (the request), :mod:`.records` and :mod:`.store` (the record in
the job database), :mod:`.plan` (the pure decision of each step), :mod:`.driver` (which
applies it), :mod:`.service` (what the API and the CLI call).
"""

from __future__ import annotations

from trainport.tuning.driver import TuningDriver
from trainport.tuning.records import TuningRecord, TuningStatus
from trainport.tuning.service import TuningService
from trainport.tuning.spec import TuningSpec, parse_tuning_request

__all__ = [
    "TuningDriver",
    "TuningRecord",
    "TuningService",
    "TuningSpec",
    "TuningStatus",
    "parse_tuning_request",
]
