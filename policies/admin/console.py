"""Admin API routes the operator console reads (gateway/ui/): the overview figures and usage over time.

They are part of the admin API (same guard, same errors), so the console shows exactly what
`GET /admin/v1/overview` and `GET /admin/v1/usage/series` answer for the same window.
"""

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from core.models import ModelConfig
from policies.admin.inputs import Moment
from policies.console_query import Bucket, SeriesGroup, active_key_counts, overview, series


def alias_prices(models: list[ModelConfig]) -> dict[str, tuple[float, float]]:
    """USD per input and output token of each alias: its deployments' weighted mean (as the metrics)."""
    prices = {}
    for model in models:
        total = sum(d.weight for d in model.deployments) or 1.0
        mean_in = sum(d.input_price_per_1m * d.weight for d in model.deployments) / total
        mean_out = sum(d.output_price_per_1m * d.weight for d in model.deployments) / total
        prices[model.name] = (mean_in / 1e6, mean_out / 1e6)
    return prices


def console_routes(router: APIRouter, deps: Any) -> None:
    """`deps`: the admin router's AdminDeps (engine, directory)."""

    @router.get("/overview")
    async def get_overview(start: Moment | None = None, end: Moment | None = None) -> dict[str, Any]:
        """Requests, errors, tokens, spend, cache hits and their value, p50/p95 latency: totals and per model."""
        start, end = _naive_utc(start), _naive_utc(end)
        figures = await overview(deps.engine, start, end, alias_prices(deps.directory.models))
        return {"start": _iso(start), "end": _iso(end), **figures}

    @router.get("/key-counts")
    async def key_counts() -> dict[str, dict[str, int]]:
        """Active (not revoked) keys per tenant: the console's tenant list, without listing every key."""
        return {"data": await active_key_counts(deps.engine)}

    @router.get("/usage/series")
    async def get_series(
        group: SeriesGroup = "model",
        bucket: Bucket = "hour",
        start: Moment | None = None,
        end: Moment | None = None,
        tenant_id: str | None = None,
        key_id: str | None = None,
        model: str | None = None,
        groups: Annotated[list[str] | None, Query(description="draw these (else the 12 largest)")] = None,
    ) -> dict[str, Any]:
        """Requests, tokens and spend per hour or day, one series per tenant, key or model (the 12 largest, or
        the `groups` given: the console's usage page passes the first of `GET /usage?limit=`'s answer, which
        ranks them the same way), the rest as '(other)'."""
        start, end = _naive_utc(start), _naive_utc(end)
        filters = {k: v for k, v in {"tenant_id": tenant_id, "key_id": key_id, "model": model}.items() if v}
        data = await series(deps.engine, group, bucket, start, end, filters, groups)
        return {"start": _iso(start), "end": _iso(end), "group": group, "bucket": bucket, "data": data}


def _naive_utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat() + "Z"
