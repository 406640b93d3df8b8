"""Execution backends for MOP, looked up by name and imported only when used.

``local`` (worker processes on this machine) is the default; ``ray`` and ``spark`` need
their packages, and the error says which one to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainport.errors import ValidationError
from trainport.select.backends.api import Backend

__all__ = ["BACKENDS", "Backend", "make_backend"]

BACKENDS: dict[str, tuple[str, str, str]] = {
    # name: (module, class, package to install)
    "local": ("trainport.select.backends.local", "LocalBackend", ""),
    "ray": ("trainport.select.backends.ray", "RayBackend", "ray"),
    "spark": ("trainport.select.backends.spark", "SparkBackend", "pyspark"),
}


def make_backend(name: str, **options: Any) -> Backend:
    """A backend by name, with its options (e.g. ``address`` for Ray, ``master`` for Spark)."""
    if name not in BACKENDS:
        raise ValidationError(f"backend={name!r}: use one of {', '.join(BACKENDS)}")
    module_name, cls_name, package = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValidationError(
            f"backend={name!r} needs the {package!r} package: pip install {package} "
            f"(or pip install 'trainport[select]')"
        ) from exc
    backend: Backend = getattr(module, cls_name)(**options)
    return backend
