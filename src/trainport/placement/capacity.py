"""What a host needs from its Ray node, and what to say while the cluster cannot give it.

A host's ``InstanceType`` becomes a Ray resource bundle (CPUs, GPUs, memory) through
:data:`trainport.instances.INSTANCE_TYPES` (re-exported here), which configuration may
extend or override (``TRAINPORT_RAY_INSTANCE_TYPES``). Everything here is a pure function
of the request and of the nodes Ray reports, so the decisions (fits now, waits, never fits)
are tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainport.errors import ValidationError
from trainport.instances import GIB, INSTANCE_TYPES, HostShape, parse_instance_types

__all__ = [
    "INSTANCE_TYPES",
    "HostShape",
    "never_fits",
    "parse_instance_types",
    "shape_of",
    "waiting_message",
]


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
                round(biggest.get("memory", 0.0) / GIB, 1),
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
