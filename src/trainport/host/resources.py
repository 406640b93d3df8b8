"""A host's CPU and memory use over time, sampled while its training process runs.

The agent samples what the training process group uses once a :data:`SAMPLE_SECONDS`:
from the group's own cgroup when it has one (a sandboxed host's runc container gets
``/trainport/<container>``, see :mod:`trainport.runners.limits`), else from the processes
of the group and their descendants as ``/proc`` shows them (the process runner, where the
host shares the agent's cgroup). Each sample is (unix time, CPUs busy, memory bytes): CPUs
busy is CPU seconds per wall second since the previous sample (1.5 = one and a half cores),
memory is what the host holds, page cache it could drop left out (as ``docker stats`` counts
it).

Samples travel upward as :class:`ResourcesSampled` events, like metric points, and the
supervisor appends them to ``resources/<host>.tsv`` in the job's folder
(:func:`append_resource_samples`), which :func:`read_resource_samples` reads back for the
dashboard. Sampling is best-effort: a read that fails is a sample skipped, never an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SAMPLE_SECONDS",
    "ResourceSampler",
    "ResourcesSampled",
    "Usage",
    "append_resource_samples",
    "read_resource_samples",
    "resource_path",
    "usage_of_group",
]

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 1.0
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

#: One sample: (unix time, CPUs busy, memory bytes).
Sample = tuple[float, float, int]


@dataclass(frozen=True)
class ResourcesSampled:
    """CPU and memory samples of ``host``'s training processes, oldest first."""

    host: str
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Usage:
    """What a group has used so far: CPU seconds in all, memory bytes now."""

    cpu_seconds: float
    memory_bytes: int
    source: str  # "cgroup" or "processes"


def resource_path(job_dir: Path, host: str) -> Path:
    return job_dir / "resources" / f"{host}.tsv"


def append_resource_samples(path: Path, samples: Iterable[Sample]) -> None:
    """Add ``samples`` to a host's file, each as "time<TAB>cpus<TAB>memory bytes"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.writelines(f"{t:.3f}\t{cpus:.3f}\t{memory}\n" for t, cpus, memory in samples)


def read_resource_samples(path: Path) -> list[Sample]:
    """The samples in a host's file (none if it has none yet); torn lines skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    samples: list[Sample] = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        try:
            samples.append((float(parts[0]), float(parts[1]), int(parts[2])))
        except ValueError:
            continue
    return samples


# -- reading usage ----------------------------------------------------------------------------


def _cgroups_of(pid: int | str) -> dict[str, str]:
    """Controller (``""`` for v2's unified tree) -> cgroup path of ``pid``."""
    out: dict[str, str] = {}
    with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                out[controller] = path
    return out


def _stat_value(path: Path, key: str) -> int:
    """``key``'s value in a cgroup's ``memory.stat`` (0 when absent)."""
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _cgroup_usage(pgid: int) -> Usage | None:
    """The group's own cgroup's usage, or None when the group shares the agent's cgroup
    (whose usage would be every host's and the agent's own)."""
    try:
        theirs, ours = _cgroups_of(pgid), _cgroups_of("self")
    except (OSError, ValueError):
        return None
    v1_memory, v1_cpu = theirs.get("memory"), theirs.get("cpuacct")
    if v1_memory and v1_cpu and v1_memory != ours.get("memory"):
        memory_dir = _CGROUP_ROOT / "memory" / v1_memory.lstrip("/")
        cpu_dir = next(
            (
                _CGROUP_ROOT / name / v1_cpu.lstrip("/")
                for name in ("cpuacct", "cpu,cpuacct")
                if (_CGROUP_ROOT / name / v1_cpu.lstrip("/") / "cpuacct.usage").exists()
            ),
            None,
        )
        if cpu_dir is None:
            return None
        try:
            used = int((memory_dir / "memory.usage_in_bytes").read_text())
            cpu_ns = int((cpu_dir / "cpuacct.usage").read_text())
        except (OSError, ValueError):
            return None
        cache = _stat_value(memory_dir / "memory.stat", "total_inactive_file")
        return Usage(cpu_ns / 1e9, max(0, used - cache), "cgroup")
    unified = theirs.get("")
    if unified and unified != ours.get(""):
        group_dir = _CGROUP_ROOT / unified.lstrip("/")
        try:
            used = int((group_dir / "memory.current").read_text())
            cpu_us = _stat_value(group_dir / "cpu.stat", "usage_usec")
        except (OSError, ValueError):
            return None
        cache = _stat_value(group_dir / "memory.stat", "inactive_file")
        return Usage(cpu_us / 1e6, max(0, used - cache), "cgroup")
    return None


def _process_usage(pgid: int) -> Usage:
    """The sum over the group's processes and their descendants (an init such as tini
    starts its child in a group of its own): CPU time of each and of its reaped children
    (so a worker that ended still counts), resident memory of the living."""
    found: dict[int, tuple[int, int, int]] = {}  # pid -> (parent, CPU ticks, RSS pages)
    members: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) < 22:
            continue
        pid = int(entry)
        ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
        found[pid] = (int(fields[1]), ticks, int(fields[21]))
        if int(fields[2]) == pgid:
            members.append(pid)
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in found.items():
        children.setdefault(parent, []).append(pid)
    counted: set[int] = set()
    todo = members
    while todo:
        pid = todo.pop()
        if pid not in counted:
            counted.add(pid)
            todo.extend(children.get(pid, ()))
    cpu_ticks = sum(found[pid][1] for pid in counted)
    rss_pages = sum(found[pid][2] for pid in counted)
    return Usage(cpu_ticks / _TICKS, rss_pages * _PAGE, "processes")


def usage_of_group(pgid: int) -> Usage:
    """What the training process group ``pgid`` has used: its cgroup's account when it
    has a cgroup of its own, else its processes'."""
    return _cgroup_usage(pgid) or _process_usage(pgid)


# -- the sampler ------------------------------------------------------------------------------


class ResourceSampler:
    """Samples a process group from a thread until :meth:`stop`, handing each sample to
    ``on_sample`` (from that thread)."""

    def __init__(
        self,
        pgid: int,
        on_sample: Callable[[Sample], None],
        interval: float = SAMPLE_SECONDS,
        read: Callable[[int], Usage] = usage_of_group,
    ) -> None:
        self.pgid = pgid
        self.on_sample = on_sample
        self.interval = interval
        self._read = read
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        previous: tuple[float, Usage] | None = None
        while True:
            try:
                now, usage = time.monotonic(), self._read(self.pgid)
            except (OSError, ValueError) as exc:
                log.debug("resource sample of group %d skipped: %s", self.pgid, exc)
            else:
                if previous is not None:
                    then, before = previous
                    # A group that moved between accounts (its cgroup appears once runc
                    # has it) would give a negative difference: that interval counts zero.
                    busy = max(0.0, usage.cpu_seconds - before.cpu_seconds) / (now - then)
                    self.on_sample((time.time(), round(busy, 3), usage.memory_bytes))
                previous = (now, usage)
            if self._done.wait(self.interval):
                return
