"""The ray runner's pure decisions, without a cluster."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import request
from trainport.config import load_settings
from trainport.errors import ValidationError
from trainport.jobs.service import JobService
from trainport.placement.ray import NodeInfo, check_ray_job, isolation_problem, version_problem
from trainport.runners.overlay import NodeNetwork, Overlay, plan_overlay
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


def test_what_the_ray_runner_cannot_run_is_refused_at_submission() -> None:
    isolated = request(
        "iso",
        EnableNetworkIsolation=True,
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1},
    )
    check_ray_job(parse_request(isolated))  # the nodes decide (see plan_overlay)
    check_ray_job(parse_request(request("iso-1", EnableNetworkIsolation=True)))
    emulated = request("ns", Tags=[{"Key": "trainport:network", "Value": "namespaces"}])
    with pytest.raises(ValidationError, match="its own node and network"):
        check_ray_job(parse_request(emulated))


def test_the_tag_chooses_the_ray_runner() -> None:
    spec = parse_request(request("tagged", Tags=[{"Key": "trainport:runner", "Value": "ray"}]))
    assert spec.runner == "ray"
    with pytest.raises(ValidationError, match="use auto, sandbox, process or ray"):
        parse_request(request("bad", Tags=[{"Key": "trainport:runner", "Value": "cluster"}]))


GIB = 1 << 30


def test_instance_types_become_bundles_and_configuration_overrides_them() -> None:
    from trainport.placement.capacity import HostShape, parse_instance_types, shape_of

    assert shape_of("ml.m5.large", {}).bundle() == {"CPU": 2, "memory": 8 * GIB}
    assert shape_of("ml.g5.xlarge", {}).bundle() == {"CPU": 4, "GPU": 1, "memory": 16 * GIB}
    mine = parse_instance_types('{"ml.m5.large": {"cpus": 1}, "lab.box": {"cpus": 8, "gpus": 2}}')
    assert shape_of("ml.m5.large", mine) == HostShape(1, 0, 0)
    assert shape_of("lab.box", mine).bundle() == {"CPU": 8, "GPU": 2}
    with pytest.raises(ValidationError, match=r"'ml\.unknown' has no size known"):
        shape_of("ml.unknown", mine)
    with pytest.raises(ValidationError, match="cpus must be positive"):
        parse_instance_types('{"x": {"cpus": 0}}')
    with pytest.raises(ValidationError, match="is not JSON"):
        parse_instance_types("{")


def test_a_job_no_node_could_hold_is_told_what_is_missing() -> None:
    from trainport.placement.capacity import HostShape, never_fits, waiting_message

    nodes = [{"CPU": 2.0, "memory": 16.0 * GIB}, {"CPU": 4.0, "memory": 16.0 * GIB}]
    small = ("algo-1", "ml.m5.large", HostShape(2, 0, 8))
    big = ("algo-2", "ml.g5.xlarge", HostShape(4, 1, 16))
    assert never_fits([small, small], nodes) is None
    assert never_fits([small, big], nodes) == (
        "host algo-2 (ml.g5.xlarge) needs a node with 4 CPUs, 1 GPUs, 16 GiB memory; no node "
        "of this Ray cluster has that (the largest has 4 CPUs, 16 GiB memory). Choose a "
        "smaller InstanceType, or size it in TRAINPORT_RAY_INSTANCE_TYPES"
    )
    three = [small, ("algo-2", "ml.m5.large", HostShape(2, 0, 8)), small]
    assert waiting_message(three, nodes) == (
        "Waiting for the Ray cluster: the job needs 3 nodes, one per host (3 with 2 CPUs, "
        "8 GiB memory), free at once; 2 live nodes, 2 of them big enough"
    )


def test_a_node_without_a_sandbox_is_refused_when_the_job_must_run_isolated() -> None:
    bare = dataclasses.replace(node("10.0.0.3", "0.1.0"), sandbox_problem="no user namespaces")
    nodes = {"algo-1": node("10.0.0.2", "0.1.0"), "algo-2": bare}
    assert isolation_problem(nodes, required=False) is None
    assert isolation_problem({"algo-1": node("10.0.0.2", "0.1.0")}, required=True) is None
    problem = isolation_problem(nodes, required=True)
    assert problem is not None
    assert problem.startswith(
        "host algo-2 on node 10.0.0.3 (id ffffffffffff) cannot make a sandbox "
        "(no user namespaces); this job must run isolated"
    )
    assert "TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER=1" in problem
    assert "algo-1" not in problem


@pytest.mark.parametrize("allow", [False, True])
def test_a_service_that_refuses_the_process_runner_makes_its_supervisors_require_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allow: bool
) -> None:
    # What the server refuses on its own machine must not run unisolated on a Ray node:
    # the supervisors it starts carry the requirement to the placement.
    started: list[dict[str, str]] = []

    class Started:
        pid = 0

        def __init__(self, argv: list[str], **kwargs: Any) -> None:
            started.append(kwargs["env"])

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", Started)
    settings = load_settings({"TRAINPORT_HOME": str(tmp_path)})
    service = JobService(settings, allow_process_runner=allow)
    service._start_supervisor("isolated")
    assert started[0].get("TRAINPORT_REQUIRE_ISOLATION") == (None if allow else "1")
    if not allow:
        assert load_settings(started[0]).require_isolation


def test_a_cluster_that_does_not_answer_is_said_at_submission(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import free_port

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    service = JobService(load_settings())
    with pytest.raises(ValidationError) as caught:
        service.create(request("no-head"), runner="ray")
    said = str(caught.value)
    assert "cannot reach the Ray cluster at RAY_ADDRESS=127.0.0.1:" in said
    assert "no Ray head runs there" in said and "Set RAY_ADDRESS" in said
    assert not service.db.exists("no-head")  # nothing stored


def network(address: str, problem: str | None = None, mtu: int = 1500) -> NodeNetwork:
    return NodeNetwork(address, mtu, ("10.0.0.0/24", "10.100.0.0/16"), problem)


def test_a_job_network_across_nodes_is_one_subnet_clear_of_every_nodes_routes() -> None:
    nodes = {"algo-1": network("10.0.0.2"), "algo-2": network("10.0.0.3", mtu=9001)}
    made = plan_overlay("run-1", nodes, isolated=False, cluster=("10.0.0.2", "10.0.0.3"))
    assert isinstance(made, Overlay)
    assert made.addresses() == {"algo-1": f"{made.subnet}.2", "algo-2": f"{made.subnet}.3"}
    assert (made.gateway("algo-1"), made.gateway("algo-2")) == (
        f"{made.subnet}.129",
        f"{made.subnet}.130",
    )
    assert not made.subnet.startswith("10.100.")  # a node has a route there
    assert made.mtu == 1450  # the smaller node's, less VXLAN's headers
    assert made.nodes == {"algo-1": "10.0.0.2", "algo-2": "10.0.0.3"}
    assert made.cluster == ("10.0.0.2", "10.0.0.3")
    v6 = plan_overlay("run-1", nodes, isolated=False, cluster=("10.0.0.2", "fd00::2", "bad"))
    assert isinstance(v6, Overlay) and v6.cluster == ("10.0.0.2",)
    again = plan_overlay("run-2", nodes, isolated=False, cluster=())
    assert isinstance(again, Overlay) and again.vni != made.vni  # a retry is another network
    assert 0 < made.vni < 1 << 24


def test_a_node_that_cannot_make_a_job_network_is_named() -> None:
    nodes = {"algo-1": network("10.0.0.2"), "algo-2": network("10.0.0.3", "needs root")}
    said = plan_overlay("run", nodes, isolated=False, cluster=())
    assert said == ("host algo-2's node 10.0.0.3 cannot give it a network of its own (needs root)")
    many = {f"algo-{k}": network(f"10.0.1.{k}") for k in range(1, 128)}
    assert plan_overlay("run", many, isolated=False, cluster=()) == (
        "a job network holds at most 126 hosts, and the job has 127"
    )
