"""MetricDefinitions: regexes that turn training log lines into metric points."""

from __future__ import annotations

import re
from collections.abc import Sequence

from trainport.errors import ValidationError
from trainport.jobs.records import MetricPoint

__all__ = ["MetricParser"]


class MetricParser:
    def __init__(self, definitions: Sequence[tuple[str, str]]) -> None:
        self._rules: list[tuple[str, re.Pattern[str]]] = []
        for name, regex in definitions:
            try:
                self._rules.append((name, re.compile(regex)))
            except re.error as exc:
                raise ValidationError(
                    f"MetricDefinitions {name!r}: the Regex {regex!r} does not compile: {exc}"
                ) from exc

    def __bool__(self) -> bool:
        return bool(self._rules)

    def parse(self, line: str, timestamp: float) -> list[MetricPoint]:
        points = []
        for name, rule in self._rules:
            for match in rule.finditer(line):
                raw = match.group(1) if rule.groups else match.group(0)
                try:
                    value = float(raw)
                except (TypeError, ValueError):
                    continue
                if value == value:  # NaN is not a metric value SageMaker would record
                    points.append(MetricPoint(name, value, timestamp))
        return points
