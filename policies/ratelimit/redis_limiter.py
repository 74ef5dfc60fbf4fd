"""The fleet-wide limiter: every replica shares one Redis; admission is one atomic Lua call."""

from pathlib import Path

from redis.asyncio import Redis

from policies.ratelimit.buckets import Bucket, BucketState, Decision, Spend
from policies.ratelimit.resp import LuaScript, RespPool

_SCRIPTS = Path(__file__).parent
_CODES = {"requests": "R", "tokens": "L", "concurrency": "C", "budget": "B"}


class RedisLimiter:
    def __init__(self, redis: Redis, prefix: str, window_s: int, lease_s: int) -> None:
        self._redis = redis
        self._prefix = prefix
        self._window_ms = window_s * 1000
        self._lease_ms = lease_s * 1000
        scripts = RespPool.like(redis)  # the hot path; redis-py stays for the rare pipeline calls
        self._admit = LuaScript(scripts, (_SCRIPTS / "admit.lua").read_text())
        self._settle = LuaScript(scripts, (_SCRIPTS / "settle.lua").read_text())

    async def admit(self, member: str, buckets: list[Bucket]) -> Decision:
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
        keys: list[str] = []
        specs: list[str] = []
        for bucket in buckets:
            if bucket.kind in ("tokens", "concurrency"):  # request logs and budgets need nothing
                keys += self._keys(bucket.kind, bucket.scope, bucket.name)
                specs.append(f"{_CODES[bucket.kind]} {tokens} 0")
        for spend in spends:
            keys.append(self._key(spend.scope, spend.name))
            specs.append(f"S {spend.amount_usd!r} {spend.ttl_s * 1000}")
        if keys:
            await self._settle(keys=keys, args=[member, " ".join(specs)])

    async def seed_spend(self, spends: list[Spend]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for spend in spends:
                pipe.set(self._key(spend.scope, spend.name), repr(spend.amount_usd), nx=True, ex=spend.ttl_s)
            await pipe.execute()

    def _key(self, scope: str, name: str) -> str:
        return f"{self._prefix}{{{scope}}}:{name}"

    def _keys(self, kind: str, scope: str, name: str) -> list[str]:
        key = self._key(scope, name)
        return [key + ":log", key + ":w"] if _CODES[kind] == "L" else [key]


def _decision(buckets: list[Bucket], reply: list) -> Decision:
    states = [
        BucketState(
            bucket, float(reply[2 + 3 * i]), int(reply[3 + 3 * i]) / 1000, int(reply[4 + 3 * i]) / 1000
        )
        for i, bucket in enumerate(buckets)
    ]
    failed_index = int(reply[1])
    failed = states[failed_index - 1] if failed_index else None
    if failed and failed.bucket.kind == "budget":
        failed = BucketState(failed.bucket, failed.used, 0.0, failed.bucket.retry_hint_s)
    return Decision(admitted=bool(int(reply[0])), states=states, failed=failed)
