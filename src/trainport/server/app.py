"""The HTTP server: the SageMaker and CloudWatch Logs JSON APIs on ``POST /``, the
dashboard on ``GET``.

uvicorn serves HTTP/1.1 with keep-alive (boto3 reuses its connections) on one event loop,
with httptools' strict parser and the connection limits of :mod:`.limits`; the ASGI
application in :mod:`.asgi` hands each request to the operations on a pool of threads.
The server owns a :class:`~trainport.jobs.scheduler.Scheduler`, which reconciles on its own
clock, so reads go straight to the job records. Nothing lives only in this process: jobs
run under their own supervisor processes, and the queue is in the job database, so a
server killed with SIGKILL and started again shows every job's true state and starts the
queue where it was.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from trainport.config import Settings, load_settings
from trainport.errors import ResourceInUseError, ValidationError
from trainport.jobs.scheduler import Scheduler
from trainport.jobs.service import JobService
from trainport.server.asgi import VENDOR_MISSING, TrainportApp, vendor_present
from trainport.server.connections import ThreadConnectionDB
from trainport.server.dashboard_api import DashboardApi
from trainport.server.dashboard_auth import DashboardAuth
from trainport.server.limits import ConnectionLimits, limited_protocol
from trainport.server.logs_api import LogsApi
from trainport.server.protocol import DEFAULT_MAX_BODY, JsonProtocol
from trainport.server.sagemaker_api import SageMakerApi
from trainport.server.sigv4 import AccessKey, SigV4Verifier, load_or_create_keys
from trainport.server.tuning_api import TuningApi
from trainport.server.unserved import SERVED, UnservedServices

__all__ = ["ServerConfig", "TrainportServer", "build_server"]

log = logging.getLogger(__name__)

# Operations answered on the event loop itself (see asgi.py): a read of one record takes
# less than the two thread switches of a trip through the pool. The rest go to the pool:
# they may wait (on the store, a write lock, a job's processes), or spend much of their
# time in SQLite or file reads, which release the GIL, so on a pool thread that time runs
# beside the loop and other requests on another core.
_ON_LOOP = frozenset(
    {"Trainport.Ping", "SageMaker.DescribeTrainingJob", "SageMaker.ListTrainingJobs"}
)

# Connections the kernel queues before the server accepts them: a burst of hundreds of
# clients connecting at once must not be refused (the kernel caps it at somaxconn).
_BACKLOG = 2048


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    auth: bool = True
    max_concurrent_jobs: int | None = None  # None: from settings
    max_body: int = DEFAULT_MAX_BODY
    scheduler_interval: float = 0.5
    # Seconds a connection may wait idle for its next request, and a request may take to
    # arrive once it has begun: past them the connection is closed.
    idle_timeout: float = 30.0
    request_timeout: float = 15.0
    # Threads that run operations; requests beyond them wait their turn.
    workers: int = 32


def _ping(params: dict[str, Any]) -> dict[str, Any]:
    """A trivial operation: the ceiling the benchmark compares the real ones against."""
    return {}


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP said outright: asyncio turns Nagle's algorithm off only on sockets that
    # say so, and the accepted ones inherit this one's. With it on, a response's second
    # write waits for the client's delayed ACK (40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ResourceInUseError(
                f"port {port} on {host} is in use (another trainport server, or another "
                "program); choose another with --port (0: any free port)"
            ) from exc
        raise ValidationError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host and --port"
        ) from exc
    return sock


class TrainportServer:
    """The server bound to its address (from construction on, so its URL is known) and
    served by :meth:`serve_forever` or :meth:`start_background`."""

    def __init__(
        self,
        config: ServerConfig,
        service: JobService,
        scheduler: Scheduler,
        protocol: JsonProtocol,
        dashboard: DashboardApi,
        sock: socket.socket | None = None,
    ) -> None:
        self._socket = sock or _listen(config.host, config.port)
        self.config = config
        self.service = service
        self.scheduler = scheduler
        self.protocol = protocol
        self.dashboard = dashboard
        self.created_key: AccessKey | None = None
        self.app = TrainportApp(
            protocol,
            dashboard,
            UnservedServices(protocol.verifier),
            workers=config.workers,
            worker_setup=self._hold_db,
            quick=_ON_LOOP,
        )
        limits = ConnectionLimits(config.idle_timeout, config.request_timeout)
        self._uvicorn = uvicorn.Server(
            uvicorn.Config(
                self.app,
                http=limited_protocol(limits),
                lifespan="off",
                log_config=None,  # trainport's logging stays as the caller set it
                access_log=False,
                server_header=False,
                backlog=_BACKLOG,
                timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
                timeout_graceful_shutdown=5,
                # Clients are who they connect as: nothing here reads X-Forwarded-For.
                proxy_headers=False,
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    def dashboard_url(self) -> str:
        token = self.dashboard.token
        return f"{self.url}/" + (f"?token={token}" if token else "")

    def _hold_db(self) -> None:
        """Keep this thread's database connection open (a pool thread, or the event loop's)."""
        if isinstance(self.service.db, ThreadConnectionDB):
            self.service.db.hold()

    def _release_db(self) -> None:
        if isinstance(self.service.db, ThreadConnectionDB):
            self.service.db.release()

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown`, or SIGINT/SIGTERM when called from the main thread
        (uvicorn then stops gracefully and raises the signal again once stopped)."""
        self._hold_db()  # the event loop runs in this thread, and answers quick reads
        try:
            self._uvicorn.run(sockets=[self._socket])
        finally:
            self._release_db()

    def start_background(self) -> None:
        """Serve from a thread (tests, embedding); :meth:`close` ends it."""
        self.scheduler.start()
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving: no new connections; requests in flight get their answers."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def server_close(self) -> None:
        self._socket.close()
        self.app.close()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.scheduler.close()


