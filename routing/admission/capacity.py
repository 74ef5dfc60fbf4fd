"""How many requests a pool can run at once, from its deployments' settings and the engines' own metrics.

A deployment's slots are its `max_concurrency` when set (vLLM's `--max-num-seqs`, say). Otherwise they are
learned from its scraped metrics: when the engine has requests waiting, it runs all it can, so the most it
ran while requests waited over the last `window_s` is its capacity (not the latest count: an engine spending
a step's token budget on prefill chunks leaves requests waiting with slots free, as vLLM's chunked prefill
does); while nothing waits and its KV cache has room, the estimate grows by one slot per
fresh scrape (additive increase, so a capacity seen under a KV-limited mix is not kept forever).

`engine_queue` (0 by default) gives a learned engine that many requests beyond its count to hold in its
own queue, as the Gateway API inference extension's saturation detector lets a pod queue up to 5 before
calling it full. Without it the estimate can lock: while long prompts' prefill chunks fill each step, the
engine keeps a request or two waiting whatever its free slots, so it never runs more than the gateway lets
in, and the most it ran while requests waited can only stay or fall (one H200 engine with room for 256
sequences was held to 8–12 slots: docs/overload-gpu.md). With it the count climbs to what the engine runs.
It is off by default because where an engine's sequence limit binds (the CPU pools, 4 per engine) the
extra queue cost the interactive class a little in both orders of a paired run (docs/overload.md). On one
H100 engine 2 and 8 lifted the learned slots from 8–12 to 40–86 with the interactive targets held, yet left
the steps part empty under a batch flood (docs/overload-gpu.md, fifth run).

Until an engine has been seen saturated its slots are unknown, and a pool with an unknown deployment is
not held back (the engines queue). An engine whose KV cache is fuller than `kv_high` takes nothing new; ejected
(open breaker) or cooling (upstream Retry-After) deployments count for nothing, and a pool with none left
is down.
"""

import math
from collections import deque
from dataclasses import dataclass

from routing.replica import Replica


@dataclass(frozen=True)
class Slots:
    total: float | None  # requests the pool runs at once; None: not known yet (do not hold requests)
    down: bool = False  # no deployment can take a request: refuse with 503
    retry_after_s: float = 0.0  # when down: until the first breaker lets probes through
    # every live deployment takes a priority and its engine preempts lower ones for a higher request (our
    # engine; vLLM with --scheduling-policy priority): a class's room ignores slots held by lower classes
    preemptible: bool = False


class CapacityEstimate:
    def __init__(self, stale_s: float, kv_high: float, window_s: float = 60.0, engine_queue: int = 0) -> None:
        self._stale_s = stale_s
        self._kv_high = kv_high
        self._window_s = window_s
        self._engine_queue = engine_queue
        self._peaks: dict[str, deque[tuple[float, float]]] = {}
        self._learned: dict[str, float] = {}
        self._seen_at: dict[str, float] = {}

    def slots(self, replicas: list[Replica], now: float) -> Slots:
        total: float | None = 0.0
        reopen = math.inf
        live = 0
        preemptible = True
        for replica in replicas:
            if replica.breaker.state == "open" or replica.cooling(now):
                reopen = min(reopen, replica.breaker.reopens_in() or max(replica.not_before - now, 0.0))
                continue
            live += 1
            preemptible = preemptible and replica.backend.config.takes_priority()
            cap = self._replica_slots(replica, now)
            total = None if cap is None or total is None else total + cap
        if not live:
            return Slots(0.0, down=True, retry_after_s=reopen if math.isfinite(reopen) else 1.0)
        return Slots(total, preemptible=preemptible)

    def _replica_slots(self, replica: Replica, now: float) -> float | None:
        fresh = now - replica.engine.at <= self._stale_s
        configured = replica.backend.config.max_concurrency
        if configured is not None:
            cap: float | None = float(configured)
        else:
            learned = self._learn(replica, fresh)
            cap = None if learned is None else learned + self._engine_queue
        if fresh and replica.engine.kv_usage >= self._kv_high:
            cap = min(cap if cap is not None else math.inf, float(replica.outstanding))
        return cap

    def _learn(self, replica: Replica, fresh: bool) -> float | None:
        name, load = replica.name, replica.engine
        if not fresh or self._seen_at.get(name) == load.at:  # one update per scrape
            return self._learned.get(name)
        self._seen_at[name] = load.at
        if load.waiting > 0:
            peaks = self._peaks.setdefault(name, deque())
            peaks.append((load.at, load.running))
            while peaks[0][0] < load.at - self._window_s:
                peaks.popleft()
            self._learned[name] = max(max(running for _, running in peaks), 1.0)
        elif (
            name in self._learned
            and load.running >= self._learned[name] - 0.5
            and load.kv_usage < self._kv_high * 0.9
        ):
            self._learned[name] += 1.0
        return self._learned.get(name)
