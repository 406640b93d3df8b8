"""Autotune: the tuning job's settings chosen by trainport (``Autotune: {Mode: Enabled}``).

:func:`autotuned` turns a request with Autotune into the request trainport runs, so that
``DescribeHyperParameterTuningJob`` shows every choice. It is pure, and the tuning job
stores what it returns. The choices:

- **ParameterRanges**: each of ``AutoParameters`` becomes a range around its
  ``ValueHint`` (:func:`range_from_hint`); ranges given explicitly are kept as they are.
- **Strategy**: Hyperband when a static hyperparameter names the epochs (children are
  judged epoch by epoch) and there is no warm start, Bayesian otherwise.
- **TrainingJobEarlyStoppingType**: Auto with Bayesian (Hyperband stops children itself).
- **ResourceLimits.MaxNumberOfTrainingJobs**, when not given: 10 per tuned hyperparameter,
  from 10 to 100. ``MaxParallelTrainingJobs`` is the request's (the API requires it).
- **TuningJobCompletionCriteria**, when not given: ``ConvergenceDetected`` enabled.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from trainport.errors import ValidationError
from trainport.tuning.spec import EPOCH_HYPERPARAMETERS

__all__ = ["autotuned", "range_from_hint"]

_JOBS_PER_RANGE = 10
_MIN_JOBS, _MAX_JOBS = 10, 100
# A positive hint is searched from a tenth of it to ten times it: two orders of magnitude,
# which ScalingType Auto searches on a logarithmic scale.
_SPAN = 10.0
_BOOLEANS = ("true", "false")


def _format(value: float) -> str:
    return repr(float(value))


def range_from_hint(name: str, hint: str, where: str) -> tuple[str, dict[str, Any]]:
    """The range an AutoParameter's hint gives: (its kind, the range as the API has it).

    An integer ``n > 0``: integers from ``max(1, n // 10)`` to ``10 n``. A number ``v`` with
    ``0 < v < 1`` (a rate, a probability): from ``v / 10`` to ``1 - (1 - v) / 10``. Any
    other positive number: from ``v / 10`` to ``10 v``. ``true``/``false``: both. Anything
    else is refused, naming what to give instead."""
    text = hint.strip()
    if text.lower() in _BOOLEANS:
        values = list(_BOOLEANS) if text.islower() else [v.capitalize() for v in _BOOLEANS]
        return "Categorical", {"Name": name, "Values": values}
    try:
        number = float(text)
    except ValueError:
        raise ValidationError(
            f"{where}: trainport cannot choose other values for {name!r} from the one "
            f"example {hint!r}; give its values in CategoricalParameterRanges"
        ) from None
    if not math.isfinite(number) or number <= 0:
        raise ValidationError(
            f"{where}: the ValueHint {hint!r} of {name!r} gives no scale to search around "
            "(Autotune searches around positive numbers); give its range in "
            "IntegerParameterRanges or ContinuousParameterRanges"
        )
    auto = {"Name": name, "ScalingType": "Auto"}
    if number == int(number) and "." not in text and "e" not in text.lower():
        low, high = max(1, int(number) // 10), int(number) * 10
        return "Integer", {**auto, "MinValue": str(low), "MaxValue": str(high)}
    if number < 1:
        low_f, high_f = number / _SPAN, 1 - (1 - number) / _SPAN
    else:
        low_f, high_f = number / _SPAN, number * _SPAN
    return "Continuous", {**auto, "MinValue": _format(low_f), "MaxValue": _format(high_f)}


def _expand_ranges(ranges: dict[str, Any], where: str) -> tuple[dict[str, Any], int]:
    """The ranges with AutoParameters turned into ranges; and how many ranges in all."""
    out = {k: list(v) for k, v in ranges.items() if k != "AutoParameters" and v}
    malformed = []
    for i, auto in enumerate(ranges.get("AutoParameters") or ()):
        if not isinstance(auto, dict) or not all(
            isinstance(auto.get(k), str) for k in ("Name", "ValueHint")
        ):
            malformed.append(auto)  # left for the request's validation to name
            continue
        kind, made = range_from_hint(
            auto["Name"], auto["ValueHint"], f"{where}.AutoParameters[{i}]"
        )
        out.setdefault(f"{kind}ParameterRanges", []).append(made)
    if malformed:
        out["AutoParameters"] = malformed
    return out, sum(len(v) for k, v in out.items() if k != "AutoParameters")


def _epochs_named(definitions: list[dict[str, Any]]) -> bool:
    return all(
        any(k in (d.get("StaticHyperParameters") or {}) for k in EPOCH_HYPERPARAMETERS)
        for d in definitions
    )


def autotuned(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` with trainport's choices in place of Autotune's fields (a copy); as it
    is when Autotune is not enabled."""
    if (request.get("Autotune") or {}).get("Mode") != "Enabled":
        return request
    out = copy.deepcopy(request)
    config = out.setdefault("HyperParameterTuningJobConfig", {})
    total = 0
    if "ParameterRanges" in config:
        where = "HyperParameterTuningJobConfig.ParameterRanges"
        config["ParameterRanges"], total = _expand_ranges(config["ParameterRanges"], where)
    definitions = out.get("TrainingJobDefinitions") or [out.get("TrainingJobDefinition") or {}]
    for i, d in enumerate(definitions):
        if "HyperParameterRanges" in d:
            where = f"TrainingJobDefinitions[{i}].HyperParameterRanges"
            d["HyperParameterRanges"], count = _expand_ranges(d["HyperParameterRanges"], where)
            total = max(total, count)
    # A warm start informs Bayesian search, not Hyperband.
    hyperband = _epochs_named(definitions) and not out.get("WarmStartConfig")
    if not hyperband or config.get("Strategy") != "Hyperband":
        config.pop("StrategyConfig", None)
    config["Strategy"] = "Hyperband" if hyperband else "Bayesian"
    config["TrainingJobEarlyStoppingType"] = "Off" if hyperband else "Auto"
    limits = config.setdefault("ResourceLimits", {})
    if "MaxNumberOfTrainingJobs" not in limits:
        limits["MaxNumberOfTrainingJobs"] = min(
            _MAX_JOBS, max(_MIN_JOBS, _JOBS_PER_RANGE * max(1, total))
        )
    config.setdefault(
        "TuningJobCompletionCriteria", {"ConvergenceDetected": {"CompleteOnConvergence": "Enabled"}}
    )
    return out
