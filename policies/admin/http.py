"""Admin API plumbing: the admin-token guard (with scopes) and OpenAI-style error rendering for its routes."""

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import SecretStr
from starlette.exceptions import HTTPException
from starlette.responses import Response

from core.errors import OpenAIError, error_response
from policies.errors import Conflict, NotFound
from policies.keys import hash_key

READ, ADMIN = "read", "admin"  # an admin token's scope: read may only look; admin may change everything
SCOPE_EXTENSION = (
    "llmgw.admin_scope"  # set in-process by the console's forwarded calls (gateway/ui/routes.py)
)
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
TokenLookup = Callable[[str], Awaitable[str | None]]  # sha256 hex of a bearer -> its scope, None if unknown


def admin_guard(
    token: SecretStr | None, lookup: TokenLookup | None = None
) -> Callable[[Request], Awaitable[None]]:
    """No token configured: the API is off (404). No bearer: 401. Wrong bearer: 403. A `read` token (made
    through POST /admin/v1/admin-tokens) on a method that changes state: 403 insufficient_scope. The
    configured token has every right; the console's calls carry their session's scope."""
    expected = token.get_secret_value().encode() if token else None

    async def check(request: Request) -> None:
        if expected is None:
            raise OpenAIError(
                404, "The admin API is disabled: set LLMGW_ADMIN_TOKEN to enable it.", code="admin_disabled"
            )
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise OpenAIError(
                401, "Provide the admin token as 'Authorization: Bearer <token>'.", code="missing_admin_token"
            )
        if hmac.compare_digest(given.strip().encode(), expected):
            scope = (request.scope.get("extensions") or {}).get(SCOPE_EXTENSION, ADMIN)
        else:
            scope = await lookup(hash_key(given.strip())) if lookup is not None else None
        if scope is None:
            raise OpenAIError(403, "The admin token is not valid.", code="invalid_admin_token")
        if scope != ADMIN and request.method not in READ_METHODS:
            raise OpenAIError(
                403,
                f"This admin token has the scope {scope!r}: it may read, not change anything.",
                code="insufficient_scope",
            )

    return check


class OpenAIErrorRoute(APIRoute):
    """Renders validation, not-found and conflict errors of admin routes as OpenAI error JSON."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # mapped to OpenAI errors; anything else is re-raised
                return error_response(as_openai_error(exc))

        return handle


def as_openai_error(exc: Exception) -> OpenAIError:
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _validation_error(exc)
    if isinstance(exc, NotFound):
        return OpenAIError(404, str(exc), code=f"{exc.kind}_not_found")
    if isinstance(exc, Conflict):
        return OpenAIError(409, str(exc), code="conflict")
    if isinstance(exc, HTTPException):  # e.g. FastAPI's "error parsing the body"
        return OpenAIError(exc.status_code, f"Invalid request: {exc.detail}", code="invalid_json")
    raise exc


def _validation_error(exc: RequestValidationError) -> OpenAIError:
    if any(e.get("type") == "json_invalid" for e in exc.errors()):  # not JSON at all: 400, as on every route
        return OpenAIError(400, "Invalid request: the body is not valid JSON.", code="invalid_json")
    problems = [
        f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in exc.errors()
    ]
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return OpenAIError(422, "Invalid request: " + "; ".join(problems), param=param, code="invalid_value")
