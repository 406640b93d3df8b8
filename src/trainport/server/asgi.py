"""The ASGI application behind the server: what each HTTP request gets.

uvicorn speaks HTTP (see :mod:`.limits`); this routes what it parsed. A request signed for
a service trainport does not serve gets that service's error (:mod:`.unserved`), whatever
its method; ``POST`` is the JSON API (:mod:`.protocol`); ``GET`` is the dashboard; other
methods are refused.

Operations run on a pool of threads, each holding its own database connection for its
life: they may wait (on the object store, a write lock, a job's processes), and the SQLite
and file reads they spend much of their time in release the GIL, so there they run beside
the event loop. The ``quick`` ones, reads of one record, are answered by the event loop
itself: they take less time than the two thread switches of a trip through the pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mimetypes
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlsplit

from trainport.errors import TrainportError
from trainport.server.dashboard_api import DashboardApi, Download, Signed
from trainport.server.dashboard_auth import SignIn
from trainport.server.protocol import ApiError, JsonProtocol, Response, error_response
from trainport.server.unserved import UnservedServices, unserved_service

__all__ = ["VENDOR_MISSING", "TrainportApp", "vendor_present"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

# A refused body up to this size is read (and dropped) before the refusal is sent, so the
# client, still sending, reads the answer instead of a reset connection; past it, the
# connection is closed unread.
_DRAIN_LIMIT = 64 * 1024 * 1024
_STATIC = {
    "/": "index.html",
    "/app.js": "app.js",
    "/charts.js": "charts.js",
    "/style.css": "style.css",
    "/favicon.svg": "favicon.svg",
    "/favicon.ico": "favicon.svg",
}
# The charting library, fetched by scripts/fetch-dashboard-vendor.sh (not in git).
_VENDOR = {
    "/vendor/uPlot.iife.min.js": "vendor/uPlot.iife.min.js",
    "/vendor/uPlot.min.css": "vendor/uPlot.min.css",
    "/vendor/uPlot.LICENSE": "vendor/uPlot.LICENSE",
}
VENDOR_MISSING = (
    "the dashboard's charting library (uPlot) is not installed: charts are shown as tables; "
    "run scripts/fetch-dashboard-vendor.sh, then reinstall trainport"
)
# The header a dashboard POST carries: a page of another site cannot send it to us.
_DASHBOARD_HEADER = "x-trainport-dashboard"
_CLOSE = (("Connection", "close"),)


class _Gone(Exception):
    """The client went away, or was cut off, before its request had arrived."""


def _headers(scope: Scope) -> dict[str, str]:
    """Lower-case names to values; a repeated header's values joined by commas (as SigV4
    canonicalises them)."""
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        out[name] = f"{out[name]},{value}" if name in out else value
    return out


def _target(scope: Scope) -> str:
    """The request line's path and query, as the client signed them."""
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    return (path + (b"?" + query if query else b"")).decode("latin-1")


def _content_length(headers: dict[str, str]) -> int | None:
    raw = headers.get("content-length")
    return int(raw) if raw is not None and raw.isdigit() else None


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, refused past ``limit`` bytes (only a chunked body can be: the
    parser holds others to their Content-Length)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(
                "RequestEntityTooLarge", f"the request body is over the limit of {limit} bytes", 413
            )
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _refuse(receive: Receive, send: Send, refusal: Response, length: int | None) -> None:
    """Send ``refusal`` and end the connection, having drained a moderate body first."""
    if length is not None and length <= _DRAIN_LIMIT:
        await _read_body(receive, _DRAIN_LIMIT)
    await _send(send, refusal, _CLOSE)


async def _send(send: Send, response: Response, extra: tuple[tuple[str, str], ...] = ()) -> None:
    headers = [
        (b"content-type", response.content_type.encode()),
        (b"content-length", str(len(response.body)).encode()),
        (b"x-amzn-requestid", b"trainport"),
    ]
    headers += [(k.encode(), v.encode()) for k, v in (*response.headers, *extra)]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


