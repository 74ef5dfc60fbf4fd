"""OpenAI's rate-limit headers and 429 errors, from a limiter's decision.

x-ratelimit-{limit,remaining,reset}-{requests,tokens} describe the tightest RPM/TPM bucket of the
request (key, tenant or model); reset is the time until that window's oldest entry expires, i.e.
until capacity next grows. Retry-After (whole seconds, at least 1) is the time until this request
would fit, or until the budget period ends.
"""

import math

from core.errors import OpenAIError
from policies.ratelimit.buckets import BucketState, Decision

_UNITS = {"requests": ("requests per min (RPM)", "requests"), "tokens": ("tokens per min (TPM)", "tokens")}
_HEADERS = {
    kind: tuple(f"x-ratelimit-{field}-{unit}" for field in ("limit", "remaining", "reset"))
    for kind, (_, unit) in _UNITS.items()
}


def rate_headers(decision: Decision) -> dict[str, str]:
    tightest: dict[str, BucketState] = {}  # per kind, the first state with the least room left
    for state in decision.states:
        kind = state.bucket.kind
        if kind in _UNITS:
            best = tightest.get(kind)
            if best is None or state.bucket.limit - state.used < best.bucket.limit - best.used:
                tightest[kind] = state
    headers: dict[str, str] = {}
    for kind, (limit, remaining, reset) in _HEADERS.items():
        if (state := tightest.get(kind)) is not None:
            headers[limit] = str(int(state.bucket.limit))
            headers[remaining] = str(max(0, int(state.bucket.limit - state.used)))
            headers[reset] = duration(state.reset_s)
    return headers


def rejection(decision: Decision) -> OpenAIError:
    failed = decision.failed
    assert failed is not None
    headers = rate_headers(decision)
    if failed.retry_s >= 0:
        headers["retry-after"] = str(max(1, math.ceil(failed.retry_s)))
        headers["retry-after-ms"] = str(max(1, math.ceil(failed.retry_s * 1000)))
    return OpenAIError(429, _message(failed), **_type_and_code(failed), headers=headers)


def duration(seconds: float) -> str:
    """OpenAI's format: 20ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    rounded = round(seconds, 1)
    if rounded < 60:
        return f"{rounded:g}s"
    minutes, rest = divmod(int(rounded), 60)
    return f"{minutes}m{rest}s"


def usd(amount: float) -> str:
    """Dollars at their real precision: 10.00, 0.025, 0.0002, 0.000213 (three significant digits below a cent)."""
    if amount <= 0:
        return "0.00"
    decimals = min(12, max(2, 2 - math.floor(math.log10(amount))))
    text = f"{amount:.{decimals}f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def _type_and_code(failed: BucketState) -> dict[str, str]:
    if failed.bucket.kind == "budget":
        return {"type": "insufficient_quota", "code": "insufficient_quota"}
    return {"type": "requests" if failed.bucket.kind != "tokens" else "tokens", "code": "rate_limit_exceeded"}


def _message(failed: BucketState) -> str:
    bucket = failed.bucket
    if bucket.kind == "budget":
        return (
            f"You exceeded your current quota on {bucket.label}: spent ${usd(failed.used)} of "
            f"${usd(bucket.limit)} (requests in flight included). Please check your plan and billing details."
        )
    if bucket.kind == "concurrency":
        return f"Too many concurrent requests on {bucket.label}: limit {int(bucket.limit)}. Please retry shortly."
    unit = _UNITS[bucket.kind][0]
    if failed.retry_s < 0:
        return f"Request too large for {unit} on {bucket.label}: limit {int(bucket.limit)}, requested {int(bucket.cost)}."
    return (
        f"Rate limit reached for {unit} on {bucket.label}: Limit {int(bucket.limit)}, Used {int(failed.used)}, "
        f"Requested {int(bucket.cost)}. Please try again in {duration(failed.retry_s)}."
    )
