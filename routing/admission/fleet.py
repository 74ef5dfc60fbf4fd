"""Admission across gateway replicas: each replica publishes, per pool, its demand per class (requests
running plus waiting) and its tenants' served tokens over the share window; each reads the others'.

A pool's keys carry its alias as a hash tag (`{alias}`), so on a Redis Cluster they live in one slot and the
round trip below goes to one node. Every `sync_interval_s`, per pool with anything to say, one pipelined
round trip: SET its own record (with a
PX of `replica_ttl_s`, so a replica that dies frees its share when it expires), ZADD itself to the pool's
replica set (score: the record's expiry), drop expired members, read the members; then one MGET of the
others' records. Nothing of this runs on a request's path: a gate decides on the last view it got (zero
Redis round trips per request). While Redis is away, the others' numbers are dropped after
`replica_ttl_s` and each replica admits on its own (its own counts, the pool's whole capacity).
"""

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from routing.admission.admission import Admission
from routing.admission.gate import PoolGate

log = logging.getLogger("llmgw.routing")


class FleetSync:
    def __init__(
        self, admission: Admission, redis: Redis, prefix: str, replica_id: str | None = None
    ) -> None:
        self._admission = admission
        self._redis = redis
        self._prefix = prefix + "adm:"
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        settings = admission.settings
        self._interval = settings.sync_interval_s
        self._ttl_ms = int(settings.replica_ttl_s * 1000)
        self._task: asyncio.Task[None] | None = None
        self._last_ok = time.monotonic()
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync()
                self._last_ok = time.monotonic()
                if self._failing:
                    log.info("admission: the fleet's shares are read from Redis again")
                self._failing = False
            except (RedisError, OSError, TimeoutError) as error:
                if not self._failing:
                    log.warning(
                        "admission: Redis unavailable, each replica admits alone: %s", type(error).__name__
                    )
                self._failing = True
                if time.monotonic() - self._last_ok > self._ttl_ms / 1000:
                    for gate in self._admission.gates.values():
                        gate.others, gate.ledger.others, gate.others_running = {}, {}, 0.0
                        gate.others_queued, gate.others_rate, gate.others_tenants = {}, 0.0, {}
                        gate.guard.others = {}
            await asyncio.sleep(self._interval)

    async def sync(self) -> None:
        for gate in list(self._admission.gates.values()):
            await self._sync_gate(gate)

    async def _sync_gate(self, gate: PoolGate) -> None:
        now_ms = int(time.time() * 1000)
        members, mine = self.members_key(gate.alias), self._record_key(gate.alias, self.replica_id)
        record = json.dumps({"demand": gate.demand(), "running": gate.running_total(), "queued": gate.queued(),
                             "rate": gate.release_rate(), "service": gate.ledger.local(),
                             "tenants": gate.tenant_demand(), "slo": gate.guard.local()})  # fmt: skip
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(mine, record, px=self._ttl_ms)
            pipe.zadd(members, {self.replica_id: now_ms + self._ttl_ms})
            pipe.zremrangebyscore(members, "-inf", now_ms)
            pipe.pexpire(members, self._ttl_ms * 4)
            pipe.zrange(members, 0, -1)
            replies = await pipe.execute()
        others = [_text(m) for m in replies[-1] if _text(m) != self.replica_id]
        records = await self._redis.mget([self._record_key(gate.alias, r) for r in others]) if others else []
        demand: dict[str, float] = {}
        service: dict[str, float] = {}
        queued: dict[str, float] = {}
        tenants: dict[str, dict[str, tuple[float, float]]] = {}
        outcomes: dict[str, tuple[float, float]] = {}
        running = rate = 0.0
        for raw in records:
            if raw is None:
                continue
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                data: dict[str, Any] = json.loads(raw)
                running += float(data["running"])
                rate += float(data.get("rate", 0.0))
                for name, count in data.get("queued", {}).items():
                    queued[name] = queued.get(name, 0.0) + float(count)
                for name, count in data["demand"].items():
                    demand[name] = demand.get(name, 0.0) + float(count)
                for tenant, amount in data["service"].items():
                    service[tenant] = service.get(tenant, 0.0) + float(amount)
                for name, (met, missed) in data.get("slo", {}).items():
                    seen_met, seen_missed = outcomes.get(name, (0.0, 0.0))
                    outcomes[name] = (seen_met + float(met), seen_missed + float(missed))
                for name, by_tenant in data.get("tenants", {}).items():
                    merged = tenants.setdefault(name, {})
                    for tenant, (count, weight) in by_tenant.items():
                        seen, seen_weight = merged.get(tenant, (0.0, 0.0))
                        merged[tenant] = (seen + float(count), max(seen_weight, float(weight)))
        gate.others, gate.ledger.others = demand, service  # type: ignore[assignment]
        gate.others_tenants = tenants  # type: ignore[assignment]
        gate.guard.others = outcomes  # type: ignore[assignment]
        gate.others_running, gate.others_queued, gate.others_rate = running, queued, rate  # type: ignore[assignment]
        if gate.waiting():
            gate.tick()

    def members_key(self, alias: str) -> str:
        return f"{self._prefix}{{{alias}}}:replicas"

    def _record_key(self, alias: str, replica: str) -> str:
        return f"{self._prefix}{{{alias}}}:r:{replica}"

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(RedisError, OSError, TimeoutError):  # leave at once rather than by expiry
            for alias in list(self._admission.gates):
                await self._redis.zrem(self.members_key(alias), self.replica_id)
                await self._redis.delete(self._record_key(alias, self.replica_id))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