def build_server(config: ServerConfig, settings: Settings | None = None) -> TrainportServer:
    """A server bound to ``config.host:config.port`` (port 0 picks a free one)."""
    settings = settings or load_settings()
    # First: a port in use is refused before anything is made or written (a key).
    sock = _listen(config.host, config.port)
    try:
        return _build(config, settings, sock)
    except BaseException:
        sock.close()
        raise


def _build(config: ServerConfig, settings: Settings, sock: socket.socket) -> TrainportServer:
    service = JobService(
        settings,
        reconcile_on_read=False,
        allow_process_runner=settings.server_allow_process_runner,
        allow_host_paths=settings.server_allow_host_paths,
    )
    service.db = ThreadConnectionDB(settings.db_path)
    limit = config.max_concurrent_jobs or settings.max_concurrent_jobs
    scheduler = Scheduler(service, limit, interval=config.scheduler_interval)
    sagemaker = SageMakerApi(service, scheduler)
    logs = LogsApi(service)
    tuning = TuningApi(service, scheduler)
    operations = {
        **sagemaker.operations(),
        **tuning.operations(),
        **logs.operations(),
        "Trainport.Ping": _ping,
    }
    created: AccessKey | None = None
    if config.auth:
        keys, created = load_or_create_keys(settings)
        verifier: SigV4Verifier | None = SigV4Verifier(keys, SERVED)
        auth = DashboardAuth(keys)
    else:
        log.warning(
            "--no-auth: requests are NOT authenticated; anyone who can reach %s:%s can run "
            "code on this machine",
            config.host,
            config.port,
        )
        verifier, auth = None, DashboardAuth(None)
    protocol = JsonProtocol(operations, verifier, max_body=config.max_body)
    dashboard = DashboardApi(service, sagemaker, logs, auth, tuning)
    if not vendor_present():
        log.warning("%s", VENDOR_MISSING)
    server = TrainportServer(config, service, scheduler, protocol, dashboard, sock)
    server.created_key = created
    # Before serving: end what died while no server ran, start what was queued.
    scheduler.tick()
    return server
