"""Signing people in to the dashboard: a cookie, got with an access key pair or a link.

The API stays SigV4-only; the dashboard's own endpoints (``/api/...``) take a cookie. A
person signs in on the dashboard's sign-in form with an access key pair the server accepts
(its key file's, or ``TRAINPORT_SERVER_KEYS``), or by opening the link ``trainport server``
prints (``/?token=...``). Either way the server sets an HttpOnly, SameSite=Strict cookie
holding that key's dashboard token: an HMAC of the key's secret, so it survives restarts,
is never the secret itself, and stops working when the key is removed (a stale cookie).

Each check says why it failed (:class:`SignIn`), so the page can tell a person who never
signed in from one whose sign-in went stale, and a wrong link sends the browser to the
sign-in page with a message rather than an error document.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from trainport.server.sigv4 import AccessKey

__all__ = ["COOKIE", "DashboardAuth", "SignIn", "dashboard_token"]

COOKIE = "trainport_dashboard"
# A browser keeps the cookie for a week at most; signing in again renews it.
_MAX_AGE = 7 * 24 * 3600


def dashboard_token(key: AccessKey) -> str:
    return hmac.new(key.secret.encode(), b"trainport-dashboard", hashlib.sha256).hexdigest()[:40]


class SignIn(enum.Enum):
    """Where a request stands."""

    OK = "ok"
    MISSING = "missing"  # no cookie nor bearer token: never signed in, or signed out
    STALE = "stale"  # a token no key gives (a wrong link, a key since removed)

    def message(self) -> str:
        if self is SignIn.STALE:
            return (
                "your sign-in is no longer valid (the server's access keys changed, or the "
                "link was wrong): sign in with an access key pair"
            )
        return "sign in with an access key pair the server accepts"


class DashboardAuth:
    """``keys`` the server accepts (None: ``--no-auth``, everyone is signed in)."""

    def __init__(self, keys: Sequence[AccessKey] | None) -> None:
        self._keys = list(keys) if keys is not None else None
        self._tokens = [dashboard_token(k) for k in keys] if keys is not None else []

    @property
    def enabled(self) -> bool:
        return self._keys is not None

    @property
    def link_token(self) -> str | None:
        """The token of the sign-in link the server prints (its first key's)."""
        return self._tokens[0] if self._tokens else None

    def _known(self, token: str) -> bool:
        # Every token compared, so the time taken says nothing of which one matched.
        found = False
        for known in self._tokens:
            found |= hmac.compare_digest(token.encode(), known.encode())
        return found

    def check(self, headers: Mapping[str, str]) -> SignIn:
        if self._keys is None:
            return SignIn.OK
        given = None
        bearer = headers.get("authorization", "")
        if bearer.startswith("Bearer "):
            given = bearer[7:]
        else:
            cookie = SimpleCookie()
            try:
                cookie.load(headers.get("cookie", ""))
            except CookieError:
                return SignIn.STALE
            morsel = cookie.get(COOKIE)
            given = morsel.value if morsel is not None else None
        if not given:
            return SignIn.MISSING
        return SignIn.OK if self._known(given) else SignIn.STALE

    def with_link(self, query: str) -> str | None:
        """The Set-Cookie value for the link's ``?token=`` when it is right, else None."""
        given = parse_qs(query).get("token", [""])[0]
        if not self.enabled or not given or not self._known(given):
            return None
        return _cookie(given)

    def with_key(self, key_id: str, secret: str) -> str | None:
        """The Set-Cookie value for an access key pair the server accepts, else None."""
        if self._keys is None:
            return None
        match = None
        for key in self._keys:
            same_id = hmac.compare_digest(key.key_id.encode(), key_id.encode())
            same_secret = hmac.compare_digest(key.secret.encode(), secret.encode())
            if same_id and same_secret:
                match = key
        return _cookie(dashboard_token(match)) if match is not None else None

    @staticmethod
    def signed_out() -> str:
        """The Set-Cookie value that removes the cookie."""
        return f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"


def _cookie(token: str) -> str:
    return f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={_MAX_AGE}"
