"""CreateHyperParameterTuningJob request -> validated, typed :class:`TuningSpec`.

The request is first checked against botocore's service model (unknown fields, enums,
patterns, in botocore's words), then against the rules SageMaker applies on its side: a
range's bounds, a scaling its bounds allow, an objective metric the definition defines,
Grid over categorical ranges only, a Hyperband budget. A child training job's request is
built here too (:func:`child_request`): the definition's fields, the tuning job's tags,
and the static and tuned hyperparameters together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainport.errors import ValidationError
from trainport.servicemodel import request_shapes, validate

__all__ = [
    "Definition",
    "Objective",
    "ParameterRange",
    "TuningSpec",
    "child_request",
    "parse_tuning_request",
    "resource_config",
    "with_objective",
]

STRATEGIES = ("Random", "Grid", "Bayesian", "Hyperband")
# Static hyperparameters SageMaker's Hyperband reads its MaxResource from, when the
# strategy's configuration leaves it out.
EPOCH_HYPERPARAMETERS = ("epochs", "numepochs", "n-epochs", "num_epochs", "n_epochs")
# The fields of a training job definition a child's CreateTrainingJob request takes as
# they are.
_CHILD_FIELDS = (
    "RoleArn",
    "InputDataConfig",
    "VpcConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "StoppingCondition",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "RetryStrategy",
    "Environment",
)
_ALGORITHM_FIELDS = ("TrainingImage", "TrainingInputMode", "MetricDefinitions")
TUNING_OBJECTIVE = "_tuning_objective_metric"
_MAX_RANGES = 30  # tunable hyperparameters per definition, as in SageMaker
# ScalingType Auto: a positive range whose MaxValue / MinValue is at least this is searched
# on a logarithmic scale.
AUTO_LOG_SPAN = 100.0
# The strategies a warm start informs: SageMaker's warm start chooses values "using either
# Bayesian or random search".
WARM_START_STRATEGIES = ("Bayesian", "Random")


@dataclass(frozen=True)
class ParameterRange:
    """One tunable hyperparameter: ``kind`` Integer, Continuous or Categorical."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    scaling: str = "Linear"
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Objective:
    metric: str
    minimize: bool

    def better(self, a: float, b: float) -> bool:
        """Whether the objective value ``a`` is strictly better than ``b``."""
        return a < b if self.minimize else a > b


@dataclass(frozen=True)
class Definition:
    """One training job definition: what its children run, and what is tuned."""

    name: str | None
    body: dict[str, Any]
    ranges: tuple[ParameterRange, ...]
    objective: Objective
    static: dict[str, str]

    @property
    def resumes(self) -> bool:
        """Whether its children keep checkpoints (CheckpointConfig), so that Hyperband
        can pause one at a rung and resume it later instead of letting it run on."""
        return bool(self.body.get("CheckpointConfig"))


@dataclass(frozen=True)
class TuningSpec:
    name: str
    strategy: str
    definitions: tuple[Definition, ...]
    max_jobs: int
    max_parallel: int
    max_runtime: int | None = None
    early_stopping: bool = False
    min_resource: int = 1
    max_resource: int = 1
    # Whether Hyperband stops a child that has had MaxResource epochs: when MaxResource
    # was given and the child's own epochs (if known) go further.
    stop_at_max_resource: bool = False
    target: float | None = None
    not_improving: int | None = None
    complete_on_convergence: bool = False
    seed: int | None = None
    warm_start_parents: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def objective(self) -> Objective:
        return self.definitions[0].objective


def _refuse(message: str) -> ValidationError:
    return ValidationError(message)


