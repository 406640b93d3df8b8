"""Hosts on this machine: each host agent in a thread of the supervisor's process.

The agents write their logs straight into the job's folder, which is the supervisor's, so
the group only has to carry their events across threads.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from trainport.config import Settings
from trainport.host.agent import HostAgent, HostPlan
from trainport.host.events import HostEnded, HostEvent, TrainingStarted
from trainport.host.phases import Finished
from trainport.placement.api import HostGroup, take_events
from trainport.runners.api import Runner
from trainport.store.api import ObjectStore

__all__ = ["LocalHosts"]

log = logging.getLogger(__name__)


class LocalHosts(HostGroup):
    def __init__(
        self,
        plans: list[HostPlan],
        *,
        store: ObjectStore,
        runner: Runner,
        settings: Settings,
        on_started: Callable[[int], None] = lambda pgid: None,
    ) -> None:
        self.hosts = tuple(p.host for p in plans)
        self._queue: queue.SimpleQueue[HostEvent] = queue.SimpleQueue()
        self._on_started = on_started
        self._agents = {
            p.host: HostAgent(p, store=store, runner=runner, settings=settings, report=self._report)
            for p in plans
        }
        self._threads: list[threading.Thread] = []

    def _report(self, event: HostEvent) -> None:
        if isinstance(event, TrainingStarted):
            # Recorded before the training process can say anything: if the supervisor
            # dies from here on, the next reconcile finds the group to stop on this machine.
            self._on_started(event.pgid)
        self._queue.put(event)

    def start(self) -> None:
        for host in self.hosts:
            thread = threading.Thread(target=self._run, args=(host,), name=f"agent-{host}")
            thread.start()
            self._threads.append(thread)

    def _run(self, host: str) -> None:
        agent = self._agents[host]
        try:
            finished = agent.run()
        except BaseException as exc:  # never leave the job without an outcome
            log.exception("host agent %s failed", host)
            finished = Finished(None, f"InternalError: host agent failed: {exc}")
        self._queue.put(HostEnded(host, finished, agent.model_uri))

    def events(self, timeout: float) -> list[HostEvent]:
        return take_events(self._queue, timeout)

    def terminate(self, host: str, grace: float) -> None:
        self._agents[host].terminate(grace)

    def artifact_folders(self) -> list[tuple[str, Path, Path]]:
        return [
            (host, agent.plan.layout.model_dir, agent.plan.layout.output_data_dir)
            for host, agent in self._agents.items()
        ]

    def close(self) -> None:
        for thread in self._threads:
            thread.join()
