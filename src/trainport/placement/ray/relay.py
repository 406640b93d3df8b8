"""algo-1's MPI launches carried to the other hosts' actors: mpirun on algo-1 starts a
daemon on each host through its launch board, and the relay hands each launch to the
actor of that host's node (see :meth:`~trainport.placement.ray.actor.HostActor.launch`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from trainport.host import mpi

__all__ = ["PeerRelay"]

log = logging.getLogger(__name__)


class PeerRelay:
    """algo-1's MPI launches, carried to the other hosts' actors (see
    :meth:`HostActor.launch`); a cancelled launch ends the daemon on its node."""

    def __init__(self, hosts: tuple[str, ...], peers: dict[str, Any]) -> None:
        self._hosts = hosts
        self._peers = peers

    def launch(self, request: mpi.LaunchRequest) -> None:
        threading.Thread(
            target=self._follow, args=(request,), name=f"mpi-relay-{request.host}", daemon=True
        ).start()

    def _follow(self, request: mpi.LaunchRequest) -> None:
        import ray

        peer = self._peers[request.host]
        done = peer.launch.remote(self._hosts, request.host, request.command)
        cancelled = False
        while True:
            ready, _ = ray.wait([done], timeout=0.5)
            if ready:
                try:
                    code = ray.get(done)
                except Exception as exc:  # its node died: mpirun sees the daemon fail
                    log.warning("mpi: the daemon on %s was lost: %s", request.host, exc)
                    code = 1
                request.finish(code)
                return
            if request.cancelled.is_set() and not cancelled:
                peer.cancel_launch.remote()
                cancelled = True

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close_launches.remote(self._hosts)
