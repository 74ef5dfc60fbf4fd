"""One pool's admission: start a request now if the pool has room for its class, else queue it or refuse it.

Room, per class: the pool's slots (capacity.py) are granted to the classes in rank order, each up to its
`pool_share` of them, each class getting at most what it asks (its requests running plus waiting, over the
whole fleet when replicas share Redis). A replica's part of a class's grant is, with fair sharing, what its
tenants get of the grant's whole slots shared between every tenant of the fleet by weighted max-min fairness
on their requests running plus waiting (fair.whole_slot_shares; a tenant on several replicas takes its part
on each in proportion to its demand there), so two tenants of weights 2 : 1 behind different replicas get
2 : 1 of the slots, not the ratio of their queues; without fair sharing, its part of that class's demand. A request starts when its
class runs fewer than its grant, so

- while the pool has room nothing waits: the request is counted and goes on (no await, no queue);
- when it is full, the higher classes' waiting requests take the next free slots before any lower one, and
  below-1 shares keep a few slots free for the classes above (they start without waiting for one);
- where every deployment takes a priority and its engine preempts lower-priority sequences for a higher one
  (Slots.preemptible: our engine; vLLM with `--scheduling-policy priority` and `send_priority: true`), a
  class's room counts only the slots of its own class and above: an interactive request starts beside a
  batch tenant holding the whole pool, and the engine takes a batch slot back (that request recomputes);
- within a class, the next request is the least-served tenant's (fair.py).

A request that cannot start before its class's deadline is refused at once with 429 and a Retry-After
from the queue's measured start rate (the time the requests ahead of it need), or with 429 when its wait
runs out. When every deployment of the pool is ejected (open breakers, upstream Retry-After), the requests
waiting are refused with 503 and the time until a breaker lets probes through; a new one is not held (the
router tries ejected deployments anyway when none is left, as it does without admission).
"""

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

from backends.base import UpstreamError
from routing.admission.capacity import Slots
from routing.admission.config import AdmissionSettings, ClassName
from routing.admission.fair import ClassQueue, ServiceLedger, Ticket, whole_slot_shares
from routing.admission.guard import SloGuard
from routing.admission.metrics import AdmissionMetrics

RATE_WINDOW_S = 10.0


