"""Process-group setup from the launcher's environment: gloo on CPU, NCCL with CUDA.

Where CUDA is visible the default group is made with a device-to-backend map,
``cpu:gloo,cuda:nccl`` (as torch's own default does), so one group serves CPU tensors on gloo
and CUDA tensors on NCCL; a group of NCCL alone fails on the first CPU collective.

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

__all__ = ["choose_backend", "destroy_process_group", "device_backend", "init_process_group"]

logger = logging.getLogger(__name__)


_CARRIED_BY = {"smddp": "gloo"}


def choose_backend() -> str:
    """``cpu:gloo,cuda:nccl`` when this process sees a CUDA device and has NCCL, else ``gloo``."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def device_backend(backend: str, device_type: str) -> str:
    """The backend that carries ``device_type`` tensors in a group made with ``backend``.

    ``backend`` is a single name (``gloo``, ``nccl``) or a device map such as
    ``cpu:gloo,cuda:nccl``; a device the map does not name gets the first backend named.
    """
    if ":" not in backend:
        # smddp is trainport's face of SageMaker's data-parallel backend: gloo underneath.
        return _CARRIED_BY.get(backend, backend)
    pairs = [part.split(":", 1) for part in backend.split(",") if ":" in part]
    for device, name in pairs:
        if device.strip() == device_type:
            return name.strip()
    return pairs[0][1].strip() if pairs else backend


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
    if device_backend(backend, "cuda") == "nccl":
        _set_device(topology.local_rank)
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


def _set_device(local_rank: int) -> None:
    """Drive the GPU of this local rank; more local ranks than GPUs share them in turn."""
    count = torch.cuda.device_count()
    if count == 0:
        return
    if local_rank >= count:
        logger.warning(
            "local rank %d but only %d visible GPUs: sharing GPU %d (NCCL refuses two ranks "
            "of one group on one GPU; use the gloo backend for that)",
            local_rank,
            count,
            local_rank % count,
        )
    torch.cuda.set_device(local_rank % count)


def destroy_process_group() -> None:
    """Leave the default process group if this process is in one."""
    if dist.is_initialized():
        dist.destroy_process_group()
