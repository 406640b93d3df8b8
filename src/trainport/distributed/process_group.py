"""Process-group setup from the launcher's environment: gloo on CPU, NCCL with CUDA.

Under torchrun the agent already serves the rendezvous store on ``MASTER_PORT``
(``TORCHELASTIC_USE_AGENT_STORE=True``), so workers must join it through ``env://``; binding
a second store there would fail. Everywhere else (SageMaker without torchrun, hand-started
workers, tests) rank 0 serves the store itself at ``tcp://MASTER_ADDR:MASTER_PORT``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from trainport.distributed.errors import TopologyError
from trainport.distributed.topology import Topology, topology_from_env

__all__ = ["choose_backend", "destroy_process_group", "init_process_group"]

logger = logging.getLogger(__name__)


def choose_backend() -> str:
    """``nccl`` when this process can see a CUDA device and NCCL is built in, else ``gloo``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _tcp_address(host: str, port: int) -> str:
    # A bare IPv6 literal needs brackets in a URL.
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def init_process_group(
    topology: Topology | None = None,
    *,
    backend: str | None = None,
    timeout: timedelta = timedelta(minutes=10),
    env: Mapping[str, str] | None = None,
) -> Topology:
    """Join the job's default process group and return this process's placement.

    ``topology`` defaults to :func:`topology_from_env`; ``backend`` to :func:`choose_backend`.
    With NCCL the process's CUDA device is set to its local rank first, so each process on a
    host drives its own GPU. Calling it again once the group exists returns the placement
    without re-initialising.
    """
    env = os.environ if env is None else env
    topology = topology_from_env(env) if topology is None else topology
    if dist.is_initialized():
        if dist.get_rank() != topology.rank or dist.get_world_size() != topology.world_size:
            raise TopologyError(
                f"a process group already exists as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, not rank {topology.rank} of {topology.world_size}"
            )
        return topology
    backend = choose_backend() if backend is None else backend
    if backend == "nccl":
        torch.cuda.set_device(topology.local_rank)
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    init_method = (
        "env://" if agent_store else _tcp_address(topology.master_addr, topology.master_port)
    )
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=timeout,
    )
    logger.info(
        "joined process group: rank %d of %d (local %d of %d, node %d of %d), %s via %s",
        topology.rank,
        topology.world_size,
        topology.local_rank,
        topology.local_world_size,
        topology.group_rank,
        topology.num_nodes,
        backend,
        init_method,
    )
    return topology


def destroy_process_group() -> None:
    """Leave the default process group if this process is in one."""
    if dist.is_initialized():
        dist.destroy_process_group()
