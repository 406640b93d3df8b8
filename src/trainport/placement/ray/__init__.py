"""Hosts on a Ray cluster: each host agent a Ray actor on a node of its own.

The supervisor (a Ray driver, connected to the cluster ``RAY_ADDRESS`` names) reserves one
bundle per host in a placement group with the STRICT_SPREAD strategy, so no two hosts share
a node, as no two SageMaker instances share a machine. It then starts one
:class:`HostActor` in each bundle and asks each what its node is and can make. Where every
node can, the job's hosts get a network of their own across their nodes
(:mod:`trainport.runners.overlay`): ``algo-k`` is the host's address there in every host's
``/etc/hosts``, so torchrun's ``--master_addr algo-1`` and a BYO job's own sockets reach
across nodes while other jobs on the same nodes, and the nodes themselves, stay out of
reach. Otherwise ``algo-k`` maps to the address of the node holding bundle k-1.

On its node an actor runs the same :class:`~trainport.host.agent.HostAgent` the local
placement runs, under a home of its own (the node's disk, never the submitter's job folder)
with the submitter's store configuration; its training process is contained as ``auto``
would contain it on that node (the sandbox where the node can make one). The agent's events
wait in the actor until the driver drains them with a long-polling call; the driver writes
each host's log lines into the job's folder on its own machine and hands the events on.

The pieces: :mod:`.checks` (what is refused at submission, the cluster's shape),
:mod:`.actor` (the host agent on its node), :mod:`.relay` (MPI launches from algo-1 to the
other nodes), :mod:`.artifacts` (a host's folders back through the store) and
:mod:`.driver` (:class:`RayHosts`, the supervisor's side).

Failures come from Ray's own detection: a node whose raylet dies takes its actor with it,
and the pending drain call raises :class:`ray.exceptions.ActorDiedError` once Ray has
marked the node dead; the host then ends with a reason naming the host and the node.
"""

from __future__ import annotations

from trainport.placement.ray.actor import HostActor, NodeInfo
from trainport.placement.ray.checks import (
    check_cluster,
    check_ray_job,
    connect,
    isolation_problem,
    version_problem,
)
from trainport.placement.ray.driver import RayHosts

__all__ = [
    "HostActor",
    "NodeInfo",
    "RayHosts",
    "check_cluster",
    "check_ray_job",
    "connect",
    "isolation_problem",
    "version_problem",
]
