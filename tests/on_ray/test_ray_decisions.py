"""The ray runner's pure decisions, without a cluster."""

from __future__ import annotations

import pytest

from tests.conftest import python_job, request
from trainport.errors import ValidationError
from trainport.placement.ray import NodeInfo, check_ray_job, version_problem
from trainport.spec import parse_request


def node(address: str, version: str) -> NodeInfo:
    return NodeInfo("f" * 56, address, "eth0", version, "3.11.2")


def test_nodes_with_another_trainport_are_named_with_both_versions() -> None:
    assert version_problem("0.1.0", {"algo-1": node("10.0.0.2", "0.1.0")}) is None
    problem = version_problem(
        "0.1.0", {"algo-1": node("10.0.0.2", "0.1.0"), "algo-2": node("10.0.0.3", "0.0.9")}
    )
    assert problem == (
        "host algo-2 on node 10.0.0.3 (id ffffffffffff) has trainport 0.0.9; this "
        "supervisor runs trainport 0.1.0: install 0.1.0 on every node"
    )


def test_what_the_ray_runner_cannot_run_yet_is_refused_at_submission() -> None:
    mpi = python_job("mpi", "print(1)", Tags=[{"Key": "trainport:distribution", "Value": "mpi"}])
    with pytest.raises(ValidationError, match="does not run MPI jobs yet"):
        check_ray_job(parse_request(mpi))
    emulated = request("ns", Tags=[{"Key": "trainport:network", "Value": "namespaces"}])
    with pytest.raises(ValidationError, match="its own node and network"):
        check_ray_job(parse_request(emulated))


def test_the_tag_chooses_the_ray_runner() -> None:
    spec = parse_request(request("tagged", Tags=[{"Key": "trainport:runner", "Value": "ray"}]))
    assert spec.runner == "ray"
    with pytest.raises(ValidationError, match="use auto, sandbox, process or ray"):
        parse_request(request("bad", Tags=[{"Key": "trainport:runner", "Value": "cluster"}]))
