"""The last stage: pick a deployment for the alias, call it; retry and fall back before the first byte.

It also keeps two books of the request: the time spent here (ctx.upstream: whole calls with retries, or
the time to the first streamed chunk; observe subtracts it from the gateway overhead) and each attempt's
cost at its deployment's prices (ctx.cost_usd accumulates: a cascade's attempts are priced each at theirs).

Once a stream has yielded its first chunk the choice is final: a later upstream failure propagates as
an UpstreamError, which the SSE writer turns into an error event (no [DONE]) before closing.
"""

import asyncio
import math
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from backends.base import UpstreamError
from core.context import Handler, RequestContext
from core.errors import OpenAIError, model_not_found
from core.models import cost_usd
from core.reply import Ending, Reply, prepend
from core.tracing import attempt_span, queue_span
from core.usage import Usage, estimate_prompt_tokens
from core.validation import unrecognized
from routing.admission.admission import Admission, Lease
from routing.config import RoutingPolicy, RoutingSettings
from routing.policy import policy_section
from routing.replica import Replica
from routing.retry import backoff_s
from routing.router import Router


class RouteStage:
    def __init__(
        self, router: Router, rng: random.Random | None = None, admission: Admission | None = None
    ) -> None:
        self._router = router
        self._admission = admission  # None: requests go straight to the deployments (no queue)
        self._settings: RoutingSettings = router.settings
        self._metrics = router.metrics
        self._rng = rng or random.Random()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        started = time.perf_counter()
        try:
            return await self._route(ctx)
        finally:
            ctx.upstream.add(time.perf_counter() - started)

    async def _route(self, ctx: RequestContext) -> Reply:
        policy = policy_section(ctx.policy, "routing", RoutingPolicy) or self._settings.defaults
        if ctx.model not in self._router.pools:
            raise model_not_found(ctx.model)
        errors: list[UpstreamError] = []
        for alias in [ctx.model, *self._router.fallbacks(ctx.model, policy)]:
            if alias != ctx.model:
                if alias not in self._router.pools:
                    continue
                self._metrics.fallbacks.labels(ctx.model, alias).inc()
            try:
                return await self._serve(ctx, alias, policy, first=alias == ctx.model)
            except UpstreamError as error:
                if not error.retryable:
                    raise
                errors.append(error)
        raise _for_client(errors) or OpenAIError(503, f"No deployment of `{ctx.model}` is available.")

    async def _serve(self, ctx: RequestContext, alias: str, policy: RoutingPolicy, first: bool) -> Reply:
        """Tries the alias's deployments in the strategy's order, each at most as often as the others."""
        replicas = [r for r in self._router.pools[alias] if ctx.endpoint in r.backend.config.endpoints]
        if not replicas:
            if first:
                raise OpenAIError(400, f"The model `{alias}` does not support {ctx.endpoint}.", param="model")
            raise UpstreamError(503, f"fallback `{alias}` does not serve {ctx.endpoint}", retryable=True)
        # parameters beyond OpenAI's go only to deployments with extra_params: passthrough
        if ctx.extra_params:
            replicas = [r for r in replicas if r.backend.config.accepts_extras()]
            if not replicas:
                if first:
                    raise unrecognized(ctx.extra_params[0])
                raise UpstreamError(503, f"fallback `{alias}` takes no extra parameters", retryable=True)
        lease = None
        if self._admission is not None:
            with queue_span(ctx, alias):
                lease = await self._admission.enter(ctx, alias, policy)
        try:
            reply = await self._attempts(ctx, alias, policy, replicas, lease)
        except BaseException as error:
            if lease is not None:
                lease.failed(cancelled=isinstance(error, asyncio.CancelledError))  # the client left
            raise
        if lease is not None:
            await lease.follow(reply)
        return reply

    async def _attempts(
        self,
        ctx: RequestContext,
        alias: str,
        policy: RoutingPolicy,
        replicas: list[Replica],
        lease: Lease | None,
    ) -> Reply:
        priority = lease.priority if lease is not None else None
        order, hashes = self._router.plan(alias, replicas, ctx.endpoint, ctx.body, policy, priority)
        tries = dict.fromkeys((r.name for r in order), 0)
        error: UpstreamError | None = None
        for attempt in range(self._router.max_attempts(policy)):
            replica = self._next(order, tries)
            if replica is None:
                break
            if attempt and not replica.retry_budget.withdraw():
                self._metrics.retries_denied.labels(alias, replica.name).inc()
                break
            if attempt:
                self._metrics.retries.labels(alias, replica.name).inc()
                await asyncio.sleep(self._backoff(attempt))
            else:
                replica.retry_budget.deposit()
            tries[replica.name] += 1
            try:
                with attempt_span(ctx, replica.name, alias, attempt):
                    reply = await self._call(replica, ctx, lease, hashes)
            except UpstreamError as failure:
                if not failure.retryable:
                    raise
                self._honour_retry_after(replica, failure)
                error = failure
                continue
            if hashes:
                self._router.record_prefix(replica, hashes)
            return reply
        raise (
            self._cooling_error(replicas)
            or error
            or UpstreamError(503, f"no deployment of `{alias}` answered", retryable=True)
        )

    def _next(self, order: list[Replica], tries: dict[str, int]) -> Replica | None:
        """The first replica in order among those tried least, skipping any told to wait (Retry-After)."""
        now = self._router.clock()
        ready = [r for r in order if not r.cooling(now)]
        return min(ready, key=lambda r: tries[r.name]) if ready else None

    def _honour_retry_after(self, replica: Replica, failure: UpstreamError) -> None:
        if failure.retry_after_s is not None:
            wait = min(failure.retry_after_s, self._settings.retry_after_max_s)
            replica.cool_down(self._router.clock() + wait, _detached(failure, wait))

    def _cooling_error(self, replicas: list[Replica]) -> UpstreamError | None:
        """When every replica waits out a Retry-After: the soonest one's error, with the time left."""
        now = self._router.clock()
        cooling = [r for r in replicas if r.cooling(now) and r.cooled_by is not None]
        if len(cooling) < len(replicas) or not cooling:
            return None
        soonest = min(cooling, key=lambda r: r.not_before)
        return _detached(soonest.cooled_by, soonest.not_before - now)

    def _backoff(self, attempt: int) -> float:
        return backoff_s(attempt, self._settings.backoff_base_s, self._settings.backoff_max_s, self._rng)

    async def _call(
        self, replica: Replica, ctx: RequestContext, lease: Lease | None, hashes: list[bytes]
    ) -> Reply:
        priority = lease.priority if lease is not None and replica.backend.config.takes_priority() else None
        prefill = len(hashes) - self._router.prefixes.match(replica.name, hashes) if hashes else 0
        call = _Call(replica, self._router, self._first_byte_timeout(replica), priority, prefill)
        ctx.deployment = replica.name
        return await call.run(ctx)

    def _first_byte_timeout(self, replica: Replica) -> float | None:
        return self._settings.first_byte_timeouts.get(replica.name, self._settings.first_byte_timeout_s)


