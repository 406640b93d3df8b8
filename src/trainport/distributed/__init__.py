"""trainport.distributed: data-parallel training that works the same under trainport,
plain torchrun and real SageMaker (it imports nothing else of trainport).

- Placement: :func:`topology_from_env` reads torchrun's variables (``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``),
  else SageMaker's ``SM_HOSTS`` / ``SM_CURRENT_HOST``; :func:`torchrun_topology` is what
  torchrun assigns.
- :func:`init_process_group`: join the job's group (gloo on CPU, NCCL with CUDA).
- :func:`register_sharded_hook` / :class:`ShardedReducer`: a DDP communication hook that
  reduces gradient buckets on one communication thread with SageMaker's balanced sharded
  reduction (or a ring all-reduce, or a naive parameter server, for comparison), counting
  bytes sent and received and recording a Chrome-trace timeline per rank; ``hierarchical``
  reduces within each host first where hosts run several ranks (:mod:`.hierarchy`).
- :mod:`.smddp`: SageMaker's data-parallel library's PyTorch API on these, for jobs that
  ask for it.
- :mod:`.reduction`: the three reductions on a flat tensor, usable without DDP.
"""

from __future__ import annotations

from trainport.distributed.errors import DistributedError, ReductionError, TopologyError
from trainport.distributed.hierarchy import HostGroups, hierarchical_average
from trainport.distributed.hook import ShardedReducer, register_sharded_hook, sharded_hook
from trainport.distributed.process_group import (
    choose_backend,
    destroy_process_group,
    device_backend,
    init_process_group,
)
from trainport.distributed.reduction import (
    ALGORITHMS,
    Algorithm,
    Scratch,
    balanced_average,
    naive_average,
    ring_average,
)
from trainport.distributed.topology import (
    DEFAULT_MASTER_PORT,
    Launcher,
    Topology,
    topology_from_env,
    torchrun_env,
    torchrun_topology,
)
from trainport.distributed.trace import ByteCount, ByteCounter, Timeline, merge_traces

__all__ = [
    "ALGORITHMS",
    "DEFAULT_MASTER_PORT",
    "Algorithm",
    "ByteCount",
    "ByteCounter",
    "DistributedError",
    "HostGroups",
    "Launcher",
    "ReductionError",
    "Scratch",
    "ShardedReducer",
    "Timeline",
    "Topology",
    "TopologyError",
    "balanced_average",
    "choose_backend",
    "destroy_process_group",
    "device_backend",
    "hierarchical_average",
    "init_process_group",
    "merge_traces",
    "naive_average",
    "register_sharded_hook",
    "ring_average",
    "sharded_hook",
    "topology_from_env",
    "torchrun_env",
    "torchrun_topology",
]