class TrainportApp:
    def __init__(
        self,
        protocol: JsonProtocol,
        dashboard: DashboardApi,
        unserved: UnservedServices,
        *,
        workers: int,
        worker_setup: Callable[[], None] | None = None,
        quick: frozenset[str] = frozenset(),
    ) -> None:
        self.protocol = protocol
        self.dashboard = dashboard
        self.unserved = unserved
        self.quick = quick  # X-Amz-Target values answered on the event loop
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="trainport-api", initializer=worker_setup
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan is off; nothing else is spoken here
            return
        headers = _headers(scope)
        try:
            service = unserved_service(headers)
            if service is not None:
                await self._unserved(scope, receive, send, headers, service)
            elif scope["method"] == "POST" and scope["path"].startswith("/api/"):
                await self._dashboard_post(scope, receive, send, headers)
            elif scope["method"] == "POST":
                await self._api(scope, receive, send, headers)
            elif scope["method"] == "GET":
                await self._dashboard(scope, send, headers)
            else:
                refusal = error_response(
                    "NotImplemented", f"this server does not answer {scope['method']}", 501
                )
                await _send(send, refusal, _CLOSE)
        except _Gone:
            log.debug("a client went away before its request had arrived")
        except ApiError as exc:
            await _send(send, error_response(exc.api_code, str(exc), exc.status), _CLOSE)

    # -- the API ----------------------------------------------------------------------------

    async def _api(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]
    ) -> None:
        length = _content_length(headers)
        refusal = self.protocol.refuse_length(length)
        if refusal is not None:
            await _refuse(receive, send, refusal, length)
            return
        # The parser holds the body to its Content-Length, which is within the limit.
        body = await _read_body(receive, self.protocol.max_body)
        if headers.get("x-amz-target") in self.quick:
            response = self.protocol.handle(_target(scope), headers, body)
        else:
            response = await self._run(self.protocol.handle, _target(scope), headers, body)
        await _send(send, response)

    async def _unserved(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str], service: str
    ) -> None:
        # Any method may come here, and may carry no body at all: only a length over the
        # limit is refused.
        length = _content_length(headers)
        error = self.protocol.length_error(length) if length is not None else None
        if error is not None:
            await _refuse(receive, send, self.unserved.refusal(headers, error), length)
            return
        body = await _read_body(receive, self.protocol.max_body)
        response = await self._run(
            self.unserved.answer, scope["method"], _target(scope), headers, body, service
        )
        await _send(send, response)

    # -- the dashboard ----------------------------------------------------------------------

    async def _dashboard(self, scope: Scope, send: Send, headers: dict[str, str]) -> None:
        url = urlsplit(_target(scope))
        dashboard = self.dashboard
        if url.path == "/" and "token=" in url.query:
            # The link `trainport server` printed: a wrong or old one lands on the sign-in
            # page with a message (never an error document the browser would download).
            cookie = dashboard.sign_in(url.query)
            if cookie is None:
                cookie, location = dashboard.auth.signed_out(), "/#/signin/bad-link"
            else:
                location = "/"
            redirect = Response(
                303, b"", "text/plain", (("Location", location), ("Set-Cookie", cookie))
            )
            await _send(send, redirect)
            return
        if url.path in _STATIC:
            await _send(
                send, await self._run(_static, _STATIC[url.path]), (("Cache-Control", "no-cache"),)
            )
            return
        if url.path in _VENDOR:
            # Fixed by version: the browser may keep it.
            await _send(send, await self._run(_vendor, _VENDOR[url.path]))
            return
        if url.path == "/healthz":
            await _send(send, Response(200, b'{"ok": true}', "application/json"))
            return
        if not url.path.startswith("/api/"):
            await _send(send, error_response("NotFound", f"nothing at {url.path}", 404))
            return
        if url.path == "/api/session":
            # Where the browser stands, always a 200: the page shows the sign-in form
            # without first making a request that fails.
            state = dashboard.check(headers)
            session = {
                "signedIn": state is SignIn.OK,
                "auth": dashboard.auth.enabled,
                "message": None if state is SignIn.OK else state.message(),
            }
            await _send(send, Response(200, json.dumps(session).encode(), "application/json"))
            return
        if not await self._signed_in(send, headers):
            return
        try:
            result = await self._run(dashboard.get, url.path[len("/api/") :], url.query)
        except TrainportError as exc:
            await _send(send, error_response(exc.api_code, str(exc), getattr(exc, "status", 400)))
            return
        except Exception:
            log.exception("dashboard request %s failed", url.path)
            await _send(send, error_response("InternalFailure", "see the server's log", 500))
            return
        if isinstance(result, Download):
            await self._download(send, result)
        else:
            await _send(send, Response(200, json.dumps(result).encode(), "application/json"))

    async def _signed_in(self, send: Send, headers: dict[str, str]) -> bool:
        """Whether the request is signed in; if not, the 401 that says why is sent."""
        state = self.dashboard.check(headers)
        if state is SignIn.OK:
            return True
        code = "SignInExpired" if state is SignIn.STALE else "NotSignedIn"
        await _send(send, error_response(code, state.message(), 401))
        return False

    async def _dashboard_post(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]
    ) -> None:
        """The dashboard's actions: sign in and out, stop a job."""
        length = _content_length(headers)
        if length is None or length > 64 * 1024:
            await _refuse(
                receive,
                send,
                error_response(
                    "ValidationException",
                    "a dashboard action takes a body of at most 64 KiB, with its Content-Length",
                    413,
                ),
                length,
            )
            return
        body = await _read_body(receive, 64 * 1024)
        if headers.get(_DASHBOARD_HEADER) != "1":
            await _send(
                send,
                error_response(
                    "AccessDeniedException",
                    f"dashboard actions need the header {_DASHBOARD_HEADER}: 1",
                    403,
                ),
            )
            return
        path = scope["path"][len("/api/") :]
        try:
            if path == "signin":
                result: dict[str, Any] | Signed = self.dashboard.sign_in_with_key(body)
            elif path != "signout" and not await self._signed_in(send, headers):
                return
            else:
                result = await self._run(self.dashboard.post, path, body)
        except TrainportError as exc:
            await _send(send, error_response(exc.api_code, str(exc), getattr(exc, "status", 400)))
            return
        except Exception:
            log.exception("dashboard action %s failed", path)
            await _send(send, error_response("InternalFailure", "see the server's log", 500))
            return
        extra: tuple[tuple[str, str], ...] = ()
        if isinstance(result, Signed):
            extra = (("Set-Cookie", result.cookie),)
            result = result.body
        await _send(send, Response(200, json.dumps(result).encode(), "application/json"), extra)

    async def _download(self, send: Send, download: Download) -> None:
        """Stream ``download`` (no Content-Length: uvicorn sends it chunked), reading each
        piece from the store on the pool."""
        headers = [
            (b"content-type", b"application/gzip"),
            (b"content-disposition", f'attachment; filename="{download.filename}"'.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunks: Iterator[bytes] = download.chunks
        while (chunk := await self._run(next, chunks, None)) is not None:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def vendor_present() -> bool:
    """Whether the charting library was packaged (see scripts/fetch-dashboard-vendor.sh)."""
    files = resources.files("trainport.server").joinpath("dashboard")
    return all(files.joinpath(name).is_file() for name in _VENDOR.values())


def _vendor(name: str) -> Response:
    try:
        return _static(name)
    except OSError:
        if name.endswith(".js"):
            # The page draws its charts as tables and says why, instead of failing.
            script = f"window.TRAINPORT_CHARTS_MISSING = {json.dumps(VENDOR_MISSING)};\n"
            return Response(200, script.encode(), "text/javascript")
        if name.endswith(".css"):
            return Response(200, b"", "text/css")
        return error_response("NotFound", VENDOR_MISSING, 404)


def _static(name: str) -> Response:
    data = resources.files("trainport.server").joinpath("dashboard", name).read_bytes()
    ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response(200, data, ctype)
