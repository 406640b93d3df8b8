"""A tuning job whose children run on a real two-node Ray cluster: the children are ray
jobs, spread over the nodes, and the tuning job ends as on this machine."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.on_ray.cluster import NamespaceCluster
from tests.on_ray.conftest import on_ray, ray_cluster  # noqa: F401
from tests.server.tuning_support import put_source, tuning_request
from trainport.jobs.service import JobService
from trainport.tuning.driver import TuningDriver
from trainport.tuning.service import TuningService

pytestmark = pytest.mark.slow


def test_children_run_on_the_ray_cluster(
    home: Path,
    tmp_path: Path,
    on_ray: NamespaceCluster,  # noqa: F811
    service: JobService,
) -> None:
    put_source(home, tmp_path)
    tunings = TuningService(service)
    driver = TuningDriver(tunings)
    request = tuning_request("on-ray", "Random", max_jobs=4, parallel=2, RandomSeed=2)
    tunings.create(request)
    deadline = time.monotonic() + 400
    while tunings.get("on-ray").status not in ("Completed", "Failed", "Stopped"):
        assert time.monotonic() < deadline, tunings.describe("on-ray")
        service.reconcile()
        driver.step()
        time.sleep(0.2)
    d = tunings.describe("on-ray")
    assert d["HyperParameterTuningJobStatus"] == "Completed", d
    record = tunings.get("on-ray")
    placed = set()
    for child in record.children:
        job = service.get(child.name)
        assert job.runner == "ray" and job.status == "Completed", job.failure_reason
        placed |= {
            t.split(" runs on Ray node ")[1].split()[0]
            for _, t in service.logs(child.name)
            if " runs on Ray node " in t
        }
    # Two children at a time on nodes that each hold one: both nodes ran children.
    assert placed == {n.address for n in on_ray.nodes}
