"""AWS Signature Version 4 verification, and the server's access keys.

The server recomputes the signature a client (boto3, the AWS CLI) put in the
``Authorization`` header from the request it actually received: method, path, query, the
headers the client said it signed, and the SHA-256 of the body. So a wrong secret, a
tampered body or header, and a replay of a request signed more than 15 minutes away from
now are all refused. The canonical form follows the published SigV4 algorithm, which is
what botocore's ``SigV4Auth`` produces; every boto3 call in the tests checks the two agree.
It is built here rather than by botocore's signer, which is made for signing: it takes an
``X-Amz-Content-SHA256`` header as the body's hash without hashing the body (a verifier must
hash what it received), leaves out headers it never signs itself even when a client signed
them, and takes the query as encoded by its own serializer.

Keys: ``TRAINPORT_SERVER_KEYS`` (``AKID:SECRET,...``) when set; otherwise the key file
``$TRAINPORT_HOME/server/keys.json``, created with one new key pair on first start (its
``AccessKeys`` list may hold more). ``TRAINPORT_SERVER_EXTRA_KEYS`` adds pairs to either.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlsplit

from trainport.config import Settings
from trainport.errors import TrainportError

__all__ = [
    "AccessKey",
    "AuthError",
    "SigV4Verifier",
    "credential_service",
    "load_or_create_keys",
]

log = logging.getLogger(__name__)

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = dt.timedelta(minutes=15)
_REQUIRED_SIGNED = ("host", "x-amz-date")


class AuthError(TrainportError):
    """A request whose signature cannot be accepted (HTTP 403)."""

    status = 403

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.api_code = code


@dataclass(frozen=True)
class AccessKey:
    key_id: str
    secret: str


def _new_key() -> AccessKey:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    key_id = "TPAK" + "".join(secrets.choice(alphabet) for _ in range(16))
    return AccessKey(key_id, secrets.token_urlsafe(30))


def load_or_create_keys(settings: Settings) -> tuple[list[AccessKey], AccessKey | None]:
    """The keys the server accepts, its own first (the dashboard's token derives from the
    first), then ``TRAINPORT_SERVER_EXTRA_KEYS``; and the key pair created just now (None
    if none was)."""
    own, created = _own_keys(settings)
    # An extra pair never replaces the secret of one of the server's own key ids.
    ids = {k.key_id for k in own}
    extra = [AccessKey(k, s) for k, s in settings.server_extra_keys if k not in ids]
    return own + extra, created


def _own_keys(settings: Settings) -> tuple[list[AccessKey], AccessKey | None]:
    if settings.server_keys:
        return [AccessKey(k, s) for k, s in settings.server_keys], None
    path = settings.server_keys_path
    if path.exists():
        try:
            doc = json.loads(path.read_text())
            keys = [AccessKey(k["AccessKeyId"], k["SecretAccessKey"]) for k in doc["AccessKeys"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise TrainportError(
                f"the server key file {path} is not valid; fix it or delete it to create a "
                "new key pair"
            ) from exc
        return keys, None
    key = _new_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"AccessKeys": [{"AccessKeyId": key.key_id, "SecretAccessKey": key.secret}]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
    log.info("created a server access key %s in %s", key.key_id, path)
    return [key], key


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def _canonical_query(query: str) -> str:
    pairs = sorted(
        (quote(k, safe="-_.~"), quote(v, safe="-_.~"))
        for k, v in parse_qsl(query, keep_blank_values=True)
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def _parse_authorization(value: str) -> tuple[str, list[str], str]:
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthError(
            "IncompleteSignatureException",
            f"Authorization header: unsupported algorithm {algorithm!r}; sign with SigV4",
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, val = part.strip().partition("=")
        if sep:
            fields[name] = val
    try:
        return fields["Credential"], fields["SignedHeaders"].split(";"), fields["Signature"]
    except KeyError as exc:
        raise AuthError(
            "IncompleteSignatureException",
            f"Authorization header is missing {exc.args[0]}=",
        ) from exc


def credential_service(authorization: str) -> str | None:
    """The service named in a SigV4 ``Authorization`` header's credential scope, or None
    when the header is not a SigV4 one (:meth:`SigV4Verifier.verify` says what is wrong)."""
    try:
        credential, _, _ = _parse_authorization(authorization)
    except AuthError:
        return None
    parts = credential.split("/")
    return parts[3] if len(parts) == 5 else None


class SigV4Verifier:
    #: Derived signing keys kept. Honest clients use a few (key, date, region, service)
    #: scopes; a bound keeps forged scopes from growing the cache without end.
    CACHE_SIZE = 256

    def __init__(self, keys: list[AccessKey], services: tuple[str, ...] = ("sagemaker", "logs")):
        self._secrets = {k.key_id: k.secret for k in keys}
        self._services = services
        # Signing keys depend only on (secret, date, region, service): cache them, most
        # recently used last. Only a scope that verified is kept (see verify).
        self._derived: OrderedDict[tuple[str, str, str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def cached_scopes(self) -> int:
        """How many derived signing keys are cached."""
        return len(self._derived)

    def verify(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes,
        now: dt.datetime | None = None,
        *,
        service: str | None = None,
    ) -> str:
        """Check a request's signature; returns the access key id, or raises AuthError.

        ``headers`` maps lower-case names to values; ``target`` is the request line's path
        and query. The credential scope must name one of the verifier's services, or
        ``service`` when given (a request for a service the server then says it does not
        serve)."""
        auth = headers.get("authorization")
        if not auth:
            raise AuthError(
                "MissingAuthenticationTokenException",
                "Missing Authentication Token: sign requests with SigV4 (boto3 does) using a "
                "key the server accepts",
            )
        credential, signed, signature = _parse_authorization(auth)
        try:
            key_id, date, region, scope_service, terminal = credential.split("/")
        except ValueError as exc:
            raise AuthError(
                "IncompleteSignatureException", f"malformed Credential {credential!r}"
            ) from exc
        allowed = (service,) if service is not None else self._services
        if terminal != "aws4_request" or scope_service not in allowed:
            raise AuthError(
                "InvalidSignatureException",
                f"Credential scope {credential!r}: expected service one of {allowed}",
            )
        secret = self._secrets.get(key_id)
        if secret is None:
            raise AuthError(
                "UnrecognizedClientException",
                f"The security token included in the request is invalid: unknown access key "
                f"{key_id!r}",
            )
        missing = [h for h in _REQUIRED_SIGNED if h not in signed]
        if headers.get("x-amz-target") is not None and "x-amz-target" not in signed:
            missing.append("x-amz-target")
        if missing:
            raise AuthError(
                "IncompleteSignatureException",
                f"these headers must be signed: {', '.join(missing)}",
            )
        stamp = headers.get("x-amz-date", "")
        try:
            when = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        except ValueError as exc:
            raise AuthError("IncompleteSignatureException", f"bad X-Amz-Date {stamp!r}") from exc
        now = now or dt.datetime.now(dt.UTC)
        if abs(now - when) > MAX_SKEW:
            raise AuthError(
                "InvalidSignatureException",
                f"Signature expired: {stamp} is more than 15 minutes away from the server's "
                f"time {now.strftime('%Y%m%dT%H%M%SZ')}",
            )
        if stamp[:8] != date:
            raise AuthError("InvalidSignatureException", "Credential date differs from X-Amz-Date")
        parts = urlsplit(target)
        canonical_headers = "".join(
            f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in signed
        )
        canonical = "\n".join(
            (
                method,
                quote(parts.path or "/", safe="/~"),
                _canonical_query(parts.query),
                canonical_headers,
                ";".join(signed),
                hashlib.sha256(body).hexdigest(),
            )
        )
        scope = f"{date}/{region}/{scope_service}/aws4_request"
        to_sign = "\n".join(
            (ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest())
        )
        cache_key = (key_id, date, region, scope_service)
        with self._lock:
            derived = self._derived.get(cache_key)
        if derived is None:
            derived = signing_key(secret, date, region, scope_service)
        expected = hmac.new(derived, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            raise AuthError(
                "InvalidSignatureException",
                "The request signature we calculated does not match the signature you "
                "provided. Check your AWS Secret Access Key and signing method.",
            )
        with self._lock:
            self._derived[cache_key] = derived
            self._derived.move_to_end(cache_key)
            while len(self._derived) > self.CACHE_SIZE:
                self._derived.popitem(last=False)
        return key_id
