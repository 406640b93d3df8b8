"""Answers for the AWS services trainport does not serve.

A client pointed at trainport for every service (``AWS_ENDPOINT_URL``) asks it for other
services too: the SageMaker SDK looks a role up in IAM when ``role=`` is a bare name, and
asks STS for the account when it needs a default bucket. Such a request names its
service in its signature's credential scope. Its signature is checked as any other's;
then it gets an error in its own service's protocol, so the client reads an ordinary
service error (botocore: a ``ClientError``) saying the service is not served here and
what to do instead, rather than failing to parse a body in another protocol.

The protocol is read from the request: JSON for the JSON protocols (``X-Amz-Target`` or a
JSON content type), CBOR for Smithy RPC v2 CBOR, and otherwise the XML error that the
query protocol (IAM, STS), EC2's and REST-XML's parsers all read. Every answer also
carries ``x-amzn-ErrorType``, where REST-JSON clients look for the code.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from enum import StrEnum
from xml.sax.saxutils import escape

from trainport.server.protocol import ApiError, Response
from trainport.server.sigv4 import AuthError, SigV4Verifier, credential_service

__all__ = ["SERVED", "UNSERVED_CODE", "Dialect", "UnservedServices", "unserved_service"]

log = logging.getLogger(__name__)

#: The signing names of the services this server answers.
SERVED = ("sagemaker", "logs")
UNSERVED_CODE = "ServiceNotServed"

# What a client can do instead, for the services SageMaker clients ask.
_INSTEAD = {
    "iam": "give roles as full ARNs (arn:aws:iam::<account>:role/<name>); trainport does not "
    "look roles up",
    "sts": "trainport has no accounts: name buckets and role ARNs explicitly (the SageMaker "
    "SDK: Session(default_bucket=...), role='arn:aws:iam::<account>:role/<name>')",
}


class Dialect(StrEnum):
    """How a service's clients read an error body."""

    JSON = "json"
    CBOR = "cbor"
    XML = "xml"


def dialect_of(headers: Mapping[str, str]) -> Dialect:
    """``headers`` maps lower-case names to values."""
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    if "smithy-protocol" in headers or ctype == "application/cbor":
        return Dialect.CBOR
    if "x-amz-target" in headers or ctype.endswith("json"):
        return Dialect.JSON
    return Dialect.XML


def unserved_service(headers: Mapping[str, str]) -> str | None:
    """The service a SigV4-signed request is for, when this server does not serve it."""
    service = credential_service(headers.get("authorization", ""))
    return service if service is not None and service not in SERVED else None


def _cbor_text(value: str) -> bytes:
    data = value.encode()
    size = len(data)
    if size < 24:
        head = bytes([0x60 | size])
    elif size < 1 << 8:
        head = bytes([0x78, size])
    elif size < 1 << 16:
        head = bytes([0x79]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x7A]) + size.to_bytes(4, "big")
    return head + data


def _cbor_map(fields: Mapping[str, str]) -> bytes:
    """A CBOR map of text to text (RFC 8949): all an error body holds."""
    out = bytes([0xA0 | len(fields)])  # fewer than 24 entries
    for key, value in fields.items():
        out += _cbor_text(key) + _cbor_text(value)
    return out


def error_in(dialect: Dialect, code: str, message: str, status: int) -> Response:
    """An AWS error body that ``dialect``'s clients parse into ``code`` and ``message``."""
    headers = (("x-amzn-ErrorType", code),)
    if dialect is Dialect.JSON:
        body = json.dumps({"__type": code, "message": message}).encode()
        return Response(status, body, "application/x-amz-json-1.1", headers)
    if dialect is Dialect.CBOR:
        body = _cbor_map({"__type": code, "message": message})
        cbor_headers = (*headers, ("smithy-protocol", "rpc-v2-cbor"))
        return Response(status, body, "application/cbor", cbor_headers)
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<ErrorResponse><Error><Type>Sender</Type>'
        f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
        "<RequestId>trainport</RequestId></ErrorResponse>"
    )
    return Response(status, xml.encode(), "text/xml", headers)


class UnservedServices:
    """Checks a request for another service as the API's are checked, then says that
    the service is not served."""

    def __init__(self, verifier: SigV4Verifier | None) -> None:
        self.verifier = verifier

    def answer(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes, service: str
    ) -> Response:
        dialect = dialect_of(headers)
        if self.verifier is not None:
            try:
                self.verifier.verify(method, target, headers, body, service=service)
            except AuthError as exc:
                log.info("refused a request for %s: %s: %s", service, exc.api_code, exc)
                return error_in(dialect, exc.api_code, str(exc), exc.status)
        log.info("answered a request for %s: not served", service)
        return error_in(dialect, UNSERVED_CODE, _message(service), 400)

    def refusal(self, headers: Mapping[str, str], error: ApiError) -> Response:
        """``error`` (a refusal before the request was read) in the client's protocol."""
        return error_in(dialect_of(headers), error.api_code, str(error), error.status)


def _message(service: str) -> str:
    served = "SageMaker training jobs and their CloudWatch Logs"
    text = f"this trainport server serves {served}, not the {service!r} service"
    instead = _INSTEAD.get(service)
    return f"{text}: {instead}" if instead else text
