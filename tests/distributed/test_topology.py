"""Rank arithmetic: what torchrun assigns, what SageMaker's variables imply, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.distributed.support import REPO, free_port
from trainport.distributed import (
    Launcher,
    Topology,
    TopologyError,
    topology_from_env,
    torchrun_env,
    torchrun_topology,
)

SHAPES = [(1, 1), (1, 4), (2, 1), (2, 3), (3, 2), (4, 2)]


def torchrun_assigns(nnodes: int, nproc: int, node: int, local: int) -> dict[str, str]:
    """torchrun's variables for one worker, written out independently of the library."""
    return {
        "RANK": str(node * nproc + local),
        "WORLD_SIZE": str(nnodes * nproc),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nnodes),
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "7777",
    }


@pytest.mark.parametrize(("nnodes", "nproc"), SHAPES)
def test_env_placement_matches_torchrun(nnodes: int, nproc: int) -> None:
    seen = set()
    for node in range(nnodes):
        for local in range(nproc):
            topo = topology_from_env(torchrun_assigns(nnodes, nproc, node, local))
            assert topo == torchrun_topology(nnodes, nproc, node, local, "algo-1", 7777)
            assert (topo.local_rank, topo.group_rank, topo.num_nodes) == (local, node, nnodes)
            assert topo.launcher is Launcher.TORCHRUN
            seen.add(topo.rank)
    assert seen == set(range(nnodes * nproc))


@pytest.mark.parametrize(("nnodes", "nproc"), SHAPES)
def test_torchrun_env_round_trips(nnodes: int, nproc: int) -> None:
    for node in range(nnodes):
        for local in range(nproc):
            topo = torchrun_topology(nnodes, nproc, node, local, "10.0.0.1", 29400)
            assert topology_from_env(torchrun_env(topo)) == topo


def test_sagemaker_hosts_are_sorted_and_first_is_master() -> None:
    env = {"SM_HOSTS": json.dumps(["algo-3", "algo-1", "algo-2"]), "SM_CURRENT_HOST": "algo-2"}
    topo = topology_from_env(env)
    assert (topo.rank, topo.world_size, topo.group_rank, topo.num_nodes) == (1, 3, 1, 3)
    assert (topo.master_addr, topo.master_port) == ("algo-1", 7777)
    assert topo.launcher is Launcher.SAGEMAKER


def test_sagemaker_with_processes_per_host() -> None:
    env = {
        "SM_HOSTS": '["algo-1", "algo-2"]',
        "SM_CURRENT_HOST": "algo-2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_PORT": "29500",
    }
    topo = topology_from_env(env)
    assert (topo.rank, topo.world_size, topo.local_rank, topo.master_port) == (3, 4, 1, 29500)


def test_torchrun_variables_win_over_sagemaker() -> None:
    env = {**torchrun_assigns(2, 1, 1, 0), "SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1"}
    assert topology_from_env(env).launcher is Launcher.TORCHRUN


def test_no_launcher_is_a_single_process() -> None:
    assert topology_from_env({}) == Topology()


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
        ({"RANK": "0"}, "WORLD_SIZE"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "70000"),
        ({"SM_HOSTS": "algo-1", "SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS"),
        ({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-9"}, "algo-9"),
    ],
)
def test_bad_environment_is_named(env: dict[str, str], names: str) -> None:
    with pytest.raises(TopologyError, match=names.replace("[", r"\[")):
        topology_from_env(env)


REPORT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from trainport.distributed import init_process_group
    topo = init_process_group()  # joins torchrun's agent store through env://
    total = torch.tensor([topo.rank + 1.0])
    dist.all_reduce(total)
    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT"]
    report = {"env": {k: os.environ.get(k) for k in keys},
              "sum": total.item(),
              "topology": [topo.rank, topo.world_size, topo.local_rank,
                           topo.local_world_size, topo.group_rank, topo.num_nodes]}
    with open(os.path.join(sys.argv[1], f"node{topo.group_rank}-local{topo.local_rank}.json"),
              "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    """
)


def _torchrun(tmp_path: Path, args: list[str]) -> subprocess.Popen[bytes]:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", *args, str(script), str(tmp_path)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _check_reports(tmp_path: Path, nnodes: int, nproc: int) -> None:
    for node in range(nnodes):
        for local in range(nproc):
            report = json.loads((tmp_path / f"node{node}-local{local}.json").read_text())
            expected = torchrun_topology(nnodes, nproc, node, local)
            assert report["topology"] == [
                expected.rank,
                expected.world_size,
                expected.local_rank,
                expected.local_world_size,
                expected.group_rank,
                expected.num_nodes,
            ]
            assert report["env"]["RANK"] == str(expected.rank)
            world = nnodes * nproc
            assert report["sum"] == world * (world + 1) / 2  # the group really formed
            assert report["env"]["GROUP_RANK"] == str(node)


@pytest.mark.slow
def test_real_torchrun_standalone(tmp_path: Path) -> None:
    proc = _torchrun(tmp_path, ["--standalone", "--nproc_per_node", "3"])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    _check_reports(tmp_path, 1, 3)


@pytest.mark.slow
def test_real_torchrun_two_nodes(tmp_path: Path) -> None:
    """Two torchrun agents with static rendezvous, as the host agent starts them."""
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    procs = [
        _torchrun(tmp_path, [*common, "--master_port", port, "--node_rank", str(node)])
        for node in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    _check_reports(tmp_path, 2, 2)


def test_imports_nothing_of_the_platform() -> None:
    """Training scripts use this package inside real SageMaker, where trainport is absent."""
    code = (
        "import json, sys, trainport.distributed; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('trainport'))))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    assert all(m == "trainport" or m.startswith("trainport.distributed") for m in loaded), loaded


def test_leaders_reduce_only_by_ring_or_balanced() -> None:
    from trainport.distributed.errors import TopologyError
    from trainport.distributed.hierarchy import HierarchicalStream, HostGroups

    one_host = HostGroups(local=None, broadcasts=None, leaders=None, leader=0, per_host=1, hosts=1)
    with pytest.raises(TopologyError, match="leaders reduce by ring or balanced, not naive"):
        HierarchicalStream(one_host, across="naive")
