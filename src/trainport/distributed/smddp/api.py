"""SMDDP's PyTorch API on trainport's process-group setup and reductions.

Two styles of script, both as AWS's guide writes them:

- **The backend** (``import smdistributed.dataparallel.torch.torch_smddp``, then
  ``dist.init_process_group(backend="smddp")``): importing registers the ``smddp`` backend
  (gloo underneath, for CPU and CUDA tensors alike) and fills in torchrun's rank variables
  from the MPI launch where they are missing (:func:`export_launch_env`), so ``env://``
  finds them; a ``torch.nn.parallel.DistributedDataParallel`` on a group of that backend
  reduces its gradients with the balanced hook (:func:`_hook_ddp_on_smddp`).
- **The older API** (``smdistributed.dataparallel.torch.distributed`` as ``dist``):
  :func:`init_process_group`, rank and size queries, ``barrier``, ``all_reduce``,
  ``broadcast``, ``all_gather``, ``reduce``, ``all_to_all_single``, ``new_group``; and
  :class:`DistributedDataParallel`, which does the same.

Why gloo for CUDA tensors too: the hierarchical hook then copies each ready CUDA bucket
into pinned host memory and reduces it on the CPUs, as SMDDP does; the bytes per rank are
the CPU path's.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from trainport.distributed.hook import ShardedReducer, sharded_hook
from trainport.distributed.process_group import init_process_group as join_group
from trainport.distributed.reduction import Algorithm
from trainport.distributed.topology import Topology, topology_from_env, torchrun_env

__all__ = [
    "BACKEND",
    "DistributedDataParallel",
    "ReduceOp",
    "all_gather",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "export_launch_env",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "new_group",
    "reduce",
    "register_backend",
]

logger = logging.getLogger(__name__)

BACKEND = "smddp"
# The toolkit passes the library its server's address and port; they name the group's store.
ENV_ADDR = "SMDATAPARALLEL_SERVER_ADDR"
ENV_PORT = "SMDATAPARALLEL_SERVER_PORT"
DEFAULT_PORT = 7592

ReduceOp = dist.ReduceOp
Group = dist.ProcessGroup | None


def launch_topology(env: Mapping[str, str]) -> Topology:
    """This rank's placement under the SMDDP launch: OpenMPI's variables (or torchrun's),
    the store at the toolkit's server address and port."""
    topology = topology_from_env(env)
    addr = env.get(ENV_ADDR) or topology.master_addr
    port = int(env.get(ENV_PORT) or DEFAULT_PORT)
    if "MASTER_PORT" in env and "RANK" in env:  # torchrun's own store wins under torchrun
        return topology
    return dataclasses.replace(topology, master_addr=addr, master_port=port)


def export_launch_env(env: MutableMapping[str, str] | None = None) -> Topology:
    """Set torchrun's rank variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR`` ...) from the launch where they are not set, so that
    ``dist.init_process_group(backend="smddp")`` with ``env://`` finds them."""
    env = os.environ if env is None else env
    topology = launch_topology(env)
    for key, value in torchrun_env(topology).items():
        env.setdefault(key, value)
    return topology


def _create_backend(
    store: dist.Store, rank: int, size: int, timeout: timedelta
) -> dist.ProcessGroup:
    return dist.ProcessGroupGloo(store, rank, size, timeout)  # type: ignore[return-value]


def register_backend() -> None:
    """Register ``smddp`` with torch.distributed (once) and hook DDP on its groups."""
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create_backend, devices=["cpu", "cuda"])
    _hook_ddp_on_smddp()


def _hook_ddp_on_smddp() -> None:
    """Make ``torch.nn.parallel.DistributedDataParallel`` on an ``smddp`` group reduce as
    SMDDP would: its fusion buffer sized to the model (:func:`fusion_bucket_mb`) where the
    script does not set ``bucket_cap_mb``, and the reduction :func:`reduction_for` picks."""
    if getattr(TorchDDP.__init__, "_trainport_smddp", False):
        return
    original: Callable[..., None] = TorchDDP.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self: TorchDDP, *args: Any, **kwargs: Any) -> None:
        call = signature.bind_partial(self, *args, **kwargs)
        given = call.arguments
        if _is_smddp(given.get("process_group")) and not any(
            given.get(name) is not None for name in ("bucket_cap_mb", "bucket_cap_mb_list")
        ):
            given["bucket_cap_mb"] = fusion_bucket_mb(_gradient_bytes(given["module"]))
        original(*call.args, **call.kwargs)
        if type(self) is TorchDDP and _is_smddp(self.process_group):
            _attach(self)

    init._trainport_smddp = True  # type: ignore[attr-defined]
    TorchDDP.__init__ = init  # type: ignore[method-assign]


def _is_smddp(group: Group) -> bool:
    try:
        return str(dist.get_backend(group)) == BACKEND
    except (RuntimeError, ValueError):
        return False


# The fusion buffer (DDP's bucket) is the unit the reduction starts on: a bucket is sent
# once all of its gradients exist, and the last one only after the backward pass ends, so
# its reduction is never hidden. About an eighth of the gradients keeps that tail short
# and leaves the rest overlapping the backward pass. The floor is DDP's own first bucket,
# 1 MiB: below it a bucket's fixed cost (a collective's round trips, the hook's hand-off)
# outweighed what it hid on hosts of several ranks (in benchmarks/smddp_e2e.py --per-host 2,
# 0.5 MiB buckets gave 0.93 and 1.02 of DDP where 1 MiB gave 0.95-0.98 and 1.09). DDP's
# 25 MiB is the ceiling, where models are large enough to fill many buckets anyway.
FUSION_PARTS = 8
FUSION_MIN_BYTES = 2**20
FUSION_MAX_BYTES = 25 * 2**20