class StartRate:
    """Slots freed per second over the last RATE_WINDOW_S (None until a few were seen)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._times: deque[float] = deque()

    def tick(self) -> None:
        now = self._clock()
        self._times.append(now)
        while self._times[0] < now - RATE_WINDOW_S:
            self._times.popleft()

    def per_s(self) -> float | None:
        if len(self._times) < 3:
            return None
        span = max(self._clock() - self._times[0], 1.0)
        return len(self._times) / span


class PoolGate:
    def __init__(
        self,
        alias: str,
        settings: AdmissionSettings,
        ledger: ServiceLedger,
        metrics: AdmissionMetrics,
        capacity: Callable[[], Slots],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alias = alias
        self._settings = settings
        self._classes = settings.classes
        self._ranked = settings.ranked()
        # per class, the classes of its rank and above: whose slots it must find room beside (_busy)
        self._at_or_above = {c: [a for a in self._ranked if self._classes[a].rank <= self._classes[c].rank]
                             for c in self._ranked}  # fmt: skip
        self._metrics = metrics
        self._capacity = capacity
        self._clock = clock
        self.ledger = ledger
        self.queues = {name: ClassQueue(settings.fair, ledger) for name in self._ranked}
        self.running: dict[ClassName, int] = dict.fromkeys(self._ranked, 0)
        self.others: dict[ClassName, float] = {}  # other replicas' demand per class (fleet.py)
        self.others_running = 0.0  # and the requests they run
        self.others_queued: dict[ClassName, float] = {}  # and those waiting
        self.others_rate = 0.0  # and the slots they see freed per second
        # and their tenants' requests running plus waiting, with each tenant's weight, per class
        self.others_tenants: dict[ClassName, dict[str, tuple[float, float]]] = {}
        self._tenant_running: dict[ClassName, dict[str, tuple[int, float]]] = {c: {} for c in self._ranked}
        self.slots = Slots(None)
        self.rate = StartRate(clock)
        self.guard = SloGuard(settings.slo_guard, settings.classes, clock)  # latency feedback (guard.py)

    # -- the hot path ---------------------------------------------------------------------------------

    async def admit(self, ticket: Ticket) -> None:
        """Returns once `ticket` holds a slot (release it with `release`), or raises the refusal."""
        self.slots = self._capacity()
        queue = self.queues[ticket.service]
        if self.slots.down:  # every deployment ejected: the router tries them anyway, as without admission
            self._start(ticket, queued=False)
            return
        if self.slots.total is None and not self.waiting():  # capacity unknown: never held
            self._start(ticket, queued=False)
            return
        queue.push(ticket)
        self._pump()
        if ticket.started is not None:
            return
        await self._wait(ticket, queue)

    def release(self, ticket: Ticket, tokens: int | None) -> None:
        """The request holding `ticket` ended; `tokens`: what it really used (None: its estimate stands)."""
        self.running[ticket.service] -= 1
        by_tenant = self._tenant_running[ticket.service]
        count, weight = by_tenant[ticket.tenant]
        if count > 1:
            by_tenant[ticket.tenant] = (count - 1, weight)
        else:
            del by_tenant[ticket.tenant]
        if tokens is not None:
            self.ledger.charge(ticket.tenant, tokens - ticket.cost, ticket.weight)
            self._metrics.served(self.alias, ticket, tokens)
        self.rate.tick()
        self._metrics.set_running(self.alias, ticket.service, self.running[ticket.service])
        if self.waiting():
            self._pump()

    # -- queueing -------------------------------------------------------------------------------------

    def expected_wait(self, service: ClassName) -> float:
        """Seconds until the requests ahead of one of `service` have started, at the fleet's measured rate of
        freed slots (0 while no rate is known yet: the request waits, at most its deadline)."""
        rate = (self.rate.per_s() or 0.0) + self.others_rate
        return self._ahead(service) / rate if rate > 0 else 0.0

    def release_rate(self) -> float:
        return self.rate.per_s() or 0.0

    async def _wait(self, ticket: Ticket, queue: ClassQueue) -> None:
        expected = self.expected_wait(ticket.service)
        if len(queue) > self._classes[ticket.service].max_queued:
            self._drop(ticket, queue, "queue_full")
            raise _saturated(self.alias, expected)
        if expected > ticket.deadline - self._clock():
            self._drop(ticket, queue, "deadline")
            raise _saturated(self.alias, expected - (ticket.deadline - self._clock()))
        ticket.future = asyncio.get_running_loop().create_future()
        self._metrics.set_queued(self.alias, ticket.service, len(queue))
        try:
            async with asyncio.timeout_at(self._loop_time(ticket.deadline)):
                await ticket.future
        except TimeoutError:
            if ticket.started is not None:  # started as the wait ran out: keep it
                return
            self._drop(ticket, queue, "expired")
            raise _saturated(self.alias, self.expected_wait(ticket.service) or 1.0) from None
        except UpstreamError:  # refused while waiting (the pool went down): already counted
            raise
        except BaseException:  # the client went away while waiting
            if ticket.started is not None:
                self.release(ticket, None)
            else:
                self._drop(ticket, queue, "cancelled")
            raise

    def _drop(self, ticket: Ticket, queue: ClassQueue, reason: str) -> None:
        queue.remove(ticket)
        self._metrics.set_queued(self.alias, ticket.service, len(queue))
        if reason != "cancelled":
            self._metrics.shed(self.alias, ticket, reason)

    def _loop_time(self, deadline: float) -> float:
        return asyncio.get_running_loop().time() + (deadline - self._clock())

    def _ahead(self, service: ClassName) -> float:
        """Requests that start before one of `service` joining now: waiting in its class or above, on every
        replica (the others' as last synced)."""
        rank = self._classes[service].rank
        classes = [c for c in self._ranked if self._classes[c].rank <= rank]
        return sum(len(self.queues[c]) + self.others_queued.get(c, 0.0) for c in classes)

    def waiting(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def tick(self) -> None:
        """Capacity may have changed by itself (a scrape, a breaker): start or refuse what waits."""
        if not self.waiting():
            return
        self.slots = self._capacity()
        if self.slots.down:
            for queue in self.queues.values():
                for ticket in queue.tickets():
                    self._drop(ticket, queue, "pool_down")
                    if ticket.future is not None and not ticket.future.done():
                        error = _refusal(503, f"No deployment of `{self.alias}` is available.",
                                         self.slots.retry_after_s)  # fmt: skip
                        ticket.future.set_exception(error)
            return
        self._pump()

    def _pump(self) -> None:
        for service in self._ranked:
            queue = self.queues[service]
            while queue and self._has_room(service):
                self._start(queue.pop(), queued=True)
            self._metrics.set_queued(self.alias, service, len(queue))

    def _has_room(self, service: ClassName) -> bool:
        total = self.slots.total
        if total is None:
            return True
        busy = self._busy(service)
        share = self._share(service)
        # whole slots: 90 % of 8 lets batch run 7, keeping one free; any class may use a pool's one slot
        fits = busy + 1 <= max(math.floor(total * share + 1e-9), min(total, 1.0))
        return fits and self.running[service] < self.allowance()[service]

    def _share(self, service: ClassName) -> float:
        """The class's `pool_share`, cut while a class above it misses its TTFT target (guard.py)."""
        return self._classes[service].pool_share * self.guard.factor[service]

    def holds(self, service: ClassName) -> bool:
        """A request of `service` runs on this replica or, as last synced, on another."""
        return self.running[service] > 0 or self._running_elsewhere(service) > 0

    def _running_elsewhere(self, service: ClassName) -> float:
        """The other replicas' requests of `service` holding a slot (their demand less their queue)."""
        return max(self.others.get(service, 0.0) - self.others_queued.get(service, 0.0), 0.0)

    def _busy(self, service: ClassName) -> float:
        """Slots in use that a request of `service` must find room beside: every running request, or, where
        the engines preempt by priority (Slots.preemptible), only those of its class and above on the whole
        fleet: a lower request's slot is the engine's to take back (it recomputes that request later)."""
        if not self.slots.preemptible:
            return sum(self.running.values()) + self.others_running
        above = self._at_or_above[service]
        others = sum(self._running_elsewhere(c) for c in above)
        return sum(self.running[c] for c in above) + others

    def allowance(self) -> dict[ClassName, float]:
        """This replica's part of each class's grant of the pool's slots (see the module docstring)."""
        total = self.slots.total
        used, parts = 0.0, {}
        for service in self._ranked:
            mine = self.running[service] + len(self.queues[service])
            fleet = mine + self.others.get(service, 0.0)
            cap = math.inf if total is None else total * self._share(service)
            grant = max(0.0, min(fleet, cap - used))
            used += grant
            if self._settings.fair and self.others_tenants.get(service):
                parts[service] = self._tenants_part(service, grant)
            else:
                parts[service] = grant * mine / fleet if fleet else 0.0
        return parts

    def _tenants_part(self, service: ClassName, grant: float) -> float:
        """What this replica's tenants get of `grant`'s whole slots shared between the fleet's tenants."""
        mine = self._class_demand(service)
        fleet = dict(self.others_tenants.get(service, {}))
        for tenant, (count, weight) in mine.items():
            other, other_weight = fleet.get(tenant, (0.0, weight))
            fleet[tenant] = (count + other, max(weight, other_weight))
        shares = whole_slot_shares(math.floor(grant + 1e-9), fleet, self.ledger.service(list(fleet)))
        return sum(shares.get(t, 0) * count / fleet[t][0] for t, (count, _) in mine.items() if count)

    def tenant_demand(self) -> dict[ClassName, dict[str, tuple[int, float]]]:
        """What this replica publishes for fair shares across the fleet: per class, each tenant's requests
        running plus waiting, and its weight."""
        return {service: self._class_demand(service) for service in self._ranked}

    def _class_demand(self, service: ClassName) -> dict[str, tuple[int, float]]:
        counts = dict(self._tenant_running[service])
        for tenant, (waiting, weight) in self.queues[service].waiting_by_tenant().items():
            counts[tenant] = (counts.get(tenant, (0, weight))[0] + waiting, weight)
        return counts

    def demand(self) -> dict[ClassName, int]:
        """What this replica publishes: per class, its requests running plus waiting."""
        return {c: self.running[c] + len(self.queues[c]) for c in self._ranked}

    def running_total(self) -> int:
        return sum(self.running.values())

    def queued(self) -> dict[ClassName, int]:
        return {c: len(self.queues[c]) for c in self._ranked}

    def _start(self, ticket: Ticket, queued: bool) -> None:
        ticket.started = self._clock()
        self.running[ticket.service] += 1
        by_tenant = self._tenant_running[ticket.service]
        by_tenant[ticket.tenant] = (by_tenant.get(ticket.tenant, (0, 0.0))[0] + 1, ticket.weight)
        self.ledger.charge(ticket.tenant, ticket.cost, ticket.weight)
        self._metrics.started(self.alias, ticket, ticket.started - ticket.arrived if queued else 0.0)
        self._metrics.set_running(self.alias, ticket.service, self.running[ticket.service])
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_result(None)


def _saturated(alias: str, retry_after_s: float) -> UpstreamError:
    return _refusal(
        429, f"The deployments of `{alias}` are saturated and this request could not start within its "
        "service class's queue deadline; retry after the time given.", retry_after_s, code="pool_saturated",
    )  # fmt: skip


def _refusal(status: int, message: str, retry_after_s: float, code: str | None = None) -> UpstreamError:
    return UpstreamError(status, message, retryable=True, code=code, retry_after_s=max(retry_after_s, 1.0))
