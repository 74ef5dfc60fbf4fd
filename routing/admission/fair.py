"""Who goes next within a class: weighted fair sharing of served tokens between tenants.

Each tenant's service is the tokens it was served over the last `window_s` seconds divided by its weight
(a sliding window in buckets). A class's queue hands out the oldest request of the tenant with the least
service, so backlogged tenants' served tokens converge to their weights' proportions (least attained
service, weighted; the same rule as WFQ's virtual time while both are backlogged, without its credit for
idle time: an idle tenant's window simply empties). A request is charged its estimated tokens when it
starts and corrected to its real usage when it ends. With gateway replicas sharing Redis, each replica's
window is published and the others' are added (routing/admission/fleet.py), so shares hold fleet-wide.

`fair=False` is first come, first served within the class, kept to measure what fairness buys.
"""

import asyncio
import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from routing.admission.config import ClassName


@dataclass(eq=False)
class Ticket:
    """One request asking a pool for a slot."""

    tenant: str
    service: ClassName
    weight: float
    cost: float  # estimated tokens (prompt + answer)
    deadline: float  # clock time by which it must start
    arrived: float
    future: "asyncio.Future[None] | None" = field(default=None, repr=False)
    started: float | None = None  # when it got its slot


class ServiceLedger:
    """Weighted tokens served per tenant over a sliding window; `others` holds the other replicas' sums."""

    def __init__(
        self, window_s: float, buckets: int = 10, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._width = window_s / buckets
        self._buckets = buckets
        self._clock = clock
        self._window: dict[int, dict[str, float]] = {}
        self.others: dict[str, float] = {}

    def charge(self, tenant: str, tokens: float, weight: float) -> None:
        bucket = self._bucket()
        slot = self._window.get(bucket)
        if slot is None:  # a new bucket: the ones out of the window go
            self._prune(bucket)
            slot = self._window[bucket] = {}
        slot[tenant] = slot.get(tenant, 0.0) + tokens / weight

    def _prune(self, bucket: int) -> None:
        for stale in [b for b in self._window if b <= bucket - self._buckets]:
            del self._window[stale]

    def local(self) -> dict[str, float]:
        """This replica's weighted tokens per tenant over the window (what it publishes)."""
        self._prune(self._bucket())
        totals: dict[str, float] = {}
        for slot in self._window.values():
            for tenant, amount in slot.items():
                totals[tenant] = totals.get(tenant, 0.0) + amount
        return totals

    def service(self, tenants: list[str]) -> dict[str, float]:
        mine = self.local()
        return {t: mine.get(t, 0.0) + self.others.get(t, 0.0) for t in tenants}

    def _bucket(self) -> int:
        return math.floor(self._clock() / self._width)


class ClassQueue:
    """The waiting requests of one class at one pool."""

    def __init__(self, fair: bool, ledger: ServiceLedger) -> None:
        self._fair = fair
        self._ledger = ledger
        self._by_tenant: dict[str, deque[Ticket]] = {}
        self._fifo: deque[Ticket] = deque()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, ticket: Ticket) -> None:
        if self._fair:
            self._by_tenant.setdefault(ticket.tenant, deque()).append(ticket)
        else:
            self._fifo.append(ticket)
        self._count += 1

    def pop(self) -> Ticket:
        """The next request to start (the queue must not be empty)."""
        self._count -= 1
        if not self._fair:
            return self._fifo.popleft()
        service = self._ledger.service(list(self._by_tenant))
        tenant = min(self._by_tenant, key=lambda t: (service[t], self._by_tenant[t][0].arrived))
        waiting = self._by_tenant[tenant]
        ticket = waiting.popleft()
        if not waiting:
            del self._by_tenant[tenant]
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        """Take out a request that gave up (deadline, client gone); False if it had already left."""
        waiting = self._by_tenant.get(ticket.tenant) if self._fair else self._fifo
        if waiting is None or ticket not in waiting:
            return False
        waiting.remove(ticket)
        if self._fair and not waiting:
            del self._by_tenant[ticket.tenant]
        self._count -= 1
        return True

    def waiting_by_tenant(self) -> dict[str, tuple[int, float]]:
        """Requests waiting per tenant, with its weight (fair mode; FIFO keeps no tenants apart: empty)."""
        return {tenant: (len(waiting), waiting[0].weight) for tenant, waiting in self._by_tenant.items()}

    def tickets(self) -> list[Ticket]:
        if not self._fair:
            return list(self._fifo)
        return [t for waiting in self._by_tenant.values() for t in waiting]


def whole_slot_shares(
    slots: int, demands: dict[str, tuple[float, float]], served: dict[str, float]
) -> dict[str, int]:
    """`slots` whole slots shared between tenants asking (demand, weight), weighted max-min: one at a time to
    the tenant holding the fewest per unit of weight among those still asking, ties to the one served the
    fewest weighted tokens (`served`, the share window's), so where the weights cannot divide the slots
    exactly (2 : 1 of 7) the odd slot goes to whoever is behind and the served tokens keep the weights'
    proportions over time."""
    shares = {t: 0 for t, (d, _) in demands.items() if d > 0}
    # a heap of (slots per unit of weight, served, tenant): only the tenant just given a slot changes its key
    heap = [(0.0, served.get(t, 0.0), t) for t in shares]
    heapq.heapify(heap)
    for _ in range(slots):
        if not heap:
            break
        _, done, tenant = heapq.heappop(heap)
        shares[tenant] += 1
        demand, weight = demands[tenant]
        if shares[tenant] < demand:
            heapq.heappush(heap, (shares[tenant] / max(weight, 1e-9), done, tenant))
    return shares
