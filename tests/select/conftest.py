"""Fixtures for trainport.select tests: a small dataset and optional-package guards.

:func:`require` skips a test when Ray or Spark is missing, unless ``TRAINPORT_CI_NO_SKIP=1``
is set, where a missing package must fail the run instead of hiding behind a skip.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from tests.conftest import require as require_capability
from tests.conftest import require_module


def require(module: str, reason: str = "") -> ModuleType:
    """Import ``module``, or skip (fail under TRAINPORT_CI_NO_SKIP=1) when it is missing."""
    return require_module(module, reason)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    require_capability(path is not None, f"{name} is not on PATH")
    assert path is not None
    return path


@pytest.fixture(name="require", scope="session")
def require_fixture() -> object:
    """The :func:`require` guard, for tests (fixtures avoid importing conftest by name)."""
    return require


@pytest.fixture(name="require_binary", scope="session")
def require_binary_fixture() -> object:
    return require_binary


FEATURES = 6


def write_dataset(root: Path, sizes: list[int], val_rows: int = 300, seed: int = 0) -> Path:
    """Binary classification files of uneven sizes under root/train and root/val."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=FEATURES)
    (root / "train").mkdir(parents=True, exist_ok=True)
    (root / "val").mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, FEATURES)).astype("float32")
        np.savez(root / "train" / f"part-{i:02d}.npz", x=x, y=(x @ w > 0).astype("int64"))
    x = rng.normal(size=(val_rows, FEATURES)).astype("float32")
    np.savez(root / "val" / "val.npz", x=x, y=(x @ w > 0).astype("int64"))
    return root


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Uneven files make uneven partitions, so step weighting is visible in the metrics.
    return write_dataset(tmp_path_factory.mktemp("select-data"), [400, 260, 330, 170])


@pytest.fixture(scope="session")
def local_run(dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    """The reference run: the test grid on the local backend, results written out."""
    from select_testkit import workload

    from trainport.select.backends.local import LocalBackend
    from trainport.select.mop import run_workload

    out = tmp_path_factory.mktemp("select-local-out")
    return run_workload(workload(dataset, output=out), LocalBackend())
