"""Where this process sits in a data-parallel job, read from its launcher's environment.

Three launchers are understood, tried in this order:

1. torchrun (and trainport's host agent, which runs torchrun on every host): ``RANK``,
   ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
   ``MASTER_PORT``.
2. SageMaker without torchrun (one process per host): ``SM_HOSTS`` (a JSON list) and
   ``SM_CURRENT_HOST``; the node rank is the host's index in the *sorted* host list, as the
   SageMaker toolkits assign it, and the first sorted host is the master.
3. Nothing: a single process, rank 0 of 1.

:func:`torchrun_topology` is the pure inverse: what torchrun assigns to local worker
``local_rank`` on node ``node_rank`` of an ``nnodes`` x ``nproc_per_node`` job with static
rendezvous. :func:`torchrun_env` renders a placement as torchrun's variables, so tests and
benchmarks can start workers exactly as torchrun would without paying for its agent.

The environment is read at call time, never at import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from trainport.distributed.errors import TopologyError

__all__ = [
    "DEFAULT_MASTER_PORT",
    "Launcher",
    "Topology",
    "topology_from_env",
    "torchrun_env",
    "torchrun_topology",
]

# The port SageMaker's toolkit and trainport's host agent give torchrun (--master_port 7777).
DEFAULT_MASTER_PORT = 7777


class Launcher(StrEnum):
    """Which environment a :class:`Topology` was read from."""

    TORCHRUN = "torchrun"
    MPI = "mpi"
    SAGEMAKER = "sagemaker"
    SINGLE = "single"


@dataclass(frozen=True)
class Topology:
    """One worker's placement: global rank, rank on its host, and its host's rank.

    ``group_rank`` is torchrun's name for the node rank; ``num_nodes`` is the number of
    hosts (torchrun's ``GROUP_WORLD_SIZE``).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    launcher: Launcher = Launcher.SINGLE

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise TopologyError(f"world size {self.world_size} must be at least 1")
        if not 0 <= self.rank < self.world_size:
            raise TopologyError(f"rank {self.rank} is outside world size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise TopologyError(
                f"local rank {self.local_rank} is outside local world size {self.local_world_size}"
            )
        if not 0 <= self.group_rank < self.num_nodes:
            raise TopologyError(f"node rank {self.group_rank} is outside {self.num_nodes} nodes")
        if not 0 < self.master_port < 65536:
            raise TopologyError(f"master port {self.master_port} is not a TCP port")

    @property
    def is_primary(self) -> bool:
        """True on the one rank that should write checkpoints, logs and the model."""
        return self.rank == 0


def torchrun_topology(
    nnodes: int,
    nproc_per_node: int,
    node_rank: int,
    local_rank: int,
    master_addr: str = "127.0.0.1",
    master_port: int = DEFAULT_MASTER_PORT,
) -> Topology:
    """The placement torchrun gives a worker of a homogeneous static-rendezvous job.

    torchrun numbers workers node by node: every node has ``nproc_per_node`` workers and
    ranks below node k's are those of nodes 0..k-1.
    """
    if nnodes < 1 or nproc_per_node < 1:
        raise TopologyError(f"nnodes={nnodes} and nproc_per_node={nproc_per_node} must be >= 1")
    return Topology(
        rank=node_rank * nproc_per_node + local_rank,
        world_size=nnodes * nproc_per_node,
        local_rank=local_rank,
        local_world_size=nproc_per_node,
        group_rank=node_rank,
        num_nodes=nnodes,
        master_addr=master_addr,
        master_port=master_port,
        launcher=Launcher.TORCHRUN,
    )


def torchrun_env(topology: Topology) -> dict[str, str]:
    """The variables torchrun sets for ``topology``'s worker (the agent-store ones aside)."""
    return {
        "RANK": str(topology.rank),
        "WORLD_SIZE": str(topology.world_size),
        "LOCAL_RANK": str(topology.local_rank),
        "LOCAL_WORLD_SIZE": str(topology.local_world_size),
        "GROUP_RANK": str(topology.group_rank),
        "GROUP_WORLD_SIZE": str(topology.num_nodes),
        "ROLE_RANK": str(topology.rank),
        "ROLE_WORLD_SIZE": str(topology.world_size),
        "MASTER_ADDR": topology.master_addr,
        "MASTER_PORT": str(topology.master_port),
    }


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "")
    if raw == "":
        if default is None:
            raise TopologyError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise TopologyError(f"environment variable {name}={raw!r} is not an integer") from None


def _from_torchrun(env: Mapping[str, str]) -> Topology:
    world = _int(env, "WORLD_SIZE")
    rank = _int(env, "RANK")
    # Without the host-local variables (a hand-rolled launcher), every rank shares one host.
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    local_rank = _int(env, "LOCAL_RANK", rank % local_world)
    group_rank = _int(env, "GROUP_RANK", rank // local_world)
    num_nodes = _int(env, "GROUP_WORLD_SIZE", max(1, -(-world // local_world)))
    return Topology(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        group_rank=group_rank,
        num_nodes=num_nodes,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
        launcher=Launcher.TORCHRUN,
    )


def _from_sagemaker(env: Mapping[str, str]) -> Topology:
    raw_hosts = env["SM_HOSTS"]
    current = env.get("SM_CURRENT_HOST", "")
    try:
        hosts = json.loads(raw_hosts)
    except json.JSONDecodeError:
        raise TopologyError(f"SM_HOSTS={raw_hosts!r} is not a JSON list of host names") from None
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise TopologyError(f"SM_HOSTS={raw_hosts!r} is not a non-empty JSON list of host names")
    hosts = sorted(hosts)
    if current not in hosts:
        raise TopologyError(f"SM_CURRENT_HOST={current!r} is not one of SM_HOSTS {hosts}")
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1)
    local_rank = _int(env, "LOCAL_RANK", 0)
    node = hosts.index(current)
    return Topology(
        rank=node * local_world + local_rank,
        world_size=len(hosts) * local_world,
        local_rank=local_rank,
        local_world_size=local_world,
        group_rank=node,
        num_nodes=len(hosts),
        master_addr=env.get("MASTER_ADDR") or hosts[0],
        master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
        launcher=Launcher.SAGEMAKER,
    )


def _from_mpi(env: Mapping[str, str]) -> Topology:
    """Under mpirun (OpenMPI): ranks are placed host by host (``-map-by slot``)."""
    world = _int(env, "OMPI_COMM_WORLD_SIZE")
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world)
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", rank % local_world)
    hosts = sorted(json.loads(env["SM_HOSTS"])) if env.get("SM_HOSTS") else []
    return Topology(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        group_rank=rank // local_world,
        num_nodes=max(1, -(-world // local_world)),
        master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", DEFAULT_MASTER_PORT),
        launcher=Launcher.MPI,
    )


def topology_from_env(env: Mapping[str, str] | None = None) -> Topology:
    """This process's placement, from torchrun's variables, else OpenMPI's, else SageMaker's,
    else alone."""
    env = os.environ if env is None else env
    if "RANK" in env or "WORLD_SIZE" in env:
        return _from_torchrun(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _from_mpi(env)
    if env.get("SM_HOSTS"):
        return _from_sagemaker(env)
    return Topology()
