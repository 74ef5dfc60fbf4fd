"""What a limiter checks: buckets (one limit each), its decision, and the spend it records.

Semantics (the same in Redis and in-process):
- requests/tokens: a rolling window log. A request is admitted when the weights admitted in the
  last `window_s` seconds plus its cost stay within the limit; exact, no approximation.
  Token entries are re-weighted to the real usage at settlement while still in the window.
- concurrency: one lease per request in flight, released at settlement, renewed while the request
  runs, so a dead replica's slots expire one lease length later.
- budget: admitted while the period's spend plus the reservations of requests in flight is below the
  limit; an admitted request reserves its estimated cost (`cost`, USD) under a lease like a concurrency
  slot, and settlement swaps the reservation for the real cost. A burst thus overshoots by at most one
  request's cost.
"""

from dataclasses import dataclass
from typing import Literal, Protocol

Kind = Literal["requests", "tokens", "concurrency", "budget"]


@dataclass(frozen=True)
class Bucket:
    kind: Kind
    name: str  # unique within the scope, e.g. "k:key_1:rpm"
    scope: str  # the tenant id: every bucket of one request shares it (one Redis Cluster slot)
    limit: float
    cost: float = 0.0  # charged at admission: 1 request, the token reservation, the estimated USD
    label: str = ""  # who the limit applies to, for messages: "key key_1", "tenant acme"
    retry_hint_s: float = 0.0  # budgets: seconds until the period ends


@dataclass(frozen=True)
class Spend:
    name: str
    scope: str
    amount_usd: float
    ttl_s: int


@dataclass(frozen=True)
class BucketState:
    bucket: Bucket
    used: float  # including this request when admitted
    reset_s: float  # until the oldest entry in the window expires (0 when empty)
    retry_s: float  # when rejected: until this request would fit


@dataclass(frozen=True)
class Decision:
    admitted: bool
    states: list[BucketState]
    failed: BucketState | None = None


@dataclass
class Replayed:
    """A request admitted by the in-process fallback while Redis was away, to replay into Redis after."""

    member: str
    buckets: list[Bucket]
    at: float  # time.time() of the admission
    tokens: int | None = None  # its real usage, once settled


Held = tuple[str, list[Bucket]]  # a request in flight: its member id and the buckets it was admitted to


def holds_lease(bucket: Bucket) -> bool:
    """Does an admission to this bucket leave a lease to renew and release (a slot, a reservation)?"""
    return bucket.kind == "concurrency" or (bucket.kind == "budget" and bucket.cost > 0)


class Limiter(Protocol):
    async def admit(self, member: str, buckets: list[Bucket], failure_mode: str | None = None) -> Decision:
        """All buckets pass and are charged, or none; `failure_mode` ("open"/"closed", None = the
        process default) says what a failover limiter does while its shared store is unavailable."""
        ...

    async def renew(self, held: list[Held]) -> None:
        """Extend the leases of requests still in flight."""
        ...

    async def drain(self) -> None:
        """Wait for settlements still on their way (shutdown, tests)."""
        ...

    async def replay(self, admitted: list[Replayed]) -> None:
        """Count requests that another limiter admitted (during an outage) in this one's windows; raises
        when they could not all be counted (the caller keeps them to replay again)."""
        ...

    async def aclose(self) -> None:
        """Drain, then stop background work and close connections."""
        ...

    async def settle(self, member: str, buckets: list[Bucket], tokens: int, spends: list[Spend]) -> None:
        """Re-weight token buckets to `tokens`, release concurrency, add the spends."""
        ...

    async def seed_spend(self, spends: list[Spend]) -> None:
        """Set spend counters that do not exist yet (start-up reload from usage records)."""
        ...