def fusion_bucket_mb(gradient_bytes: int) -> float:
    """The bucket size, in MiB, that ``smddp`` gives a model of ``gradient_bytes``."""
    size = min(max(gradient_bytes / FUSION_PARTS, FUSION_MIN_BYTES), FUSION_MAX_BYTES)
    return size / 2**20


def _gradient_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def reduction_for(topology: Topology, on_world: bool = True) -> Algorithm | None:
    """How ``smddp`` reduces a DDP model's buckets on ``topology``; None: the group's own
    ring all-reduce, with no hook.

    Several ranks on each of several hosts: the hierarchical reduction (sum within each
    host, reduce among one rank per host, then back within the host), so a
    host's link carries 2(H-1)/H of the gradients for H hosts where a ring over every rank
    would carry 2(N-1)/N for N ranks. With one rank per host (or a single host) there is
    nothing to sum first: the ring and the balanced reduction then move the same bytes,
    2(N-1)/N each way, which no exact reduction undercuts, and the ring runs inside the
    backend with no hand-off to a Python thread, so it is the one used.
    """
    hosts_of_many = topology.local_world_size > 1 and topology.num_nodes > 1
    return Algorithm.HIERARCHICAL if hosts_of_many and on_world else None


def _attach(model: TorchDDP) -> ShardedReducer | None:
    """Register the reduction :func:`reduction_for` picks for ``model``'s group, if any."""
    topology = launch_topology(os.environ)
    algorithm = reduction_for(topology, model.process_group in (None, dist.group.WORLD))
    if algorithm is None:
        return None
    reducer = ShardedReducer(
        model.process_group, algorithm=algorithm, per_host=topology.local_world_size
    )
    model.register_comm_hook(reducer, sharded_hook)
    setattr(model, "_trainport_reducer", reducer)  # noqa: B010 (nn.Module types its attributes)
    return reducer


# -- the older API ---------------------------------------------------------------------------


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    return dist.is_initialized()


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """Join the job's group on the ``smddp`` backend (arguments are accepted and ignored,
    as the library ignores them: the launch decides ranks and the store)."""
    register_backend()
    if dist.is_initialized():
        return
    topology = launch_topology(os.environ)
    join_group(topology, backend=BACKEND, env={})
    _local.update(rank=topology.local_rank, size=topology.local_world_size)


_local: dict[str, int] = {}


def _required() -> None:
    if not dist.is_initialized():
        from trainport.distributed.errors import DistributedError

        raise DistributedError(
            "smdistributed.dataparallel.torch.distributed: call init_process_group() first"
        )


def get_rank(group: Group = None) -> int:
    _required()
    return dist.get_rank(group)


def get_world_size(group: Group = None) -> int:
    _required()
    return dist.get_world_size(group)


def get_local_rank() -> int:
    _required()
    return _local.get("rank", launch_topology(os.environ).local_rank)


def get_local_size() -> int:
    _required()
    return _local.get("size", launch_topology(os.environ).local_world_size)


def barrier(group: Group = None) -> None:
    _required()
    dist.barrier(group)


def all_reduce(
    tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Group = None, async_op: bool = False
) -> Any:
    _required()
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def broadcast(
    tensor: torch.Tensor, src: int = 0, group: Group = None, async_op: bool = False
) -> Any:
    _required()
    return dist.broadcast(tensor, src=src, group=group, async_op=async_op)


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Group = None,
    async_op: bool = False,
) -> Any:
    _required()
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: Any = ReduceOp.SUM,
    group: Group = None,
    async_op: bool = False,
) -> Any:
    _required()
    return dist.reduce(tensor, dst=dst, op=op, group=group, async_op=async_op)


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    group: Group = None,
    async_op: bool = False,
) -> Any:
    _required()
    return dist.all_to_all_single(
        output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
    )


def new_group(ranks: list[int] | None = None, **kwargs: Any) -> dist.ProcessGroup:
    _required()
    group: dist.ProcessGroup = dist.new_group(ranks, backend=BACKEND)
    return group


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class DistributedDataParallel(TorchDDP):
    """SMDDP's ``DistributedDataParallel``: torch's, with the fusion buffer and reduction
    ``smddp`` gives torch's own (see :func:`reduction_for`). The library's
    ``broadcast_buffers`` and ``bucket_cap_mb`` keep torch's meaning; ``device_ids``
    defaults to this rank's GPU when the module is on CUDA."""

    def __init__(
        self,
        module: torch.nn.Module,
        device_ids: list[int] | None = None,
        output_device: int | None = None,
        broadcast_buffers: bool = True,
        process_group: Group = None,
        bucket_cap_mb: float | None = None,
        **kwargs: Any,
    ) -> None:
        if not dist.is_initialized():
            init_process_group()
        on_cuda = any(p.is_cuda for p in module.parameters())
        if device_ids is None and on_cuda:
            device_ids = [torch.cuda.current_device()]
        if bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = bucket_cap_mb
        super().__init__(
            module,
            device_ids=device_ids,
            output_device=output_device,
            broadcast_buffers=broadcast_buffers,
            process_group=process_group,
            **kwargs,
        )
        self.reducer_state = _attach(self)