def _detached(error: UpstreamError, retry_after_s: float) -> UpstreamError:
    """A copy without the traceback (a replica keeps it for minutes: no request frames held)."""
    return UpstreamError(error.status, error.message, retryable=True, type=error.type, param=error.param,
                         code=error.code, retry_after_s=retry_after_s)  # fmt: skip


def _for_client(errors: list[UpstreamError]) -> UpstreamError | None:
    """The error a client sees when every alias failed: a Retry-After one (soonest) wins, else the last.

    Retry-After goes out in whole seconds, at least 1, as the rate limiter sends it.
    """
    waiting = [e for e in errors if e.retry_after_s is not None]
    if not waiting:
        return errors[-1] if errors else None
    error = min(waiting, key=lambda e: e.retry_after_s or 0.0)
    seconds = error.retry_after_s or 0.0
    error.headers["retry-after"] = str(max(1, math.ceil(seconds)))
    error.headers["retry-after-ms"] = str(max(1, math.ceil(seconds * 1000)))
    return error


class _Call:
    """One attempt on one replica: keeps its in-flight count, latency and breaker up to date."""

    def __init__(
        self, replica: Replica, router: Router, first_byte_timeout: float | None, priority: int | None,
        prefill_blocks: int = 0,
    ) -> None:  # fmt: skip
        self._replica = replica
        self._prefill = prefill_blocks  # its prompt's blocks the replica does not hold, until its first byte
        self._priority = priority  # the service class's rank, as vLLM's `priority` (lower runs first)
        self._router = router
        self._timeout = first_byte_timeout
        self._released = False

    async def run(self, ctx: RequestContext) -> Reply:
        self._begin()
        try:
            endpoint = self._endpoint(ctx)
            sent = ctx.body if self._priority is None else {**ctx.body, "priority": self._priority}
            if not ctx.stream:
                body = await self._replica.backend.complete(endpoint, sent, ctx.request_id)
                self._succeeded()
                ctx.usage = Usage.from_openai(body.get("usage"))
                self._charge(ctx)
                return Reply(body=body, usage=ctx.usage)
            chunks = self._replica.backend.stream(endpoint, sent, ctx.request_id)
            first = await self._first_chunk(chunks)
            self._prefilled()
            self._replica.latency.observe(self._router.clock() - self._started)
            reply = Reply(stream=prepend(first, chunks))
            await reply.on_end(lambda ending: self._stream_ended(ctx, ending))
            return reply
        except UpstreamError as error:
            self._failed(error, "before_first_byte")
            raise
        except BaseException:
            self._release()
            raise

    def _endpoint(self, ctx: RequestContext) -> str:
        """/v1/responses requests go to the upstream's own Responses API where the deployment has one."""
        native = ctx.api == "responses" and self._replica.backend.config.responses_api
        return "responses" if native else ctx.endpoint

    def _begin(self) -> None:
        self._started = self._router.clock()
        self._replica.outstanding += 1
        if self._prefill:
            pending = self._replica.pending_prefill
            pending[self._priority] = pending.get(self._priority, 0) + self._prefill
        self._replica.breaker.on_dispatch()
        self._router.metrics.set_outstanding(self._replica.name, self._replica.outstanding)

    async def _first_chunk(self, chunks: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(self._timeout):
                return await anext(chunks, None)
        except TimeoutError:
            await chunks.aclose()
            raise UpstreamError(504, f"deployment {self._replica.name} sent no first byte in time",
                                retryable=True) from None  # fmt: skip
        except UpstreamError as error:
            if error.retryable or error.status < 500:
                raise
            raise UpstreamError(error.status, error.message, retryable=True) from error  # nothing sent yet

    def _stream_ended(self, ctx: RequestContext, ending: Ending) -> None:
        ctx.usage = ending.usage
        if ending.status != 200 and not ctx.usage.prompt_tokens:  # cut short before the upstream's usage:
            ctx.usage.prompt_tokens = estimate_prompt_tokens(ctx.endpoint, ctx.body)  # the prompt was read
        self._charge(ctx)
        if ending.status == 200:
            self._replica.breaker.on_success()
        elif isinstance(ending.error, UpstreamError):
            self._failed(ending.error, "mid_stream")
        self._release()

    def _charge(self, ctx: RequestContext) -> None:
        """This attempt's tokens at its deployment's prices."""
        usage = ctx.usage
        ctx.cost_usd += cost_usd(
            self._replica.backend.config, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens
        )

    def _succeeded(self) -> None:
        self._replica.latency.observe(self._router.clock() - self._started)
        self._replica.breaker.on_success()
        self._release()

    def _failed(self, error: UpstreamError, stage: str) -> None:
        if error.status < 500:  # it answered: 4xx and 429 say nothing against its health
            self._replica.breaker.on_success()
        else:
            self._replica.breaker.on_failure()
            self._replica.latency.observe(self._router.clock() - self._started)
            self._router.metrics.failures.labels(self._replica.name, stage).inc()
        self._release()

    def _prefilled(self) -> None:
        if not self._prefill:  # nothing counted (not prefix-aware, all cached) or already taken back
            return
        pending = self._replica.pending_prefill
        left = pending.get(self._priority, 0) - self._prefill
        if left:
            pending[self._priority] = left
        else:
            pending.pop(self._priority, None)
        self._prefill = 0

    def _release(self) -> None:
        self._prefilled()
        if not self._released:
            self._released = True
            self._replica.outstanding -= 1
            self._router.metrics.set_outstanding(self._replica.name, self._replica.outstanding)
