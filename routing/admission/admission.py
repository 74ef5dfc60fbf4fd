"""Admission by pool capacity, as the route stage uses it: one gate per model alias (gate.py).

    lease = await admission.enter(ctx, alias, policy)  # a slot, or a 429/503 UpstreamError
    ... the attempts (each carries lease.priority to engines that take one) ...
    await lease.follow(reply)  # released when the reply ends; TTFT and inter-token latency against the SLO

A tick every `tick_s` re-checks the pools that have requests waiting (capacity may grow by itself: a
scrape, a breaker closing), and the fleet sync (fleet.py) exchanges demand and served tokens with the
other gateway replicas.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from core.completion import requested_completion_tokens
from core.context import RequestContext
from core.reply import CLIENT_CLOSED, Ending, Reply
from core.usage import estimate_prompt_tokens
from routing.admission.capacity import CapacityEstimate, Slots
from routing.admission.config import AdmissionSettings, ClassName
from routing.admission.fair import ServiceLedger, Ticket
from routing.admission.gate import PoolGate
from routing.admission.metrics import AdmissionMetrics
from routing.config import RoutingPolicy
from routing.replica import Replica

TENANT_OF_MASTER = "master"


class Lease:
    """A request's slot in a pool: given back, and its SLO outcome counted, when its reply ends."""

    def __init__(self, admission: "Admission", gate: PoolGate, ticket: Ticket, ctx: RequestContext) -> None:
        self._admission = admission
        self._gate = gate
        self.ticket = ticket
        self._ctx = ctx
        self._first_token: float | None = None
        self._done = False
        self.priority = admission.settings.classes[ticket.service].rank

    async def follow(self, reply: Reply) -> None:
        if reply.stream is not None:
            reply.taps.append(self._tap)
        await reply.on_end(self._ended)

    def failed(self, cancelled: bool = False) -> None:
        """No reply: every attempt failed (its error goes to the client, or to a fallback alias), or the client
        left before any came (`cancelled`: judged as a stream cut before its first token)."""
        if not self._done:
            self._done = True
            self._gate.release(self.ticket, None)
            outcome = self._outcome(CLIENT_CLOSED, 0) if cancelled else "failed"
            self._admission.metrics.outcome(self._gate.alias, self.ticket, outcome)

    def _tap(self, chunk: dict[str, Any]) -> None:
        if self._first_token is None and _has_token(chunk):
            self._first_token = time.perf_counter()
            started = self._ctx.started_at or self._first_token
            self._gate.guard.observe_ttft(self.ticket.service, self._first_token - started)

    def _ended(self, ending: Ending) -> None:
        if self._done:
            return
        self._done = True
        usage = ending.usage
        self._gate.release(self.ticket, usage.prompt_tokens + usage.completion_tokens)
        outcome = self._outcome(ending.status, usage.completion_tokens)
        self._admission.metrics.outcome(self._gate.alias, self.ticket, outcome)
        if outcome in ("met", "missed") and self._first_token is None:  # a body: its whole answer counts
            self._gate.guard.observe(self.ticket.service, outcome == "met")

    def _outcome(self, status: int, tokens: int) -> str:
        """met / missed against the class's SLO; failed (an error); cancelled: the client left while its
        request still met the SLO. One that left after tokens came is judged on what it was sent so far,
        one that left before its first token missed only if it had waited longer than the TTFT target."""
        if status == 200:
            return self._slo(tokens)
        if status != CLIENT_CLOSED:
            return "failed"
        if self._first_token is not None:
            return self._slo(tokens)
        waited = time.perf_counter() - (self._ctx.started_at or time.perf_counter())
        return (
            "missed" if waited > self._admission.settings.classes[self.ticket.service].ttft_s else "cancelled"
        )

    def _slo(self, tokens: int) -> str:
        target = self._admission.settings.classes[self.ticket.service]
        now, started = time.perf_counter(), self._ctx.started_at or time.perf_counter()
        first = self._first_token if self._first_token is not None else now  # a body: its end
        gaps = max(tokens - 1, 0)
        if self._first_token is None:  # not streamed: the whole answer against TTFT + every gap's target
            return "met" if now - started <= target.ttft_s + gaps * target.itl_s else "missed"
        itl = (now - first) / gaps if gaps else 0.0
        return "met" if first - started <= target.ttft_s and itl <= target.itl_s else "missed"


class Admission:
    def __init__(
        self,
        settings: AdmissionSettings,
        pools: Callable[[], dict[str, list[Replica]]],
        metrics: AdmissionMetrics,
        stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._pools = pools
        self._clock = clock
        self._capacity = CapacityEstimate(stale_s, settings.kv_high, engine_queue=settings.engine_queue)
        self.gates: dict[str, PoolGate] = {}
        self._task: asyncio.Task[None] | None = None

    def service_of(self, policy: RoutingPolicy | None) -> tuple[ClassName, float]:
        service = (policy.service_class if policy else None) or self.settings.default_class
        return service, (policy.weight if policy else None) or 1.0

    async def enter(self, ctx: RequestContext, alias: str, policy: RoutingPolicy | None) -> Lease:
        service, weight = self.service_of(policy)
        now = self._clock()
        tenant = ctx.principal.tenant_id if ctx.principal is not None else TENANT_OF_MASTER
        cost = estimate_prompt_tokens(ctx.endpoint, ctx.body) + _answer_tokens(ctx.body, self.settings)
        deadline = now + self.settings.classes[service].queue_deadline_s
        ticket = Ticket(tenant, service, weight, float(cost), deadline, now)
        gate = self.gate(alias)
        await gate.admit(ticket)
        return Lease(self, gate, ticket, ctx)

    def gate(self, alias: str) -> PoolGate:
        gate = self.gates.get(alias)
        if gate is None:
            ledger = ServiceLedger(self.settings.share_window_s, clock=self._clock)
            gate = PoolGate(
                alias, self.settings, ledger, self.metrics, lambda: self._slots(alias), self._clock
            )
            self.gates[alias] = gate
        return gate

    def _slots(self, alias: str) -> Slots:
        slots = self._capacity.slots(self._pools().get(alias, []), self._clock())
        self.metrics.set_slots(alias, slots.total)
        return slots

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._ticks())

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            for alias, gate in list(self.gates.items()):
                gate.guard.adjust(gate.holds)  # a share that grew lets the tick below start what now fits
                self.metrics.set_share_factors(alias, gate.guard.factor)
                if gate.waiting():
                    gate.tick()
                else:
                    self._slots(alias)  # learn every scrape, not only when a request arrives

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _answer_tokens(body: dict[str, Any], settings: AdmissionSettings) -> int:
    asked = requested_completion_tokens(body)
    return asked if isinstance(asked, int) and asked > 0 else settings.answer_tokens_estimate


def _has_token(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls")):
            return True
    return False
