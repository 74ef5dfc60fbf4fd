"""The rate-limit stage against the real Redis: headers, 429s, settlement of streams, budgets, failover."""

import asyncio
import gc

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from core.context import Reply, RequestContext, Usage
from core.errors import OpenAIError
from gateway.pipeline import chain
from policies.metrics import REDIS_FAILURES
from policies.policy import Budget, Limits, Policy
from policies.ratelimit.failover import FailoverLimiter
from policies.ratelimit.local_limiter import LocalLimiter
from policies.ratelimit.responses import duration
from policies.usage_query import aggregate_usage
from tests.policies_support import Database, make_settings, provision, redis_prefix_fixture, start  # noqa: F401
from tests.test_ratelimit_limiters import rpm


def chat(secret: str, text: str = "x" * 40, max_tokens: int = 50, stream: bool = False) -> RequestContext:
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
    headers = {"authorization": f"Bearer {secret}"}
    return RequestContext(
        request_id="r", endpoint="chat", body=body, headers=headers, model="m", stream=stream
    )


async def backend(ctx: RequestContext) -> Reply:
    """Stands in for the rest of the pipeline: real usage 20 + 10 tokens, cost $0.01."""
    ctx.usage, ctx.cost_usd, ctx.deployment = Usage(20, 10), 0.01, "d1"
    if not ctx.stream:
        return Reply(body={"ok": True})
    return Reply(stream=_chunks(ctx))


async def _chunks(ctx: RequestContext):
    for i in range(3):
        await asyncio.sleep(0)
        yield {"i": i}


def pipeline(services):
    async def terminal(ctx, call_next):
        return await backend(ctx)

    return chain([*services.stages, terminal])


