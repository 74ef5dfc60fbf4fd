"""The console's routes under /ui: the page and its static files, sign-in, and the admin API behind a session.

`/ui/api/admin/<path>` is the admin API itself (`/admin/v1/<path>`), called in-process with the admin token
once the session cookie (and, for changes, the CSRF header and same-origin check) passed: the console can
do exactly what the API allows, with the API's validation and errors. Nothing is installed without an
admin token, so /ui is a 404 then.
"""

import asyncio
import csv
import io
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
from fastapi import FastAPI, Request
from pydantic import SecretStr, ValidationError
from starlette.responses import RedirectResponse, Response

from gateway.settings import Settings
from gateway.ui.runtime import runtime_report
from gateway.ui.session import CONFIGURED, COOKIE, CSRF_HEADER, Session, Sessions, SignInThrottle
from policies.admin.http import ADMIN, SCOPE_EXTENSION
from policies.admin.schemas import PolicyIn
from policies.keys import hash_key
from policies.store import Store

STATIC = Path(__file__).resolve().parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png", ".txt": "text/plain"}  # fmt: skip
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def install_ui(app: FastAPI, settings: Settings) -> None:
    if settings.admin_token is None or not settings.ui.enabled:
        return
    console = Console(settings.admin_token, settings)
    add = app.add_api_route
    add("/ui", console.to_index, methods=["GET"], include_in_schema=False)
    add("/ui/", console.index, methods=["GET"], include_in_schema=False)
    add("/ui/static/{name:path}", console.static, methods=["GET"], include_in_schema=False)
    add("/ui/api/session", console.session, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    add("/ui/api/runtime", console.runtime, methods=["GET"], include_in_schema=False)
    add("/ui/api/validate/policy", console.validate_policy, methods=["POST"], include_in_schema=False)
    add("/ui/api/usage.csv", console.usage_csv, methods=["GET"], include_in_schema=False)
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    add("/ui/api/admin/{path:path}", console.admin, methods=methods, include_in_schema=False)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return _secured(Response(orjson.dumps(body), status, headers, media_type="application/json"))


def _secured(response: Response, cache: str = "no-store") -> Response:
    response.headers.update(SECURITY_HEADERS)
    response.headers.setdefault("cache-control", cache)
    return response


def _error(status: int, message: str, code: str) -> Response:
    return _json({"error": {"message": message, "type": "console_error", "code": code}}, status)


class Console:
    def __init__(self, admin_token: SecretStr, settings: Settings) -> None:
        self._token = admin_token
        self._settings = settings
        self.sessions = Sessions(admin_token, settings.ui.session_ttl_s)
        self._throttle = SignInThrottle(settings.ui.max_sign_in_failures)

    async def to_index(self) -> Response:
        return _secured(RedirectResponse("/ui/", 308))

    async def index(self) -> Response:
        return _secured(Response((STATIC / "index.html").read_bytes(), media_type=TYPES[".html"]))

    async def static(self, name: str) -> Response:
        path = (STATIC / name).resolve()
        if STATIC not in path.parents or not path.is_file() or path.suffix not in TYPES:
            return _error(404, "Unknown console file.", "not_found")
        return _secured(Response(path.read_bytes(), media_type=TYPES[path.suffix]), cache="no-cache")

    # Sessions

    async def _session(self, request: Request) -> tuple[Session, str] | None:
        """The session and its scope (read or admin); None when signed out, expired or its token revoked."""
        session = self.sessions.check(request.cookies.get(COOKIE))
        if session is None or session.grant == CONFIGURED:
            return None if session is None else (session, ADMIN)
        row = await _store(request).active_admin_token(token_id=session.grant)
        return None if row is None else (session, row.scope)

    def _refusal(self, request: Request, signed_in: tuple[Session, str] | None) -> Response | None:
        """Why this request may not go on (no session, a cross-site or CSRF-less change), or None. What a
        scope may do is the admin API's to say: the forwarded call carries the session's scope."""
        if signed_in is None:
            return _error(401, "Sign in to the console first.", "signed_out")
        if request.method in UNSAFE:
            if not _same_origin(request):
                return _error(403, "Cross-site requests are refused.", "cross_site")
            if not self.sessions.csrf_matches(signed_in[0], request.headers.get(CSRF_HEADER)):
                return _error(403, "Missing or wrong CSRF token: reload the console.", "csrf")
        return None

    def _signed_in(self, session: Session, scope: str) -> dict[str, Any]:
        return {"signed_in": True, "csrf": self.sessions.csrf(session), "expires_at": session.expires_at,
                "scope": scope}  # fmt: skip

    async def session(self, request: Request) -> Response:
        if request.method == "POST":
            return await self._sign_in(request)
        signed_in = await self._session(request)
        if (refused := self._refusal(request, signed_in)) is not None or signed_in is None:
            return refused or _error(401, "Sign in to the console first.", "signed_out")
        if request.method == "DELETE":
            self.sessions.revoke(signed_in[0])
            response = _json({"signed_in": False})
            response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
            return response
        return _json(self._signed_in(*signed_in))

    async def _sign_in(self, request: Request) -> Response:
        if not _same_origin(request):
            return _error(403, "Cross-site requests are refused.", "cross_site")
        if not request.headers.get("content-type", "").startswith("application/json"):
            return _error(415, "Send the token as JSON.", "unsupported_media_type")
        if self._throttle.blocked():
            return _error(429, "Too many wrong tokens: wait a minute.", "throttled")
        try:
            given = orjson.loads(await request.body()).get("token", "")
        except (orjson.JSONDecodeError, AttributeError):
            given = ""
        grant, scope = await self._grant(request, given)
        if grant is None:
            self._throttle.failed()
            await asyncio.sleep(0.2)
            return _error(403, "That is not the admin token.", "invalid_admin_token")
        value, session = self.sessions.issue(grant)
        response = _json(self._signed_in(session, scope))
        secure = self._settings.ui.secure_cookie
        response.set_cookie(
            COOKIE, value, max_age=self.sessions.ttl_s, path="/ui", httponly=True, samesite="strict",
            secure=request.url.scheme == "https" if secure is None else secure,
        )  # fmt: skip
        return response

    async def _grant(self, request: Request, given: Any) -> tuple[str | None, str]:
        """Who signs in with this token: the configured admin token, or an admin token made through the API."""
        if not isinstance(given, str) or not given:
            return None, ""
        if self.sessions.token_matches(given):
            return CONFIGURED, ADMIN
        row = await _store(request).active_admin_token(token_hash=hash_key(given))
        return (None, "") if row is None else (row.id, row.scope)

    # The admin API and what only the gateway knows

    async def admin(self, request: Request, path: str) -> Response:
        signed_in = await self._session(request)
        if (refused := self._refusal(request, signed_in)) is not None or signed_in is None:
            return refused or _error(401, "Sign in to the console first.", "signed_out")
        status, headers, body = await _forward(
            request, request.method, path, request.url.query, await request.body(), self._token, signed_in[1]
        )
        return _secured(
            Response(body, status, {k: v for k, v in headers.items() if k in ("content-type", "retry-after")})
        )

    async def runtime(self, request: Request) -> Response:
        if (refused := self._refusal(request, await self._session(request))) is not None:
            return refused
        return _json(runtime_report(request.app.state.services))

    async def validate_policy(self, request: Request) -> Response:
        """The policy form's check: the admin API's own PolicyIn schema, every problem with its field."""
        if (refused := self._refusal(request, await self._session(request))) is not None:
            return refused
        try:
            PolicyIn.model_validate_json(await request.body())
        except ValidationError as error:
            problems = [{"field": ".".join(str(p) for p in e["loc"]) or "body", "message": e["msg"]}
                        for e in error.errors(include_url=False, include_input=False)]  # fmt: skip
            return _json({"valid": False, "problems": problems})
        return _json({"valid": True, "problems": []})

    async def usage_csv(self, request: Request) -> Response:
        signed_in = await self._session(request)
        if (refused := self._refusal(request, signed_in)) is not None or signed_in is None:
            return refused or _error(401, "Sign in to the console first.", "signed_out")
        query = urlencode([(k, v) for k, v in request.query_params.multi_items()])
        status, headers, body = await _forward(
            request, "GET", "usage/series", query, b"", self._token, signed_in[1]
        )
        if status != 200:
            return _secured(Response(body, status, media_type="application/json"))
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["time", "group", "requests", "tokens", "cost_usd"])
        for row in orjson.loads(body)["data"]:
            writer.writerow(
                [row["t"], _cell(row["group"]), row["requests"], row["tokens"], f"{row['cost_usd']:.6f}"]
            )
        disposition = {"content-disposition": 'attachment; filename="llmgw-usage.csv"'}
        return _secured(Response(out.getvalue(), 200, disposition, media_type="text/csv; charset=utf-8"))