def _number(value: str, where: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise _refuse(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise _refuse(f"{where}: {value!r} is not a finite number")
    return number


def _numeric_range(raw: dict[str, Any], kind: str, where: str) -> ParameterRange:
    low = _number(raw["MinValue"], f"{where}.MinValue")
    high = _number(raw["MaxValue"], f"{where}.MaxValue")
    if kind == "Integer" and (low != int(low) or high != int(high)):
        raise _refuse(f"{where}: MinValue and MaxValue of an integer range must be integers")
    if low > high:
        raise _refuse(
            f"{where}: MinValue ({raw['MinValue']}) must be less than or equal to MaxValue "
            f"({raw['MaxValue']}) for hyperparameter {raw['Name']!r}"
        )
    scaling = raw.get("ScalingType", "Auto")
    if scaling == "Auto":
        scaling = auto_scaling(low, high)
    if scaling == "Logarithmic" and low <= 0:
        raise _refuse(
            f"{where}: Logarithmic scaling needs MinValue greater than 0 for hyperparameter "
            f"{raw['Name']!r}"
        )
    if scaling == "ReverseLogarithmic" and (kind == "Integer" or not 0 <= low <= high < 1):
        raise _refuse(
            f"{where}: ReverseLogarithmic scaling applies to continuous ranges within "
            f"0 <= MinValue <= MaxValue < 1 only (hyperparameter {raw['Name']!r})"
        )
    return ParameterRange(raw["Name"], kind, low, high, scaling)


def auto_scaling(low: float, high: float) -> str:
    """The scale ``ScalingType: Auto`` settles on: Logarithmic for a positive range that
    spans at least two orders of magnitude (a learning rate from 1e-4 to 1e-1, say), where
    a linear draw would almost never try the small values; Linear otherwise."""
    if low > 0 and high / low >= AUTO_LOG_SPAN:
        return "Logarithmic"
    return "Linear"


def _ranges(raw: dict[str, Any] | None, where: str) -> tuple[ParameterRange, ...]:
    raw = raw or {}
    if raw.get("AutoParameters"):
        raise _refuse(
            f"{where}.AutoParameters: read only with Autotune; add "
            "Autotune={'Mode': 'Enabled'} to the request, or give the ranges"
        )
    out: list[ParameterRange] = []
    for kind in ("Integer", "Continuous"):
        for i, item in enumerate(raw.get(f"{kind}ParameterRanges") or ()):
            out.append(_numeric_range(item, kind, f"{where}.{kind}ParameterRanges[{i}]"))
    for i, item in enumerate(raw.get("CategoricalParameterRanges") or ()):
        values = tuple(item["Values"])
        if len(set(values)) != len(values):
            raise _refuse(
                f"{where}.CategoricalParameterRanges[{i}]: the values of {item['Name']!r} "
                "must be distinct"
            )
        out.append(ParameterRange(item["Name"], "Categorical", values=values))
    names = [r.name for r in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _refuse(f"{where}: hyperparameter {twice[0]!r} has more than one range")
    if len(out) > _MAX_RANGES:
        raise _refuse(f"{where}: {len(out)} ranges; a tuning job tunes at most {_MAX_RANGES}")
    return tuple(out)


def _objective(raw: dict[str, Any] | None, where: str) -> Objective:
    if not raw:
        raise _refuse(
            f"{where}: a tuning objective is required (HyperParameterTuningJobObjective, or "
            "TuningObjective in each of TrainingJobDefinitions)"
        )
    return Objective(raw["MetricName"], raw["Type"] == "Minimize")


def _definition(body: dict[str, Any], config: dict[str, Any], where: str, many: bool) -> Definition:
    objective = _objective(
        body.get("TuningObjective") or config.get("HyperParameterTuningJobObjective"), where
    )
    ranges = _ranges(body.get("HyperParameterRanges") or config.get("ParameterRanges"), where)
    if many and not body.get("DefinitionName"):
        raise _refuse(f"{where}.DefinitionName: each of several definitions needs a name")
    algo = body["AlgorithmSpecification"]
    defined = [m["Name"] for m in algo.get("MetricDefinitions") or ()]
    if objective.metric not in defined:
        raise _refuse(
            f"{where}: the objective metric {objective.metric!r} is not one of the "
            f"definition's MetricDefinitions ({', '.join(defined) or 'none'}); add a "
            "MetricDefinition with that name whose Regex finds it in the training log"
        )
    static = dict(body.get("StaticHyperParameters") or {})
    clash = sorted(set(static) & {r.name for r in ranges})
    if clash:
        raise _refuse(
            f"{where}: hyperparameter {clash[0]!r} is both static and tuned; leave it out of "
            "StaticHyperParameters"
        )
    return Definition(body.get("DefinitionName"), body, ranges, objective, static)


def _grid_size(definitions: tuple[Definition, ...]) -> int:
    total = 0
    for d in definitions:
        if any(r.kind != "Categorical" for r in d.ranges) or not d.ranges:
            raise _refuse(
                "HyperParameterTuningJobConfig.Strategy: Grid searches categorical ranges only; "
                "give CategoricalParameterRanges and no integer or continuous ranges"
            )
        total += math.prod(len(r.values) for r in d.ranges)
    return total


def _hyperband_budget(config: dict[str, Any], d: Definition) -> tuple[int, int, bool]:
    """MinResource, MaxResource, and whether a child is stopped at MaxResource."""
    raw = (config.get("StrategyConfig") or {}).get("HyperbandStrategyConfig") or {}
    low = int(raw.get("MinResource", 1))
    high = raw.get("MaxResource")
    key = next((k for k in EPOCH_HYPERPARAMETERS if k in d.static), None)
    epochs = int(_number(d.static[key].strip('"'), f"StaticHyperParameters.{key}")) if key else None
    stop_at_max = high is not None and (epochs is None or epochs > int(high))
    if high is None:
        if epochs is None:
            raise _refuse(
                "HyperParameterTuningJobConfig.StrategyConfig.HyperbandStrategyConfig."
                "MaxResource: required when no static hyperparameter names the epochs "
                f"({', '.join(EPOCH_HYPERPARAMETERS)})"
            )
        high = epochs
    if not 1 <= low <= high:
        raise _refuse(
            "HyperParameterTuningJobConfig.StrategyConfig.HyperbandStrategyConfig: need "
            f"1 <= MinResource <= MaxResource, got {low} and {high}"
        )
    return low, int(high), stop_at_max


def parse_tuning_request(request: dict[str, Any], cache_dir: Path | None = None) -> TuningSpec:
    """Validate a CreateHyperParameterTuningJob request; raises ValidationError.
    ``cache_dir`` keeps the service model's subset between runs (see servicemodel)."""
    root, shapes = request_shapes("CreateHyperParameterTuningJob", cache_dir)
    problems = validate(request, root, shapes)
    if problems:
        raise _refuse("invalid CreateHyperParameterTuningJob request:\n  " + "\n  ".join(problems))
    config = request["HyperParameterTuningJobConfig"]
    one, many = request.get("TrainingJobDefinition"), request.get("TrainingJobDefinitions")
    if (one is None) == (many is None):
        raise _refuse("TrainingJobDefinition, TrainingJobDefinitions: give exactly one of the two")
    bodies = [one] if one is not None else list(many or ())
    definitions = tuple(
        _definition(
            b,
            config,
            "TrainingJobDefinition" if one is not None else f"TrainingJobDefinitions[{i}]",
            one is None,
        )
        for i, b in enumerate(bodies)
    )
    if len({d.objective for d in definitions}) > 1:
        raise _refuse(
            "TrainingJobDefinitions: every definition's TuningObjective must be the same "
            "metric and type, so that their children's objectives compare"
        )
    strategy = config["Strategy"]
    limits = config["ResourceLimits"]
    max_jobs = limits.get("MaxNumberOfTrainingJobs")
    if strategy == "Grid":
        size = _grid_size(definitions)
        if max_jobs is not None:
            raise _refuse(
                "ResourceLimits.MaxNumberOfTrainingJobs: leave it out with Strategy Grid; the "
                f"grid's size ({size}) is the number of training jobs"
            )
        max_jobs = size
    elif max_jobs is None:
        raise _refuse(f"ResourceLimits.MaxNumberOfTrainingJobs: required with Strategy {strategy}")
    min_resource, max_resource, stop_at_max = 1, 1, False
    if strategy == "Hyperband":
        min_resource, max_resource, stop_at_max = _hyperband_budget(config, definitions[0])
    elif config.get("StrategyConfig"):
        raise _refuse(f"StrategyConfig: only Strategy Hyperband takes one, not {strategy}")
    criteria = config.get("TuningJobCompletionCriteria") or {}
    not_improving = (criteria.get("BestObjectiveNotImproving") or {}).get(
        "MaxNumberOfTrainingJobsNotImproving"
    )
    warm = request.get("WarmStartConfig") or {}
    if warm and strategy not in WARM_START_STRATEGIES:
        raise _refuse(
            f"WarmStartConfig: a warm start is supported with Strategy "
            f"{' or '.join(WARM_START_STRATEGIES)} only, not {strategy}; leave WarmStartConfig "
            "out, or search with Bayesian or Random"
        )
    convergence = (criteria.get("ConvergenceDetected") or {}).get("CompleteOnConvergence")
    return TuningSpec(
        name=request["HyperParameterTuningJobName"],
        strategy=strategy,
        definitions=definitions,
        max_jobs=int(max_jobs),
        max_parallel=int(limits["MaxParallelTrainingJobs"]),
        max_runtime=limits.get("MaxRuntimeInSeconds"),
        early_stopping=config.get("TrainingJobEarlyStoppingType", "Off") == "Auto",
        min_resource=min_resource,
        max_resource=max_resource,
        stop_at_max_resource=stop_at_max,
        target=criteria.get("TargetObjectiveMetricValue"),
        not_improving=not_improving,
        complete_on_convergence=convergence == "Enabled",
        seed=config.get("RandomSeed"),
        warm_start_parents=tuple(
            p["HyperParameterTuningJobName"] for p in warm.get("ParentHyperParameterTuningJobs", ())
        ),
        tags=tuple((t["Key"], t.get("Value", "")) for t in request.get("Tags") or ()),
    )


def resource_config(body: dict[str, Any]) -> dict[str, Any]:
    """A definition's ResourceConfig: as given, or from its HyperParameterTuningResourceConfig
    (what the SageMaker SDK sends), whose first instance configuration a child runs on."""
    if body.get("ResourceConfig"):
        return dict(body["ResourceConfig"])
    given = body.get("HyperParameterTuningResourceConfig") or {}
    first = (given.get("InstanceConfigs") or [{}])[0]
    return {
        "InstanceType": given.get("InstanceType") or first.get("InstanceType", "ml.m5.large"),
        "InstanceCount": given.get("InstanceCount") or first.get("InstanceCount", 1),
        "VolumeSizeInGB": given.get("VolumeSizeInGB") or first.get("VolumeSizeInGB", 1),
    }


def with_objective(definition: Definition) -> dict[str, str]:
    """The static hyperparameters with ``_tuning_objective_metric``, which SageMaker adds
    to every child (the training toolkit keeps it from the script's arguments) and shows
    in a tuning job's description (the SageMaker SDK's attach removes it from there)."""
    return {**definition.static, TUNING_OBJECTIVE: definition.objective.metric}


def child_request(
    spec: TuningSpec,
    definition: Definition,
    name: str,
    tuned: dict[str, str],
    checkpoints_of: str | None = None,
) -> dict[str, Any]:
    """The CreateTrainingJob request of the child ``name`` running ``tuned`` values.
    ``checkpoints_of``: the first job of the trial this child continues, whose checkpoint
    folder it seeds from and syncs to."""
    body = definition.body
    request: dict[str, Any] = {"TrainingJobName": name}
    request.update({k: body[k] for k in _CHILD_FIELDS if k in body})
    algo = body["AlgorithmSpecification"]
    request["AlgorithmSpecification"] = {k: algo[k] for k in _ALGORITHM_FIELDS if k in algo}
    request["HyperParameters"] = {**with_objective(definition), **tuned}
    request["ResourceConfig"] = resource_config(body)
    checkpoint = body.get("CheckpointConfig")
    if checkpoint:
        # Each trial its own folder of checkpoints, named after its first job: a trial's
        # continuation resumes from it, and other trials never see it.
        uri = checkpoint["S3Uri"].rstrip("/") + "/" + (checkpoints_of or name)
        request["CheckpointConfig"] = {**checkpoint, "S3Uri": uri}
    if spec.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in spec.tags]
    return request
