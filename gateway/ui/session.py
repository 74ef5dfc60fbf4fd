"""Console sessions: a signed, expiring cookie in place of the admin token, and the CSRF token bound to it.

The cookie value is `<expiry>.<nonce>.<grant>.<mac>`, MAC'd with a key derived from the admin token, so every
replica that shares the token accepts it and changing the token signs everyone out. The grant says who signed
in: `admin` for the configured admin token, else the id of the admin token made through the API (its scope is
looked up on every call, so revoking that token signs its sessions out). The browser never
keeps the token itself. Signing out revokes the nonce in this process (and clears the cookie).
State-changing calls carry the CSRF token (an HMAC of the nonce) in a header, which only same-origin
script can read; the cookie is also SameSite=Strict and the Origin header must be this origin.
"""

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import SecretStr

COOKIE = "llmgw_console"
CSRF_HEADER = "x-csrf-token"
CONFIGURED = "admin"  # the grant of a sign-in with the configured admin token


@dataclass(frozen=True)
class Session:
    nonce: str
    expires_at: int  # Unix seconds
    grant: str = CONFIGURED  # CONFIGURED, or the id of an admin token made through the API


class Sessions:
    def __init__(self, admin_token: SecretStr, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        secret = admin_token.get_secret_value().encode()
        self._key = hmac.new(secret, b"llmgw console session v1", hashlib.sha256).digest()
        self._token = secret
        self.ttl_s = ttl_s
        self._clock = clock
        self._revoked: dict[str, int] = {}

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self._token)

    def issue(self, grant: str = CONFIGURED) -> tuple[str, Session]:
        session = Session(secrets.token_urlsafe(18), int(self._clock()) + self.ttl_s, grant)
        body = f"{session.expires_at}.{session.nonce}.{grant}"
        return f"{body}.{self._mac('session', body)}", session

    def check(self, value: str | None) -> Session | None:
        if not value or value.count(".") != 3:
            return None
        expires, nonce, grant, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac("session", f"{expires}.{nonce}.{grant}")):
            return None
        if not expires.isdigit() or int(expires) <= self._clock() or nonce in self._revoked:
            return None
        return Session(nonce, int(expires), grant)

    def csrf(self, session: Session) -> str:
        return self._mac("csrf", session.nonce)

    def csrf_matches(self, session: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf(session).encode())  # type: ignore[union-attr]

    def revoke(self, session: Session) -> None:
        now = self._clock()
        self._revoked = {n: e for n, e in self._revoked.items() if e > now}
        self._revoked[session.nonce] = session.expires_at

    def _mac(self, purpose: str, text: str) -> str:
        return hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).hexdigest()


class SignInThrottle:
    """At most `limit` wrong tokens per rolling minute in this process; then sign-in waits (429)."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._failures: list[float] = []

    def blocked(self) -> bool:
        now = self._clock()
        self._failures = [t for t in self._failures if now - t < 60]
        return len(self._failures) >= self._limit

    def failed(self) -> None:
        self._failures.append(self._clock())
