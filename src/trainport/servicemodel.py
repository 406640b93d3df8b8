"""SageMaker's request shapes, read from botocore's own service model, and a validator.

botocore's model is the source of truth for what a CreateTrainingJob request may hold, but
loading it through botocore costs about a second (the importing of botocore's client stack
and the parsing of the whole SageMaker model), which every ``trainport run`` would pay. So
we read the model file directly, keep only the shapes reachable from the request, and cache
that subset under TRAINPORT_HOME keyed by botocore's version. The validator speaks
botocore's messages ("Unknown parameter in X: ...", "Missing required parameter in ...")
and also checks what botocore leaves to the server: patterns, maximum lengths and sizes,
enums.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib.util
import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["request_shapes", "validate"]

Shapes = dict[str, dict[str, Any]]


def _model_file() -> Path:
    spec = importlib.util.find_spec("botocore")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("botocore is not installed; reinstall trainport")
    data = Path(next(iter(spec.submodule_search_locations))) / "data" / "sagemaker"
    versions = sorted(p for p in data.iterdir() if p.is_dir())
    for name in ("service-2.json.gz", "service-2.json"):
        candidate = versions[-1] / name
        if candidate.exists():
            return candidate
    raise RuntimeError(f"no SageMaker service model under {versions[-1]}")


def _reachable(shapes: Shapes, root: str) -> Shapes:
    keep: Shapes = {}
    todo = [root]
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        shape = shapes[name]
        keep[name] = shape
        refs = [m["shape"] for m in shape.get("members", {}).values()]
        refs += [shape[k]["shape"] for k in ("member", "key", "value") if k in shape]
        todo += refs
    return keep


@functools.cache
def request_shapes(operation: str, cache_dir: Path | None = None) -> tuple[str, Shapes]:
    """The input shape's name and every shape it reaches, for one SageMaker operation."""
    model = _model_file()
    stamp = f"{model.stat().st_size}-{int(model.stat().st_mtime)}"
    cached = cache_dir / f"sagemaker-{operation}-{stamp}.json" if cache_dir else None
    if cached is not None and cached.exists():
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(cached.read_text())
            return doc["root"], doc["shapes"]
    raw = model.read_bytes()
    full = json.loads(gzip.decompress(raw) if model.suffix == ".gz" else raw)
    root = full["operations"][operation]["input"]["shape"]
    subset = _reachable(full["shapes"], root)
    if cached is not None:
        with contextlib.suppress(OSError):
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"root": root, "shapes": subset}))
            os.replace(tmp, cached)
    return root, subset


# Values trainport accepts beyond the model's enums: the SageMaker SDK's local-mode
# instance types, which say "this machine".
_EXTRA_ENUM_VALUES = {"TrainingInstanceType": ("local", "local_gpu")}

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "long": (int,),
    "boolean": (bool,),
    "float": (float, int),
    "double": (float, int),
    "list": (list, tuple),
    "map": (dict,),
    "structure": (dict,),
    "blob": (bytes, bytearray, str),
    "timestamp": (str, int, float),
}


def _type_ok(kind: str, value: Any) -> bool:
    if kind in ("integer", "long", "float", "double") and isinstance(value, bool):
        return False
    if kind == "timestamp":
        import datetime

        return isinstance(value, (*_PY_TYPES[kind], datetime.datetime))
    return isinstance(value, _PY_TYPES.get(kind, (object,)))


def validate(params: Any, root: str, shapes: Shapes) -> list[str]:
    """Every problem with ``params`` as the shape ``root``; empty when it is valid."""
    problems: list[str] = []
    _check(params, root, shapes, "", problems)
    return problems


def _check(value: Any, name: str, shapes: Shapes, path: str, out: list[str]) -> None:
    shape = shapes[name]
    kind = shape["type"]
    where = path or "input"
    if not _type_ok(kind, value):
        valid = ", ".join(str(t) for t in _PY_TYPES.get(kind, ()))
        out.append(
            f"Invalid type for parameter {where}, value: {value!r}, type: {type(value)}, "
            f"valid types: {valid}"
        )
        return
    if kind == "structure":
        members = shape.get("members", {})
        for required in shape.get("required", []):
            if required not in value:
                out.append(f'Missing required parameter in {where}: "{required}"')
        for key, sub in value.items():
            if key not in members:
                out.append(
                    f'Unknown parameter in {where}: "{key}", must be one of: ' + ", ".join(members)
                )
                continue
            _check(sub, members[key]["shape"], shapes, f"{path}.{key}" if path else key, out)
    elif kind == "list":
        _size(len(value), shape, where, "length", out)
        for i, item in enumerate(value):
            _check(item, shape["member"]["shape"], shapes, f"{where}[{i}]", out)
    elif kind == "map":
        _size(len(value), shape, where, "length", out)
        for key, item in value.items():
            _check(key, shape["key"]["shape"], shapes, f"{where} key {key!r}", out)
            _check(item, shape["value"]["shape"], shapes, f"{where}.{key}", out)
    elif kind == "string":
        _size(len(value), shape, where, "length", out)
        allowed = [*shape.get("enum", ()), *_EXTRA_ENUM_VALUES.get(name, ())]
        if "enum" in shape and value not in allowed:
            listed = ", ".join(allowed[:12]) + (
                f", ... ({len(allowed)} in all)" if len(allowed) > 12 else ""
            )
            out.append(f"{where}: {value!r} is not one of {listed}")
        elif "pattern" in shape and not _matches(shape["pattern"], value):
            out.append(f"{where}: {value!r} does not match the pattern {shape['pattern']}")
    elif kind in ("integer", "long", "float", "double"):
        _size(value, shape, where, "value", out)


def _size(n: float, shape: dict[str, Any], where: str, what: str, out: list[str]) -> None:
    if "min" in shape and n < shape["min"]:
        out.append(
            f"Invalid {what} for parameter {where}, value: {n}, valid min {what}: {shape['min']}"
        )
    if "max" in shape and n > shape["max"]:
        out.append(
            f"Invalid {what} for parameter {where}, value: {n}, valid max {what}: {shape['max']}"
        )


@functools.lru_cache(maxsize=512)
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error:
        return None  # a pattern Python's re cannot read is not ours to enforce


def _matches(pattern: str, value: str) -> bool:
    compiled = _compiled(pattern)
    return compiled is None or compiled.fullmatch(value) is not None
