"""The AWS JSON 1.1 protocol: one ``POST /`` door, dispatched by ``X-Amz-Target``.

A request is checked in this order, so nothing is read or revealed before it must be:
size (an oversize body is refused unread), signature (SigV4, unless the server runs with
``--no-auth``), content type, target, JSON body. Every refusal is an AWS-style error body
``{"__type": CODE, "message": ...}``: 403 for authentication, 413 for size, 400 for the
rest; errors trainport raises on purpose map through their ``api_code``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainport.errors import TrainportError
from trainport.server.sigv4 import AuthError, SigV4Verifier

__all__ = [
    "CONTENT_TYPE",
    "ApiError",
    "JsonProtocol",
    "Operation",
    "Response",
    "error_response",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-amz-json-1.1"
_ACCEPTED_TYPES = (CONTENT_TYPE, "application/x-amz-json-1.0")
DEFAULT_MAX_BODY = 1024 * 1024
MAX_DEPTH = 64  # levels of nested objects and arrays a request body may have

Operation = Callable[[dict[str, Any]], dict[str, Any]]


class ApiError(TrainportError):
    """A protocol-level refusal with its own code and HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.api_code = code
        self.status = status


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = CONTENT_TYPE
    headers: tuple[tuple[str, str], ...] = ()  # besides Content-Type and Content-Length


def error_response(code: str, message: str, status: int = 400) -> Response:
    body = json.dumps({"__type": code, "message": message}).encode()
    return Response(status, body)


def _too_deep() -> ApiError:
    return ApiError(
        "ValidationException",
        f"the request body nests objects and arrays more than {MAX_DEPTH} levels deep; "
        "no operation of this API takes such a request",
    )


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit``; iterative, so any depth is safe."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if not isinstance(item, dict | list):
            continue
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        todo.extend((child, depth + 1) for child in children)
    return False


def _error_for(exc: TrainportError) -> Response:
    status = getattr(exc, "status", 400)
    return error_response(exc.api_code, str(exc), status)


class JsonProtocol:
    """Dispatches JSON 1.1 requests to operations (``"SageMaker.DescribeTrainingJob"`` ->
    a function of the decoded body returning the response body)."""

    def __init__(
        self,
        operations: Mapping[str, Operation],
        verifier: SigV4Verifier | None,
        *,
        max_body: int = DEFAULT_MAX_BODY,
    ) -> None:
        self.operations = dict(operations)
        self.verifier = verifier
        self.max_body = max_body

    def length_error(self, length: int | None) -> ApiError | None:
        """Why a body of ``length`` bytes (None: not said) must not be read at all, or None."""
        if length is None:
            return ApiError(
                "MissingContentLength", "the request needs a Content-Length header", 411
            )
        if length > self.max_body:
            return ApiError(
                "RequestEntityTooLarge",
                f"the request body of {length} bytes is over the limit of {self.max_body} bytes",
                413,
            )
        return None

    def refuse_length(self, length: int | None) -> Response | None:
        """:meth:`length_error` as this protocol's error response."""
        error = self.length_error(length)
        return None if error is None else _error_for(error)

    def handle(self, path: str, headers: Mapping[str, str], body: bytes) -> Response:
        """``headers`` maps lower-case names to values."""
        try:
            if self.verifier is not None:
                self.verifier.verify("POST", path, headers, body)
            return self._dispatch(headers, body)
        except AuthError as exc:
            log.info("refused a request: %s: %s", exc.api_code, exc)
            return _error_for(exc)
        except TrainportError as exc:
            return _error_for(exc)
        except Exception:
            log.exception("internal error while handling %s", headers.get("x-amz-target"))
            return error_response(
                "InternalFailure", "the server failed to handle the request; see its log", 500
            )

    def _dispatch(self, headers: Mapping[str, str], body: bytes) -> Response:
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in _ACCEPTED_TYPES:
            raise ApiError(
                "SerializationException",
                f"Content-Type must be {CONTENT_TYPE}, not {ctype or 'missing'!r}",
            )
        target = headers.get("x-amz-target", "")
        operation = self.operations.get(target)
        if operation is None:
            raise ApiError(
                "UnknownOperationException",
                f"unknown operation {target or '(no X-Amz-Target header)'!r}; this server "
                f"implements {', '.join(sorted(self.operations))}",
            )
        try:
            params = json.loads(body or b"{}")
        except RecursionError as exc:
            raise _too_deep() from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(
                "SerializationException", f"the request body is not valid JSON: {exc}"
            ) from exc
        if _depth_over(params, MAX_DEPTH):
            # Within Python's recursion limit, but the validator and every reader after it
            # recurse too; no SageMaker request nests anywhere near this deep.
            raise _too_deep()
        if not isinstance(params, dict):
            raise ApiError("SerializationException", "the request body must be a JSON object")
        result = operation(params)
        return Response(200, json.dumps(result).encode())
