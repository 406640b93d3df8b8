"""What a host needs from its Ray node, and what to say while the cluster cannot give it.

A host's ``InstanceType`` becomes a Ray resource bundle (CPUs, GPUs, memory) through
:data:`INSTANCE_TYPES`, which configuration may extend or override
(``TRAINPORT_RAY_INSTANCE_TYPES``). Everything here is a pure function of the request and
of the nodes Ray reports, so the decisions (fits now, waits, never fits) are tested without
a cluster.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainport.errors import ValidationError

__all__ = [
    "INSTANCE_TYPES",
    "HostShape",
    "never_fits",
    "parse_instance_types",
    "shape_of",
    "waiting_message",
]

_GIB = 1 << 30


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
            bundle["memory"] = self.memory_gib * _GIB
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


def shape_of(instance_type: str, overrides: Mapping[str, HostShape]) -> HostShape:
    shape = overrides.get(instance_type) or INSTANCE_TYPES.get(instance_type)
    if shape is None:
        raise ValidationError(
            f"ResourceConfig.InstanceType {instance_type!r} has no size known to the ray "
            "runner; give it one in TRAINPORT_RAY_INSTANCE_TYPES, e.g. "
            f'{{"{instance_type}": {{"cpus": 4, "gpus": 0, "memory_gib": 16}}}}'
        )
    return shape


def never_fits(
    hosts: Sequence[tuple[str, str, HostShape]], nodes: Sequence[Mapping[str, float]]
) -> str | None:
    """Why no cluster shaped like ``nodes`` (the live nodes' total resources) could ever
    hold the job, if so: a host no node is big enough for. ``hosts`` are (host, type,
    shape)."""
    for host, instance_type, shape in hosts:
        if not any(shape.fits(node) for node in nodes):
            biggest = max(nodes, key=lambda n: n.get("CPU", 0.0), default={})
            have = HostShape(
                biggest.get("CPU", 0.0),
                biggest.get("GPU", 0.0),
                round(biggest.get("memory", 0.0) / _GIB, 1),
            )
            return (
                f"host {host} ({instance_type}) needs a node with {shape.describe()}; no node "
                f"of this Ray cluster has that (the largest has {have.describe()}). Choose a "
                "smaller InstanceType, or size it in TRAINPORT_RAY_INSTANCE_TYPES"
            )
    return None


def waiting_message(
    hosts: Sequence[tuple[str, str, HostShape]], nodes: Sequence[Mapping[str, float]]
) -> str:
    """The status message of a job waiting for the cluster: what it needs and has."""
    kinds: dict[HostShape, int] = {}
    for _, _, shape in hosts:
        kinds[shape] = kinds.get(shape, 0) + 1
    needs = "; ".join(f"{count} with {shape.describe()}" for shape, count in kinds.items())
    could = min(sum(1 for n in nodes if shape.fits(n)) for shape in kinds)
    return (
        f"Waiting for the Ray cluster: the job needs {len(hosts)} nodes, one per host "
        f"({needs}), free at once; {len(nodes)} live nodes, {could} of them big enough"
    )
