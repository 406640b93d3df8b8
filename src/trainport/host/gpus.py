"""Which of the machine's GPUs each host of a job gets.

SageMaker's hosts are separate instances, each with its own GPUs. Hosts that share one
machine here must not all drive every device, or ``InstanceCount 2`` on an 8-GPU machine
starts 8 ranks per host on the same 8 GPUs. So the machine's GPUs (those in the
supervisor's ``CUDA_VISIBLE_DEVICES`` if set, else every ``/dev/nvidiaN``) are split
between the hosts, and each host sees only its share through ``CUDA_VISIBLE_DEVICES``;
``SM_NUM_GPUS`` and the torchrun (or MPI) process count follow the share.

The split (:func:`share`) is a pure function of the GPU list, the host count and the
``trainport:gpus-per-host`` tag:

- no tag: each host gets ``G // N`` GPUs of its own, in order; with fewer GPUs than hosts
  each host gets one GPU and hosts share them in turn (host k gets GPU ``k % G``), which
  is said in the job's status message;
- ``K``: each host gets K GPUs, taken in turn from the list, so hosts share GPUs only when
  ``K x N > G`` (said in the status message); ``0`` gives every host the CPU alone; K above
  the machine's GPU count is refused when the host starts;
- ``all``: every host sees every GPU (hosts share all of them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainport import tags
from trainport.errors import ValidationError

__all__ = ["GpuShare", "machine_gpus", "share"]

TAG = "trainport:gpus-per-host"


@dataclass(frozen=True)
class GpuShare:
    """One host's GPUs (as the machine numbers them) and what to tell the user about it."""

    devices: tuple[str, ...]
    note: str | None = None
    machine: int = 0  # how many GPUs the machine lends to jobs

    def environment(self) -> dict[str, str]:
        """``CUDA_VISIBLE_DEVICES`` for the host (empty: it sees none); nothing without GPUs."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.devices)} if self.machine else {}


def machine_gpus(environ: Mapping[str, str], dev: Path = Path("/dev")) -> tuple[str, ...]:
    """The GPUs this machine lends to jobs: ``CUDA_VISIBLE_DEVICES`` if set, else /dev's."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1")
    try:
        names = os.listdir(dev)
    except OSError:
        return ()
    found = sorted(int(n[6:]) for n in names if re.fullmatch(r"nvidia[0-9]+", n))
    return tuple(str(n) for n in found)


def parse_tag(value: str | None) -> int | None:
    """The tag's value: None for the default split, -1 for ``all``, else K."""
    if value is None:
        return None
    if value == "all":
        return -1
    if value.isdigit() and int(value) <= 64:
        return int(value)
    raise ValidationError(f"Tags: {TAG}={value!r} must be a whole number from 0 to 64 or 'all'")


@tags.parser(TAG)
def _check_tag(value: str, others: Mapping[str, str]) -> None:
    parse_tag(value)


def share(gpus: Sequence[str], hosts: int, index: int, per_host: int | None) -> GpuShare:
    """The GPUs host ``index`` of ``hosts`` gets; ``per_host`` as :func:`parse_tag` gives."""
    count = len(gpus)
    if count == 0:
        return GpuShare(())
    if per_host == -1 or (per_host is None and hosts == 1):
        return GpuShare(tuple(gpus), None, count)
    if per_host is None:
        if count >= hosts:
            each = count // hosts
            left = count - each * hosts
            note = f"{left} of {count} GPUs unused ({hosts} hosts)" if left else None
            return GpuShare(tuple(gpus[index * each : (index + 1) * each]), note, count)
        return GpuShare(
            (gpus[index % count],),
            f"{hosts} hosts share {count} GPU{'s' if count > 1 else ''} (one each, in turn)",
            count,
        )
    if per_host > count:
        raise ValidationError(
            f"Tags: {TAG}={per_host} but this machine has {count} GPU"
            f"{'s' if count > 1 else ''}; ask for at most {count}"
        )
    devices = tuple(gpus[(index * per_host + i) % count] for i in range(per_host))
    note = None
    if per_host * hosts > count:
        note = f"{hosts} hosts x {per_host} GPUs share the machine's {count}"
    return GpuShare(devices, note, count)
