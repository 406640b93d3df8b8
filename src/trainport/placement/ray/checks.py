"""What the ray runner refuses at submission, and what it asks of a cluster first.

Pure decisions (:func:`version_problem`, :func:`isolation_problem`) are functions of what
the nodes report; the checks that need the cluster (:func:`check_cluster`) connect this
process to it as a driver, through :func:`connect`.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from trainport.config import Settings
from trainport.errors import ValidationError
from trainport.placement import capacity

if TYPE_CHECKING:
    from trainport.placement.ray.actor import NodeInfo

__all__ = [
    "check_cluster",
    "check_ray_job",
    "connect",
    "first_line",
    "host_shapes",
    "isolation_problem",
    "live_nodes",
    "version_problem",
]

log = logging.getLogger(__name__)


def check_ray_job(spec: Any) -> None:
    """Refuse, at submission, what the ray runner cannot run yet (a clear error, not a
    job that fails later on a node)."""
    if spec.tags.get("trainport:network") == "namespaces":
        raise ValidationError(
            "Tags: trainport:network=namespaces emulates hosts on this machine; on the ray "
            "runner each host already has its own node and network"
        )
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ValidationError(
            f"the ray runner needs Ray in this environment ({exc}); pip install 'ray[default]'"
        ) from exc


def check_cluster(spec: Any, settings: Settings) -> None:
    """Refuse, at submission, a job that no cluster of this one's shape could ever hold (a
    host bigger than every node): waiting for capacity would wait forever. Connects this
    process to the cluster (as a driver) if it is not yet; a cluster that cannot be reached
    is said as such."""
    import ray

    shapes = host_shapes(spec, spec.hosts, settings)
    if not ray.is_initialized():
        try:
            if settings.ray_address is None:
                # ray.init's default: a cluster running on this machine, else a new one of
                # its own that the supervisor starts; only the first has a shape to check.
                connect(settings, address="auto")
            else:
                connect(settings)
        except ConnectionError as exc:
            if settings.ray_address is None:
                return
            raise _unreachable(settings, exc) from exc
        except Exception as exc:  # a bad address, say
            raise _unreachable(settings, exc) from exc
    problem = capacity.never_fits(shapes, live_nodes())
    if problem:
        raise ValidationError(f"ResourceConfig: {problem}")


def _unreachable(settings: Settings, exc: Exception) -> ValidationError:
    return ValidationError(
        f"the ray runner cannot reach the Ray cluster at RAY_ADDRESS={settings.ray_address}: "
        f"{first_line(exc)}. Set RAY_ADDRESS to the head's address (host:6379), or start "
        "the cluster (ray start --head)"
    )


def connect(settings: Settings, address: str | None = None) -> None:
    """This process as a driver of the cluster ``RAY_ADDRESS`` names (ray.init's rules)."""
    import ray

    address = address or settings.ray_address
    if address:
        _probe_gcs(address)
    # A ray:// head starts a server process of its own for each client, and that start can
    # fail on a loaded head and work a moment later: a few tries before the job fails.
    tries = _CLIENT_TRIES if address and address.startswith("ray://") else 1
    for attempt in range(1, tries + 1):
        try:
            ray.init(
                address=address,
                logging_level=logging.WARNING,
                log_to_driver=False,
                namespace="trainport",
            )
            return
        except ConnectionAbortedError as exc:
            if attempt == tries:
                raise
            log.warning(
                "Ray client server at %s refused connection %d of %d, trying again: %s",
                address, attempt, tries, " ".join(str(exc).split())[-300:],
            )  # fmt: skip
            time.sleep(2.0 * attempt)


_CLIENT_TRIES = 3


def _probe_gcs(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a head that does not answer: ray.init waits minutes for one."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", or a ray:// client address: Ray's own rules apply
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"nothing answers at {address} ({exc.strerror or exc}): no Ray head runs there"
        ) from exc


def live_nodes() -> list[dict[str, float]]:
    """The total resources of each live node of the connected cluster."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def host_shapes(
    spec: Any, hosts: tuple[str, ...], settings: Settings
) -> list[tuple[str, str, capacity.HostShape]]:
    """(host, instance type, what it takes) for every host of ``spec``."""
    overrides = capacity.parse_instance_types(settings.ray_instance_types or "{}")
    return [
        (h, t, capacity.shape_of(t, overrides))
        for h, t in ((h, spec.group_of(h).instance_type) for h in hosts)
    ]


def version_problem(mine: str, nodes: dict[str, NodeInfo]) -> str | None:
    """What is wrong with the trainport versions the hosts' nodes run, if anything: a
    host's agent must speak the same events and plans as this supervisor."""
    other = {h: n for h, n in nodes.items() if n.trainport_version != mine}
    if not other:
        return None
    said = "; ".join(
        f"host {h} on node {n.address} (id {n.node_id[:12]}) has trainport {n.trainport_version}"
        for h, n in sorted(other.items())
    )
    return f"{said}; this supervisor runs trainport {mine}: install {mine} on every node"


def isolation_problem(nodes: dict[str, NodeInfo], required: bool) -> str | None:
    """Why the job may not run on these nodes when it must run contained, if it may not:
    a node that cannot make a sandbox would run its host under the process runner."""
    if not required:
        return None
    bare = {h: n for h, n in nodes.items() if n.sandbox_problem}
    if not bare:
        return None
    said = "; ".join(
        f"host {h} on node {n.address} (id {n.node_id[:12]}) cannot make a sandbox "
        f"({n.sandbox_problem})"
        for h, n in sorted(bare.items())
    )
    return (
        f"{said}; this job must run isolated (TRAINPORT_REQUIRE_ISOLATION, set by a server "
        "that refuses the process runner): make the sandbox work on that node (root, or "
        "bubblewrap) or, for trusted code only, allow unisolated jobs with "
        "TRAINPORT_SERVER_ALLOW_PROCESS_RUNNER=1"
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
