"""The HTTP server: the SageMaker and CloudWatch Logs JSON APIs on ``POST /``, the
dashboard on ``GET``.

Built on the standard library's ``ThreadingHTTPServer`` with HTTP/1.1 keep-alive (boto3
reuses its connections); one thread per connection. The server owns a
:class:`~trainport.jobs.scheduler.Scheduler`, which reconciles on its own clock, so reads
go straight to the job records. Nothing lives only in this process: jobs run under their
own supervisor processes, and the queue is in the job database, so a server killed with
SIGKILL and started again shows every job's true state and starts the queue where it was.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from trainport.config import Settings, load_settings
from trainport.errors import TrainportError
from trainport.jobs.scheduler import Scheduler
from trainport.jobs.service import JobService
from trainport.server.connections import ThreadConnectionDB
from trainport.server.dashboard_api import DashboardApi, Download, dashboard_token
from trainport.server.deadlines import ConnectionDeadlines
from trainport.server.logs_api import LogsApi
from trainport.server.protocol import DEFAULT_MAX_BODY, JsonProtocol, Response, error_response
from trainport.server.sagemaker_api import SageMakerApi
from trainport.server.sigv4 import AccessKey, SigV4Verifier, load_or_create_keys

__all__ = ["ServerConfig", "TrainportServer", "build_server"]

log = logging.getLogger(__name__)

_DRAIN_LIMIT = 64 * 1024 * 1024
_STATIC = {"/": "index.html", "/app.js": "app.js", "/style.css": "style.css"}


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    auth: bool = True
    max_concurrent_jobs: int | None = None  # None: from settings
    max_body: int = DEFAULT_MAX_BODY
    scheduler_interval: float = 0.5
    # Seconds a connection may wait idle for its next request, and a request may take to
    # arrive once its first line has: past them the connection is closed.
    idle_timeout: float = 30.0
    request_timeout: float = 15.0


def _ping(params: dict[str, Any]) -> dict[str, Any]:
    """A trivial operation: the ceiling the benchmark compares the real ones against."""
    return {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TrainportServer

    def setup(self) -> None:
        super().setup()
        # Small responses go out at once, not after the peer's delayed ACK (40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.deadlines.waiting(self.connection)
        db = self.server.service.db
        if isinstance(db, ThreadConnectionDB):
            db.hold()

    def handle_one_request(self) -> None:
        self.server.deadlines.waiting(self.connection)
        super().handle_one_request()

    def parse_request(self) -> bool:
        # The request line has come: headers and body must follow within the request timeout.
        self.server.deadlines.reading(self.connection)
        return super().parse_request()

    def finish(self) -> None:
        self.server.deadlines.forget(self.connection)
        try:
            super().finish()
        finally:
            db = self.server.service.db
            if isinstance(db, ThreadConnectionDB):
                db.release()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.headers.items()}

    def _send(self, response: Response, extra: dict[str, str] | None = None) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("x-amzn-RequestId", "trainport")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        # Head and body in one write: one packet for a small response.
        self._headers_buffer.append(b"\r\n" + response.body)  # type: ignore[attr-defined]
        self.flush_headers()

    def do_POST(self) -> None:
        protocol = self.server.protocol
        raw_length = self.headers.get("Content-Length")
        length = int(raw_length) if raw_length and raw_length.isdigit() else None
        refusal = protocol.refuse_length(length)
        if refusal is not None:
            # Drain a moderately large body so the client can read the error; past that,
            # close without reading. Either way this connection is done.
            if length is not None and length <= _DRAIN_LIMIT:
                while length > 0:
                    chunk = self.rfile.read(min(length, 1 << 16))
                    if not chunk:
                        break
                    length -= len(chunk)
            self.close_connection = True
            self._send(refusal, {"Connection": "close"})
            return
        body = self.rfile.read(length or 0)
        if len(body) < (length or 0):
            # The body stopped short: the client went away or ran out of time.
            self.close_connection = True
            return
        self.server.deadlines.handling(self.connection)
        self._send(protocol.handle(self.path, self._headers(), body))

    def do_GET(self) -> None:
        self.server.deadlines.handling(self.connection)
        url = urlsplit(self.path)
        dashboard = self.server.dashboard
        if url.path == "/" and "token=" in url.query:
            cookie = dashboard.sign_in(url.query)
            if cookie is None:
                self._send(error_response("AccessDeniedException", "wrong dashboard token", 403))
                return
            self.send_response(303)
            self.send_header("Location", "/")
            self.send_header("Set-Cookie", cookie)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path in _STATIC:
            self._static(_STATIC[url.path])
            return
        if url.path == "/healthz":
            self._send(Response(200, b'{"ok": true}', "application/json"))
            return
        if not url.path.startswith("/api/"):
            self._send(error_response("NotFound", f"nothing at {url.path}", 404))
            return
        if not dashboard.authorized(self._headers()):
            self._send(
                error_response(
                    "AccessDeniedException",
                    "sign in with the dashboard URL that `trainport server` printed",
                    401,
                )
            )
            return
        try:
            result = dashboard.get(url.path[len("/api/") :], url.query)
        except TrainportError as exc:
            status = getattr(exc, "status", 400)
            self._send(error_response(exc.api_code, str(exc), status))
            return
        except Exception:
            log.exception("dashboard request %s failed", self.path)
            self._send(error_response("InternalFailure", "see the server's log", 500))
            return
        if isinstance(result, Download):
            self._download(result)
        else:
            self._send(Response(200, json.dumps(result).encode(), "application/json"))

    def _static(self, name: str) -> None:
        data = resources.files("trainport.server").joinpath("dashboard", name).read_bytes()
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        self._send(Response(200, data, ctype), {"Cache-Control": "no-cache"})

    def _download(self, download: Download) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Disposition", f'attachment; filename="{download.filename}"')
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in download.chunks:
            if chunk:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


class TrainportServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        config: ServerConfig,
        service: JobService,
        scheduler: Scheduler,
        protocol: JsonProtocol,
        dashboard: DashboardApi,
    ) -> None:
        super().__init__((config.host, config.port), _Handler)
        self.config = config
        self.service = service
        self.scheduler = scheduler
        self.protocol = protocol
        self.dashboard = dashboard
        self.created_key: AccessKey | None = None
        self._thread: threading.Thread | None = None
        self.deadlines = ConnectionDeadlines(config.idle_timeout, config.request_timeout)
        self.deadlines.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def dashboard_url(self) -> str:
        token = self.dashboard.token
        return f"{self.url}/" + (f"?token={token}" if token else "")

    def start_background(self) -> None:
        """Serve from a thread (tests, embedding); :meth:`close` ends it."""
        self.scheduler.start()
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client gone mid-reply (or cut off by its deadline) is routine, not a traceback.
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("connection from %s ended: %s", client_address, exc)
            return
        log.exception("request from %s failed", client_address)

    def server_close(self) -> None:
        super().server_close()
        self.deadlines.close()

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.scheduler.close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def build_server(config: ServerConfig, settings: Settings | None = None) -> TrainportServer:
    """A server bound to ``config.host:config.port`` (port 0 picks a free one)."""
    settings = settings or load_settings()
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
    operations = {**sagemaker.operations(), **logs.operations(), "Trainport.Ping": _ping}
    created: AccessKey | None = None
    if config.auth:
        keys, created = load_or_create_keys(settings)
        verifier: SigV4Verifier | None = SigV4Verifier(keys)
        token: str | None = dashboard_token(keys[0])
    else:
        log.warning(
            "--no-auth: requests are NOT authenticated; anyone who can reach %s:%s can run "
            "code on this machine",
            config.host,
            config.port,
        )
        verifier, token = None, None
    protocol = JsonProtocol(operations, verifier, max_body=config.max_body)
    dashboard = DashboardApi(service, sagemaker, logs, token)
    server = TrainportServer(config, service, scheduler, protocol, dashboard)
    server.created_key = created
    # Before serving: end what died while no server ran, start what was queued.
    scheduler.tick()
    return server
