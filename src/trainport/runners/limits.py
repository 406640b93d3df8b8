"""A host's resources: its instance type's memory, CPUs and processes, and who it runs as.

SageMaker gives a training host exactly its instance: a job on ``ml.m5.large`` has 2 vCPUs
and 8 GiB, whatever else the hardware holds. Here many hosts share one machine, so the
sandbox enforces the same shape with cgroups (memory, CPU time, process count), and its
in-memory ``/tmp`` and ``/dev/shm`` count against that memory. The tag
``trainport:resources=machine`` lifts the limits for a job that should have the whole
machine (one job at a time on a workstation, say).

Also here: the identity a sandboxed host runs as on the machine when trainport runs as
root. Its uid 0 inside maps to one uid of a range kept for jobs, a different one for each
job's host, so nothing a job writes or starts carries any privilege outside.

Everything but :func:`memory_outcome` is a pure function of the request.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainport import tags
from trainport.errors import ValidationError
from trainport.instances import INSTANCE_TYPES, HostShape, parse_instance_types

__all__ = [
    "RESOURCES_TAG",
    "Limits",
    "host_limits",
    "job_uid",
    "memory_outcome",
    "parse_resources_tag",
]

log = logging.getLogger(__name__)

RESOURCES_TAG = "trainport:resources"
_GIB = 1 << 30
# Processes (threads count: Linux limits tasks) per vCPU: generous for data loaders and
# their thread pools, far below what would make the machine unresponsive.
TASKS_PER_CPU = 1024
# The uids kept for jobs: above the ranges /etc/subuid hands out to people (100000 +
# 65536 per user) and below the overflow ids. One per job host, from its job's and host's
# names.
JOB_UID_BASE = 1_800_000_000
JOB_UID_COUNT = 100_000_000


@dataclass(frozen=True)
class Limits:
    """What one host may use; ``instance_type`` is said in reasons."""

    instance_type: str
    memory_bytes: int
    cpus: float
    tasks: int

    def describe(self) -> str:
        return (
            f"{self.instance_type}: {self.memory_bytes / _GIB:g} GiB memory, "
            f"{self.cpus:g} CPUs, {self.tasks} processes"
        )


def parse_resources_tag(value: str | None) -> str:
    """``instance`` (the default: the instance type's shape) or ``machine``."""
    if value is None:
        return "instance"
    if value not in ("instance", "machine"):
        raise ValidationError(
            f"Tags: {RESOURCES_TAG}={value!r}; use instance (the instance type's memory, "
            "CPUs and processes, the default) or machine (no limits)"
        )
    return value


@tags.parser(RESOURCES_TAG)
def _check_tag(value: str, others: Mapping[str, str]) -> None:
    parse_resources_tag(value)


def host_limits(instance_type: str, tags: Mapping[str, str], sizes: str = "") -> Limits | None:
    """The host's limits, or None when it has the whole machine: by the tag, or because
    its instance type has no known size (``local``, or a type the table lacks). ``sizes``
    is the operator's JSON of instance type sizes (TRAINPORT_RAY_INSTANCE_TYPES), which
    adds to and overrides the table."""
    if parse_resources_tag(tags.get(RESOURCES_TAG)) == "machine":
        return None
    overrides: Mapping[str, HostShape] = parse_instance_types(sizes) if sizes else {}
    shape = overrides.get(instance_type) or INSTANCE_TYPES.get(instance_type)
    if shape is None or not shape.memory_gib:
        return None
    return Limits(
        instance_type=instance_type,
        memory_bytes=int(shape.memory_gib * _GIB),
        cpus=shape.cpus,
        tasks=max(int(shape.cpus * TASKS_PER_CPU), TASKS_PER_CPU),
    )


def job_uid(host_root: Path) -> int:
    """The machine uid a job's host (its tree, ``.../jobs/NAME/hosts/algo-k``) runs as
    when trainport is root."""
    digest = hashlib.sha256(str(host_root).encode()).digest()
    return JOB_UID_BASE + int.from_bytes(digest[:8], "big") % JOB_UID_COUNT


def memory_outcome(cgroup: str, limits: Limits) -> str | None:
    """Why the host ended, if its memory limit killed a process of it: read from the
    host's cgroup (v2, else v1's memory controller) before it is removed."""
    v2 = Path("/sys/fs/cgroup") / cgroup.lstrip("/")
    v1 = Path("/sys/fs/cgroup/memory") / cgroup.lstrip("/")
    kills = peak = None
    places = (
        (v2 / "memory.events", v2 / "memory.peak"),
        (v1 / "memory.oom_control", v1 / "memory.max_usage_in_bytes"),
    )
    for events, high in places:
        try:
            text = events.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                kills = int(value)
        try:
            peak = int(high.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            peak = None
        break
    if not kills:
        return None
    used = f"{peak / _GIB:.2f} GiB" if peak else "all of it"
    return (
        f"OutOfMemoryError: the training process was killed for using more memory than its "
        f"instance has: it used {used} of the {limits.memory_bytes / _GIB:g} GiB of "
        f"{limits.instance_type} ({limits.describe()}); files in /tmp and /dev/shm count "
        "too. Choose an instance type with more memory, use less per host, or tag the job "
        f"{RESOURCES_TAG}=machine to give it the whole machine"
    )
