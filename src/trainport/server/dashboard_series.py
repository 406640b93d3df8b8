"""What the dashboard draws and compares, shaped from a job's record and its folder.

- :func:`metric_steps`: each metric point's step or epoch, read from the log line that gave
  the point (a point's time is its line's time, to the millisecond, as the agent writes
  both). The line is searched with one fixed pattern of ours, never the job's own Regex,
  which may take unbounded time and is only ever run in the agent's matcher process.
  Each log is read on from where the last request stopped (:class:`StepIndex`).
- :func:`job_settings`: everything of the request a person set, Environment values left
  out (they may hold secrets; the names are shown).
- :func:`host_order`: the job's hosts, the one that failed first.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["host_order", "job_settings", "metric_steps"]

# "epoch 3", "Epoch: 3", "step=120", "iter 7", "[epoch 2/10]": the counter a training log
# most often puts beside its metrics. Linear-time; the first counter of the line wins.
_COUNTER = re.compile(r"\b(epoch|step|iter(?:ation)?)s?\b\s*[=:#]?\s*\[?(\d+)", re.IGNORECASE)
# Logs past this are not read for steps: the charts fall back to time.
_MAX_LOG_BYTES = 64 << 20
_FAILED_HOST = re.compile(r"^(algo-\d+|[A-Za-z0-9_.-]+-\d+): ")

# Request fields a person sets and the settings panel shows, in its order.
_SETTINGS = (
    "AlgorithmSpecification",
    "ResourceConfig",
    "InputDataConfig",
    "OutputDataConfig",
    "CheckpointConfig",
    "StoppingCondition",
    "RetryStrategy",
    "HyperParameters",
    "VpcConfig",
    "EnableNetworkIsolation",
    "EnableManagedSpotTraining",
    "TensorBoardOutputConfig",
    "ExperimentConfig",
    "RoleArn",
)


class StepIndex:
    """Line time (as the log writes it, ``%.3f``) -> (counter word, value) for the lines
    of each log that carry a counter, read on from where the last call stopped: a job's
    page asks every 2 s, and a log only grows. Kept for the last :data:`_KEPT` logs."""

    _KEPT = 64

    def __init__(self) -> None:
        self._logs: OrderedDict[Path, tuple[int, dict[str, tuple[str, int]]]] = OrderedDict()
        self._lock = threading.Lock()

    def counters(self, log_path: Path) -> dict[str, tuple[str, int]]:
        with self._lock:
            offset, found = self._logs.pop(log_path, (0, {}))
        try:
            size = log_path.stat().st_size
            if size < offset:  # a new log in its place (a job of the same name)
                offset, found = 0, {}
            if size <= _MAX_LOG_BYTES:
                offset = _read_counters(log_path, offset, found)
        except OSError:
            pass
        with self._lock:
            self._logs[log_path] = (offset, found)
            while len(self._logs) > self._KEPT:
                self._logs.popitem(last=False)
        return found


def _read_counters(log_path: Path, offset: int, found: dict[str, tuple[str, int]]) -> int:
    """Add the counters of the whole lines past ``offset``; the offset after them."""
    with open(log_path, "rb") as log:
        log.seek(offset)
        for raw in log:
            if not raw.endswith(b"\n"):
                break  # a line still being written: read it whole next time
            offset += len(raw)
            stamp, _, text = raw.decode("utf-8", "replace").partition("\t")
            match = _COUNTER.search(text)
            if match is not None:
                word = match.group(1).lower()
                found[stamp] = ("iteration" if word.startswith("iter") else word, int(match[2]))
    return offset


_STEPS = StepIndex()


def metric_steps(
    log_path: Path, series: Mapping[str, Sequence[tuple[float, float]]]
) -> dict[str, dict[str, Any]]:
    """Each metric's points as ``[time, value, step]`` (step None where its line has no
    counter) with ``axis``, the counter's word ("epoch", "step", "iteration"; None when no
    point has one)."""
    counters = _STEPS.counters(log_path) if series else {}
    out: dict[str, dict[str, Any]] = {}
    for name, points in series.items():
        rows: list[list[Any]] = []
        words: dict[str, int] = {}
        for t, value in points:
            counter = counters.get(f"{t:.3f}")
            if counter is not None:
                words[counter[0]] = words.get(counter[0], 0) + 1
            rows.append([t, value, counter[1] if counter else None])
        axis = max(words, key=lambda w: words[w]) if words else None
        out[name] = {"points": rows, "axis": axis}
    return out


def job_settings(described: Mapping[str, Any], tags: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The request's settings from a DescribeTrainingJob response, with ``Tags`` and
    ``EnvironmentNames`` (the Environment's names, never its values)."""
    out = {key: described[key] for key in _SETTINGS if key in described}
    env = described.get("Environment") or {}
    if env:
        out["EnvironmentNames"] = sorted(env)
    tag_list = [{"Key": k, "Value": v} for k, v in tags]
    if tag_list:
        out["Tags"] = tag_list
    return out


def host_order(hosts: Sequence[str], failure_reason: str | None) -> list[dict[str, Any]]:
    """The hosts, each ``{"host", "failed"}``, the one the failure reason names first."""
    failed = None
    match = _FAILED_HOST.match(failure_reason or "")
    if match is not None and match.group(1) in hosts:
        failed = match.group(1)
    ordered = sorted(hosts, key=lambda h: (h != failed, _host_number(h), h))
    return [{"host": h, "failed": h == failed} for h in ordered]


def _host_number(host: str) -> int:
    tail = host.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0
