"""The fleet-wide limiter: every replica shares one Redis; admission is one atomic Lua call.

Settlement and lease renewal leave the request path: `settle` queues its script call on the shared
pipelined connection and returns (so it reaches Redis before any admission sent after it), and its reply
is awaited in the background (`drain` waits for the outstanding ones). Settlement is lazy: it leaves with
the next admission's write (one round trip per request at one connection), or after resp.LAZY_FLUSH_S.
"""

import asyncio
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from policies.metrics import REDIS_FAILURES
from policies.ratelimit.buckets import Bucket, BucketState, Decision, Held, Replayed, Spend, holds_lease
from policies.ratelimit.resp import Pool, _retrieve
from policies.ratelimit.script import LuaScript

log = logging.getLogger(__name__)
_SCRIPTS = Path(__file__).parent
_CODES = {"requests": "R", "tokens": "L", "concurrency": "C", "budget": "B"}
KEY_NAMES_CACHED = 10_000


class RedisLimiter:
    def __init__(self, pool: Pool, prefix: str, window_s: int, lease_s: float) -> None:
        self._pool = pool
        self._prefix = prefix
        self._window_ms = window_s * 1000
        self._lease_ms = round(lease_s * 1000)
        self._admit = LuaScript(pool, (_SCRIPTS / "admit.lua").read_text())
        self._settle = LuaScript(pool, (_SCRIPTS / "settle.lua").read_text())
        self._renew = LuaScript(pool, (_SCRIPTS / "renew.lua").read_text())
        self._replay = LuaScript(pool, (_SCRIPTS / "replay.lua").read_text())
        self._pending: set[asyncio.Future[Any]] = set()
        self._key_names: dict[tuple[str, str, str], tuple[str, ...]] = {}  # (kind, scope, name) -> its keys

    async def admit(self, member: str, buckets: list[Bucket], failure_mode: str | None = None) -> Decision:
        keys, args = self.admission_call(member, buckets)
        return _decision(buckets, await self._admit(keys=keys, args=args))

    def admission_call(self, member: str, buckets: list[Bucket]) -> tuple[list[str], list[str | int]]:
        """KEYS and ARGV of admit.lua; the bucket specs travel as one string (cheaper to send)."""
        keys: list[str] = []
        for bucket in buckets:
            keys += self._keys(bucket.kind, bucket.scope, bucket.name)
        spec = " ".join(f"{_CODES[b.kind]} {b.limit!r} {b.cost!r}" for b in buckets)
        return keys, [member, self._window_ms, self._lease_ms, spec]

    async def settle(self, member: str, buckets: list[Bucket], tokens: int, spends: list[Spend]) -> None:
        keys, args = self.settlement_call(member, buckets, tokens, spends)
        if keys:
            self._background("settle", self._settle.send(keys=keys, args=args, lazy=True))

    def settlement_call(
        self, member: str, buckets: list[Bucket], tokens: int, spends: list[Spend]
    ) -> tuple[list[str], list[str | int]]:
        """KEYS and ARGV of settle.lua (no KEYS: nothing to settle)."""
        keys: list[str] = []
        specs: list[str] = []
        for bucket in buckets:
            if bucket.kind in ("tokens", "concurrency"):  # request logs need nothing
                keys += self._keys(bucket.kind, bucket.scope, bucket.name)
                specs.append(f"{_CODES[bucket.kind]} {tokens} 0")
            elif bucket.kind == "budget" and bucket.cost > 0:  # release the reservation
                keys += self._keys(bucket.kind, bucket.scope, bucket.name)[1:]
                specs.append("Q 0 0")
        for spend in spends:
            keys.append(self._key(spend.scope, spend.name))
            specs.append(f"S {spend.amount_usd!r} {spend.ttl_s * 1000}")
        return keys, [member, " ".join(specs)]

    async def renew(self, held: list[Held]) -> None:
        """Extends the leases of requests in flight; one script call per tenant (one Cluster slot each)."""
        by_scope: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
        for member, buckets in held:
            for bucket in buckets:
                if holds_lease(bucket):
                    keys, members = by_scope[bucket.scope]
                    keys.append(self._lease_key(bucket))
                    members.append(member)
        calls = [
            self._renew(keys=keys, args=[self._lease_ms, *members]) for keys, members in by_scope.values()
        ]
        await asyncio.gather(*calls)

    async def replay(self, admitted: list[Replayed]) -> None:
        """Writes the requests admitted elsewhere while Redis was away into the RPM/TPM logs, and waits for
        Redis to confirm every one: a replay lost on a connection still reconnecting raises, so the caller
        keeps them (an outage's admissions are never forgotten while their window lasts)."""
        ttl_ms = self._window_ms + 60_000
        cutoff = time.time() - self._window_ms / 1000
        replies = []
        for entry in (e for e in admitted if e.at > cutoff):
            for bucket in entry.buckets:
                if bucket.kind in ("requests", "tokens"):
                    weight = int(entry.tokens if entry.tokens is not None else bucket.cost)
                    args = [entry.member, round(entry.at * 1000), weight, ttl_ms]
                    keys = self._keys(bucket.kind, bucket.scope, bucket.name)
                    replies.append(self._replay.send(keys=keys, args=args))
        await asyncio.gather(*replies)

    async def seed_spend(self, spends: list[Spend]) -> None:
        replies = [
            self._pool.send("SET", self._key(s.scope, s.name), repr(s.amount_usd), "NX", "EX", s.ttl_s)
            for s in spends
        ]
        await asyncio.gather(*replies)

    async def probe(self) -> None:
        """One harmless script call on a key of the limiter's prefix (start-up check of ACL rights)."""
        await self._renew(keys=[self._key("probe", "start")], args=[self._lease_ms, "probe"])

    def readiness(self) -> dict[str, Any]:
        """The connection's state for /health/ready: where, connected, and why not (no secrets)."""
        problem, connected = self._pool.problem, self._pool.connected
        report: dict[str, Any] = {"where": self._pool.where, "connected": connected}
        if not connected:  # try again now, so readiness follows Redis even without traffic
            asyncio.ensure_future(self._pool.connect()).add_done_callback(_retrieve)
            if problem is not None:
                report["problem"] = f"{type(problem).__name__}: {problem}"
        return report

    async def drain(self) -> None:
        """Waits for the settlements sent so far (on shutdown, and in tests)."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def aclose(self) -> None:
        await self.drain()
        self._pool.close()

    def _background(self, operation: str, reply: "asyncio.Future[Any]") -> None:
        self._pending.add(reply)
        reply.add_done_callback(lambda done: self._done(operation, done))

    def _done(self, operation: str, reply: "asyncio.Future[Any]") -> None:
        self._pending.discard(reply)
        error = None if reply.cancelled() else reply.exception()
        if error is not None:  # the answer is already out; leases expire, windows roll
            REDIS_FAILURES.labels(operation=operation, mode="background").inc()
            log.warning("rate limiting: Redis %s failed (%s: %s)", operation, type(error).__name__, error)

    def _lease_key(self, bucket: Bucket) -> str:
        keys = self._keys(bucket.kind, bucket.scope, bucket.name)
        return keys[1] if bucket.kind == "budget" else keys[0]

    def _key(self, scope: str, name: str) -> str:
        return f"{self._prefix}{{{scope}}}:{name}"

    def _keys(self, kind: str, scope: str, name: str) -> tuple[str, ...]:
        """A bucket's Redis keys, named once per bucket (the cache is emptied when it grows past
        KEY_NAMES_CACHED: budget names change with their period)."""
        keys = self._key_names.get((kind, scope, name))
        if keys is None:
            if len(self._key_names) >= KEY_NAMES_CACHED:
                self._key_names.clear()
            keys = self._key_names[kind, scope, name] = _bucket_keys(kind, self._key(scope, name))
        return keys


def _bucket_keys(kind: str, key: str) -> tuple[str, ...]:
    if kind == "tokens":
        return (key + ":log", key + ":w")
    if kind == "budget":  # spend counter, reservation leases, reservation weights
        return (key, key + ":r", key + ":rw")
    return (key,)


def _decision(buckets: list[Bucket], reply: list) -> Decision:
    states = [
        BucketState(bucket, float(used), int(reset_ms) / 1000, int(retry_ms) / 1000)
        for bucket, used, reset_ms, retry_ms in zip(
            buckets, reply[2::3], reply[3::3], reply[4::3], strict=False
        )
    ]
    failed_index = int(reply[1])
    failed = states[failed_index - 1] if failed_index else None
    if failed and failed.bucket.kind == "budget":
        failed = BucketState(failed.bucket, failed.used, 0.0, failed.bucket.retry_hint_s)
    return Decision(admitted=bool(int(reply[0])), states=states, failed=failed)
