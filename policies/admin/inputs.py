"""Input checks of the admin API beyond the pydantic models: NUL characters and date bounds.

PostgreSQL rejects NUL in text: it is answered with a 422 in the API's error shape, never a 500. A year-1
or year-9999 timestamp overflows on the way to UTC: a usage query bound is clamped to 1970–3000, and a
key's expiry past 2100 (or before 1970) is refused.
"""

import re
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from fastapi import Request
from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from core.errors import OpenAIError

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)  # all bounds inclusive
LATEST_EXPIRY = datetime(2100, 1, 1, tzinfo=UTC)
LATEST_QUERY = datetime(3000, 1, 1, tzinfo=UTC)


def _side(value: datetime, latest: datetime) -> int:
    """-1 before EARLIEST, 1 after `latest`, 0 between them."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    try:
        return -1 if aware < EARLIEST else 1 if aware > latest else 0
    except OverflowError:  # a far offset near year 1 or 9999
        return 1 if value.year > 5000 else -1


def _bounded(value: datetime) -> datetime:
    """A query bound: clamped into 1970–3000 (a range starting in year 1 means "from the start")."""
    side = _side(value, LATEST_QUERY)
    return value if side == 0 else (LATEST_QUERY if side > 0 else EARLIEST).replace(tzinfo=None)


def _expiry(value: datetime) -> datetime:
    if _side(value, LATEST_EXPIRY) != 0:
        raise ValueError(f"must lie between {EARLIEST:%Y-%m-%d} and {LATEST_EXPIRY:%Y-%m-%d} (UTC)")
    return value


# Years 1980-2099, safely inside the validator's bounds whatever the offset: as far as JSON Schema can say it.
_EXPIRY_SCHEMA = {"type": "string", "format": "date-time", "pattern": "^(19[89][0-9]|20[0-9][0-9])-"}


def _iso_only(value: Any) -> Any:
    """Pydantic would read 0.5 as a Unix time; the API documents RFC 3339 date-times only."""
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER.fullmatch(value.strip())):
        raise ValueError("expected an RFC 3339 date-time such as 2025-01-31T00:00:00Z")
    return value


_NUMBER = re.compile(r"[-+]?[\d.]+([eE][-+]?\d+)?")
Moment = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(_bounded)]  # clamped to 1970..3000
Expiry = Annotated[
    datetime, BeforeValidator(_iso_only), AfterValidator(_expiry), WithJsonSchema(_EXPIRY_SCHEMA)
]  # 1970..2100


async def reject_nul(request: Request) -> None:
    """A router dependency: a JSON body (if any) that parses, and no NUL in the path, query or body."""
    if "\x00" in request.url.path:
        raise _nul_error("path")
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            raise _nul_error(name.replace("\x00", "") or "query")
    body = await request.body()
    if not body:
        return
    try:  # orjson first: the standard parser FastAPI uses overflows the stack on deeply nested input
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(  # 400, as a body that is not JSON is on every route
            400, f"Invalid request: the body is not valid JSON ({exc}).", code="invalid_json"
        ) from None
    found = _nul_path(document) if b"\\u0000" in body else None
    if found is not None:
        raise _nul_error(found)


def _nul_path(document: Any) -> str | None:
    """The dotted path of the first string (or key) holding a NUL, or None (iterative: bodies nest deep)."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return path or "body"
            continue
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and "\x00" in key:
                return where.replace("\x00", "")
            stack.append((where, item))
    return None


def _nul_error(param: str) -> OpenAIError:
    return OpenAIError(
        422, f"Invalid request: {param} contains a NUL character.", param=param, code="invalid_value"
    )
