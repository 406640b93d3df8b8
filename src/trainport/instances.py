"""Instance types as data: the resources one host of each ``InstanceType`` has.

SageMaker's published sizes, which an operator may extend or override with JSON
(``TRAINPORT_RAY_INSTANCE_TYPES``). Read from below by the configuration (to check that
JSON) and the runners (to size a host's limits), and by placement (to ask a Ray cluster
for a host's bundle); this module imports nothing of trainport beside its errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from trainport.errors import ValidationError

__all__ = ["GIB", "INSTANCE_TYPES", "HostShape", "parse_instance_types"]

GIB = 1 << 30


@dataclass(frozen=True)
class HostShape:
    """The resources one host of an instance type takes on its node."""

    cpus: float
    gpus: float = 0.0
    memory_gib: float = 0.0

    def bundle(self) -> dict[str, float]:
        """The placement-group bundle Ray reserves for the host."""
        bundle = {"CPU": self.cpus}
        if self.gpus:
            bundle["GPU"] = self.gpus
        if self.memory_gib:
            bundle["memory"] = self.memory_gib * GIB
        return bundle

    def describe(self) -> str:
        parts = [f"{self.cpus:g} CPUs"]
        if self.gpus:
            parts.append(f"{self.gpus:g} GPUs")
        if self.memory_gib:
            parts.append(f"{self.memory_gib:g} GiB memory")
        return ", ".join(parts)

    def fits(self, node: Mapping[str, float]) -> bool:
        """Whether a node with these resources (Ray's names) could hold the host."""
        return all(node.get(name, 0.0) >= amount for name, amount in self.bundle().items())


# SageMaker's published sizes for common training instance types (vCPUs, GPUs, GiB).
INSTANCE_TYPES: dict[str, HostShape] = {
    "ml.m5.large": HostShape(2, 0, 8),
    "ml.m5.xlarge": HostShape(4, 0, 16),
    "ml.m5.2xlarge": HostShape(8, 0, 32),
    "ml.m5.4xlarge": HostShape(16, 0, 64),
    "ml.m5.12xlarge": HostShape(48, 0, 192),
    "ml.m5.24xlarge": HostShape(96, 0, 384),
    "ml.c5.xlarge": HostShape(4, 0, 8),
    "ml.c5.2xlarge": HostShape(8, 0, 16),
    "ml.c5.4xlarge": HostShape(16, 0, 32),
    "ml.c5.9xlarge": HostShape(36, 0, 72),
    "ml.c5.18xlarge": HostShape(72, 0, 144),
    "ml.p3.2xlarge": HostShape(8, 1, 61),
    "ml.p3.8xlarge": HostShape(32, 4, 244),
    "ml.p3.16xlarge": HostShape(64, 8, 488),
    "ml.p4d.24xlarge": HostShape(96, 8, 1152),
    "ml.g4dn.xlarge": HostShape(4, 1, 16),
    "ml.g4dn.12xlarge": HostShape(48, 4, 192),
    "ml.g5.xlarge": HostShape(4, 1, 16),
    "ml.g5.2xlarge": HostShape(8, 1, 32),
    "ml.g5.12xlarge": HostShape(48, 4, 192),
    "ml.g5.48xlarge": HostShape(192, 8, 768),
    "ml.trn1.32xlarge": HostShape(128, 0, 512),
}


def parse_instance_types(
    raw: str, name: str = "TRAINPORT_RAY_INSTANCE_TYPES"
) -> dict[str, HostShape]:
    """``{"ml.x": {"cpus": 4, "gpus": 1, "memory_gib": 16}, ...}`` as shapes."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{name} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValidationError(f'{name}: write an object, {{"ml.m5.large": {{"cpus": 2}}}}')
    shapes = {}
    for key, value in doc.items():
        if not isinstance(value, dict) or set(value) - {"cpus", "gpus", "memory_gib"}:
            raise ValidationError(f"{name}: {key}: give cpus, and gpus and memory_gib if any")
        try:
            shape = HostShape(
                float(value["cpus"]), float(value.get("gpus", 0)), float(value.get("memory_gib", 0))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"{name}: {key}: cpus, gpus and memory_gib are numbers") from exc
        if shape.cpus <= 0 or shape.gpus < 0 or shape.memory_gib < 0:
            raise ValidationError(f"{name}: {key}: cpus must be positive, the others not negative")
        shapes[key] = shape
    return shapes
