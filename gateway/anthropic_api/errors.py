"""Anthropic-shaped errors: {"type": "error", "error": {"type": ..., "message": ...}}."""

from typing import Any

import orjson
from starlette.responses import Response

from core.errors import OpenAIError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 422: "invalid_request_error",
          429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}  # fmt: skip


def error_body(error: OpenAIError) -> dict[str, Any]:
    kind = _TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def anthropic_error_response(error: OpenAIError) -> Response:
    return Response(orjson.dumps(error_body(error)), status_code=error.status, headers=dict(error.headers),
                    media_type="application/json")  # fmt: skip
