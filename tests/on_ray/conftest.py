"""One real Ray cluster for the ray runner's tests: two nodes, each in its own network
namespace, started once per module and always torn down (Ray processes, namespaces, bridge)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.on_ray.cluster import NamespaceCluster


def cluster_problem() -> str | None:
    from trainport.runners.netns import netns_problem

    try:
        import ray  # noqa: F401
    except ImportError as exc:
        return f"Ray is not installed ({exc})"
    return netns_problem()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[NamespaceCluster]:
    problem = cluster_problem()
    require(problem is None, f"no namespace Ray cluster here: {problem}")
    work = Path(tempfile.mkdtemp(prefix="trainport-ray-cluster-"))
    cluster = NamespaceCluster(work, nodes=2, cpus=2)
    cluster.start()
    try:
        yield cluster
    finally:
        import ray

        ray.shutdown()  # the tests' own connection (a submission checks the cluster's size)
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def on_ray(
    home: Path, ray_cluster: NamespaceCluster, monkeypatch: pytest.MonkeyPatch
) -> NamespaceCluster:
    """Jobs submitted in this test go to the cluster (the supervisors inherit this env)."""
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("TRAINPORT_RUNNER", "ray")
    assert os.environ["RAY_ADDRESS"] == ray_cluster.address
    return ray_cluster