@pytest.fixture
async def services(redis_prefix, tmp_path):
    started = await start(make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/t.db", None), redis_prefix))
    yield started
    await started.aclose()


async def test_headers_on_every_reply_and_openai_429(services):
    _, secret = await provision(services, Policy(key_limits=Limits(rpm=2, tpm=10_000)))
    handler = pipeline(services)
    first = await handler(chat(secret))
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 10_000 - (10 + 4 + 50)
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    await handler(chat(secret))
    with pytest.raises(OpenAIError) as refused:
        await handler(chat(secret))
    error = refused.value
    assert error.status == 429 and error.code == "rate_limit_exceeded" and error.type == "requests"
    assert 59 <= int(error.headers["retry-after"]) <= 60
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    assert secret not in error.message


async def test_errors_from_later_stages_carry_the_headers(services):
    _, secret = await provision(services, Policy(key_limits=Limits(rpm=5)))

    async def failing(ctx, call_next):
        raise OpenAIError(502, "upstream down")

    with pytest.raises(OpenAIError) as failed:
        await chain([*services.stages, failing])(chat(secret))
    assert failed.value.status == 502 and failed.value.headers["x-ratelimit-remaining-requests"] == "4"


async def test_tpm_settles_to_real_usage_after_a_stream(services):
    _, secret = await provision(services, Policy(key_limits=Limits(tpm=1000)))
    reply = await pipeline(services)(chat(secret, max_tokens=900, stream=True))
    assert reply.headers["x-ratelimit-remaining-tokens"] == str(1000 - 914)
    assert [c async for c in reply.stream] == [{"i": 0}, {"i": 1}, {"i": 2}]
    await services.ratelimit_stage.drain()  # without a concurrency slot, settlement runs in the background
    after = await pipeline(services)(chat(secret, max_tokens=100))
    assert after.headers["x-ratelimit-remaining-tokens"] == str(1000 - 30 - 114)


async def test_cancelled_stream_settles_what_was_produced_and_frees_its_slot(services):
    _, secret = await provision(services, Policy(key_limits=Limits(tpm=1000, max_concurrent=1)))

    async def endless(ctx, call_next):
        async def chunks():
            while True:
                ctx.usage = Usage(14, ctx.usage.completion_tokens + 1)
                yield {"delta": "x"}
                await asyncio.sleep(0)

        return Reply(stream=chunks())

    handler = chain([*services.stages, endless])
    reply = await handler(chat(secret, max_tokens=900, stream=True))
    with pytest.raises(OpenAIError):  # one in flight: the concurrency limit holds
        await handler(chat(secret, stream=True))
    iterator = reply.stream.__aiter__()
    for _ in range(5):
        await iterator.__anext__()
    await iterator.aclose()  # the client went away
    second = await handler(chat(secret, max_tokens=100, stream=True))
    assert second.headers["x-ratelimit-remaining-tokens"] == str(1000 - (14 + 5) - 114)
    await second.stream.aclose()


async def test_budget_exhaustion_is_insufficient_quota_and_usage_is_recorded(services):
    key_id, secret = await provision(services, Policy(key_budget=Budget(usd_per_day=0.025)))
    handler = pipeline(services)
    for _ in range(3):
        await handler(chat(secret))  # $0.01 each; the third starts at $0.02 < $0.025
        await services.ratelimit_stage.drain()  # spend is added off the reply's path
    with pytest.raises(OpenAIError) as refused:
        await handler(chat(secret))
    assert refused.value.status == 429
    assert refused.value.type == "insufficient_quota" and refused.value.code == "insufficient_quota"
    assert int(refused.value.headers["retry-after"]) <= 86_400
    await services.usage.flush()
    rows = await aggregate_usage(services.engine, ["key_id", "deployment"])
    assert rows == [
        {
            "key_id": key_id,
            "deployment": "d1",
            "requests": 3,
            "prompt_tokens": 60,
            "completion_tokens": 30,
            "cached_tokens": 0,
            "cost_usd": pytest.approx(0.03),
            "avg_latency_ms": 0.0,
        }
    ]


class FlakyLimiter:
    """Wraps a limiter; raises Redis connection errors while `broken`."""

    def __init__(self, inner) -> None:
        self.inner, self.broken, self.calls = inner, True, 0
        self.replay_broken = False  # Redis answers admissions but a replay was lost (still reconnecting)
        self.replayed: list[str] = []  # members Redis confirmed as replayed

    async def admit(self, member, buckets):
        self.calls += 1
        if self.broken:
            raise RedisConnectionError("down")
        return await self.inner.admit(member, buckets)

    async def settle(self, *args):
        return await self.inner.settle(*args)

    async def replay(self, admitted):
        if self.broken or self.replay_broken:
            raise RedisConnectionError("down")
        self.replayed += [entry.member for entry in admitted]
        await self.inner.replay(admitted)

    async def seed_spend(self, spends):
        return None


async def test_fail_open_uses_local_limits_counts_and_recovers():
    primary = FlakyLimiter(LocalLimiter(60, 60))
    limiter = FailoverLimiter(primary, LocalLimiter(60, 60), "open", retry_s=0.2)
    before = REDIS_FAILURES.labels(operation="admit", mode="open")._value.get()
    assert [(await limiter.admit(str(i), [rpm(2)])).admitted for i in range(3)] == [True, True, False]
    assert REDIS_FAILURES.labels(operation="admit", mode="open")._value.get() == before + 1
    assert primary.calls == 1  # later calls skip Redis for retry_s
    primary.broken = False
    await asyncio.sleep(0.25)
    assert (await limiter.admit("again", [rpm(2)])).admitted
    assert primary.calls == 2


async def test_an_outage_is_forgotten_only_once_redis_has_counted_it():
    """Redis back, but the replay of the outage's admissions lost: no one is admitted past the limit (an
    outside audit saw 6 more of an rpm of 10 admitted after a Redis restart)."""
    inner = LocalLimiter(60, 60)
    primary = FlakyLimiter(inner)
    limiter = FailoverLimiter(primary, LocalLimiter(60, 60), "open", retry_s=0.05)
    assert [(await limiter.admit(f"down{i}", [rpm(3)])).admitted for i in range(3)] == [True] * 3
    primary.broken, primary.replay_broken = False, True
    await asyncio.sleep(0.06)
    assert not (await limiter.admit("while-replay-fails", [rpm(3)])).admitted
    assert primary.replayed == []
    primary.replay_broken = False
    await asyncio.sleep(0.06)
    assert (
        await limiter.admit("after-replay", [rpm(3)])
    ).admitted  # (the stand-in for Redis counts no replays)
    assert primary.replayed == ["down0", "down1", "down2"]  # kept through the lost replay, then written
    await limiter.admit("later", [rpm(3)])
    assert primary.replayed == ["down0", "down1", "down2"]  # and forgotten once Redis confirmed them


async def test_fail_closed_answers_503():
    limiter = FailoverLimiter(FlakyLimiter(LocalLimiter(60, 60)), LocalLimiter(60, 60), "closed", retry_s=1)
    with pytest.raises(OpenAIError) as refused:
        await limiter.admit("a", [rpm(2)])
    assert refused.value.status == 503


async def test_unreachable_redis_fails_open_on_the_real_client(tmp_path):
    settings = make_settings(Database(f"sqlite+aiosqlite:///{tmp_path}/t.db", None), "llmgw-test:down:")
    settings.redis_url = "redis://127.0.0.1:1/0"
    services = await start(settings)
    try:
        _, secret = await provision(services, Policy(key_limits=Limits(rpm=1)))
        assert (await pipeline(services)(chat(secret))).headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(OpenAIError) as refused:
            await pipeline(services)(chat(secret))
        assert refused.value.status == 429
    finally:
        await services.aclose()


async def test_per_model_limits_apply_to_that_model_only(services):
    policy = Policy(tenant_limits=Limits(rpm=100), model_limits={"m": Limits(rpm=1)})
    _, secret = await provision(services, policy)
    handler = pipeline(services)
    first = await handler(chat(secret))
    assert first.headers["x-ratelimit-remaining-requests"] == "0"  # the tightest bucket: model m
    with pytest.raises(OpenAIError) as refused:
        await handler(chat(secret))
    assert "model m" in refused.value.message
    other = chat(secret)
    other.model = other.body["model"] = "other"
    assert (await handler(other)).headers["x-ratelimit-remaining-requests"] == "98"


def test_reset_durations_use_openais_format():
    cases = {0.02: "20ms", 1.5: "1.5s", 2.0: "2s", 59.94: "59.9s", 59.97: "1m0s", 360.4: "6m0s"}
    assert {seconds: duration(seconds) for seconds in cases} == cases


async def test_stream_dropped_before_its_first_chunk_still_frees_its_slot(services):
    _, secret = await provision(services, Policy(key_limits=Limits(max_concurrent=1)))
    handler = pipeline(services)
    reply = await handler(chat(secret, stream=True))
    with pytest.raises(OpenAIError):
        await handler(chat(secret, stream=True))
    del reply  # the client left before the body started: nobody iterates or closes the stream
    gc.collect()
    await asyncio.sleep(0.05)
    second = await handler(chat(secret, stream=True))
    assert [c async for c in second.stream] == [{"i": 0}, {"i": 1}, {"i": 2}]