def _cell(value: Any) -> str:
    """A CSV cell a spreadsheet will not run as a formula."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _store(request: Request) -> Store:
    return request.app.state.services.policy.store


def _same_origin(request: Request) -> bool:
    """The Origin header (browsers send it on every POST/PUT/PATCH/DELETE) names this origin; without it,
    Sec-Fetch-Site says same-origin; a client sending neither (curl) is not a browser on another site."""
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


async def _forward(
    request: Request, method: str, path: str, query: str, body: bytes, token: SecretStr, scope: str
) -> tuple[int, dict[str, str], bytes]:
    """Runs /admin/v1/<path> in this app with the admin token limited to the session's scope (an ASGI
    extension, which only this process can set), and returns its answer."""
    target = "/admin/v1/" + path
    headers = [
        (k, v)
        for k, v in request.scope["headers"]
        if k not in (b"authorization", b"cookie", b"content-length")
    ]
    headers += [(b"authorization", b"Bearer " + token.get_secret_value().encode()),
                (b"content-length", str(len(body)).encode())]  # fmt: skip
    extensions = {**(request.scope.get("extensions") or {}), SCOPE_EXTENSION: scope}
    forwarded = {**request.scope, "method": method, "path": target, "raw_path": target.encode(), "root_path": "",
                 "query_string": query.encode(), "headers": headers, "extensions": extensions}  # fmt: skip
    for name in ("route", "endpoint", "path_params", "router"):
        forwarded.pop(name, None)
    sent = False
    result: dict[str, Any] = {"status": 500, "headers": {}, "body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            result["status"] = message["status"]
            result["headers"] = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            result["body"] += message.get("body", b"")

    await request.app(forwarded, receive, send)
    return result["status"], result["headers"], result["body"]
