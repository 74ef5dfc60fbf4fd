"""Exact cache through the stages: hits, opt-outs, tenant isolation, streaming replay and storage rules."""

import time

import pytest

from cache.service import CacheService
from cache.store import MemoryStore
from core.errors import OpenAIError
from tests.cache_helpers import Policy, Upstream, ctx_for, drain, pipeline, settings


@pytest.fixture
async def cache():
    service = CacheService(settings(), MemoryStore())
    await service.start()
    yield service
    await service.aclose()


async def ask(service, upstream, **kwargs):
    ctx = ctx_for(**kwargs)
    reply = await pipeline(service, upstream)(ctx)
    chunks = await drain(reply) if reply.stream is not None else None
    await service.settle()
    return ctx, reply, chunks


async def test_second_identical_request_is_an_exact_hit_with_saved_tokens(cache):
    upstream = Upstream()
    _, first, _ = await ask(cache, upstream)
    ctx, second, _ = await ask(cache, upstream)
    assert first.headers["x-cache-status"] == "miss"
    assert second.headers["x-cache-status"] == "hit" and ctx.cache_status == "hit"
    assert upstream.calls == 1
    assert second.body["choices"] == first.body["choices"]
    assert ctx.cache.saved_prompt_tokens == 12
    assert ctx.cache.saved_completion_tokens == 7
    assert ctx.cache.saved_cost_usd == pytest.approx(0.002)
    assert ctx.usage.total_tokens == 0


async def test_no_hit_across_tenants(cache):
    upstream = Upstream()
    await ask(cache, upstream, tenant="acme")
    ctx, reply, _ = await ask(cache, upstream, tenant="globex")
    assert reply.headers["x-cache-status"] == "miss" and upstream.calls == 2


async def test_nondeterministic_requests_bypass_unless_the_policy_widens(cache):
    upstream = Upstream()
    for _ in range(2):
        _, reply, _ = await ask(cache, upstream, temperature=0.7)
    assert reply.headers["x-cache-status"] == "bypass" and upstream.calls == 2
    wide = Policy(cache_nondeterministic=True)
    for _ in range(2):
        _, reply, _ = await ask(cache, upstream, temperature=0.7, policy=wide)
    assert reply.headers["x-cache-status"] == "hit" and upstream.calls == 3


async def test_seed_makes_a_request_cacheable(cache):
    upstream = Upstream()
    await ask(cache, upstream, temperature=1.0, seed=7)
    _, reply, _ = await ask(cache, upstream, temperature=1.0, seed=7)
    assert reply.headers["x-cache-status"] == "hit"


@pytest.mark.parametrize(
    ("headers", "options", "stored", "status"),
    [
        ({"cache-control": "no-cache"}, None, True, "bypass"),
        ({"cache-control": "no-store"}, None, False, "miss"),
        (None, {"cache": {"no_cache": True}}, True, "bypass"),
        (None, {"cache": {"no_store": True}}, False, "miss"),
        ({"cache-control": "no-cache, no-store"}, None, False, "bypass"),
    ],
)
async def test_request_opt_outs(cache, headers, options, stored, status):
    upstream = Upstream()
    _, reply, _ = await ask(cache, upstream, headers=headers, options=options)
    assert reply.headers["x-cache-status"] == status
    _, again, _ = await ask(cache, upstream)
    assert (again.headers["x-cache-status"] == "hit") == stored


async def test_no_cache_still_refreshes_the_entry(cache):
    upstream = Upstream()
    await ask(cache, upstream)
    _, fresh, _ = await ask(cache, upstream, headers={"cache-control": "no-cache"})
    _, hit, _ = await ask(cache, upstream)
    assert hit.body["choices"] == fresh.body["choices"] and upstream.calls == 2


async def test_a_malformed_cache_option_is_a_400(cache):
    with pytest.raises(OpenAIError) as caught:
        await ask(cache, Upstream(), options={"cache": {"no_cache": "yes"}})
    assert caught.value.status == 400 and caught.value.param == "cache"


async def test_streaming_hit_replays_a_well_formed_stream(cache):
    upstream = Upstream(text="one two three")
    _, _, original = await ask(cache, upstream, stream=True)
    ctx, reply, chunks = await ask(cache, upstream, stream=True)
    assert reply.headers["x-cache-status"] == "hit" and upstream.calls == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "one two three #1 "
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7
    assert len({c["id"] for c in chunks}) == 1


async def test_streamed_answer_serves_a_json_request_and_vice_versa(cache):
    upstream = Upstream(text="alpha beta")
    await ask(cache, upstream, stream=True)
    _, reply, _ = await ask(cache, upstream)
    assert reply.body["object"] == "chat.completion"
    assert reply.body["choices"][0]["message"] == {"role": "assistant", "content": "alpha beta #1 "}
    _, streamed, chunks = await ask(cache, upstream, question="Other?", stream=False)
    assert streamed.body is not None
    _, replay, chunks = await ask(cache, upstream, question="Other?", stream=True)
    assert replay.headers["x-cache-status"] == "hit" and chunks[-2]["choices"][0]["finish_reason"] == "stop"


async def test_cut_streams_are_never_stored(cache):
    upstream = Upstream(text="a b c")
    upstream.fail_mid_stream = True
    with pytest.raises(ConnectionError):
        await ask(cache, upstream, stream=True)
    upstream.fail_mid_stream = False
    _, reply, _ = await ask(cache, upstream, stream=True)
    assert reply.headers["x-cache-status"] == "miss"


async def test_a_stream_the_client_abandons_is_not_stored(cache):
    upstream = Upstream(text="a b c d")
    reply = await pipeline(cache, upstream)(ctx_for(stream=True))
    await reply.stream.__anext__()
    await reply.stream.aclose()
    await cache.settle()
    _, again, _ = await ask(cache, upstream, stream=True)
    assert again.headers["x-cache-status"] == "miss"


@pytest.mark.parametrize("stream", [False, True])
async def test_truncated_answers_are_stored_only_when_the_policy_says_so(cache, stream):
    upstream = Upstream(finish="length")
    await ask(cache, upstream, stream=stream)
    _, reply, _ = await ask(cache, upstream, stream=stream)
    assert reply.headers["x-cache-status"] == "miss"
    allow = Policy(store_truncated=True)
    await ask(cache, upstream, stream=stream, policy=allow, question="Q2")
    _, reply, _ = await ask(cache, upstream, stream=stream, policy=allow, question="Q2")
    assert reply.headers["x-cache-status"] == "hit"


async def test_error_replies_are_not_stored(cache):
    class Failing(Upstream):
        async def __call__(self, ctx):
            reply = await super().__call__(ctx)
            reply.status = 500
            return reply

    upstream = Failing()
    await ask(cache, upstream)
    await ask(cache, upstream)
    assert upstream.calls == 2


async def test_entries_expire_after_their_ttl(cache):
    upstream = Upstream()
    short = Policy(ttl_s=1)
    await ask(cache, upstream, policy=short)
    entry = next(iter(cache.store._by_tenant["acme"].values()))
    entry.expires_at = time.time() - 0.01
    _, reply, _ = await ask(cache, upstream, policy=short)
    assert reply.headers["x-cache-status"] == "miss"


async def test_size_limit_per_tenant_drops_the_least_recently_used(cache):
    upstream = Upstream()
    small = Policy(max_entries=2)
    for question in ("Q1", "Q2", "Q3"):
        await ask(cache, upstream, question=question, policy=small)
    _, q1, _ = await ask(cache, upstream, question="Q1", policy=small)
    _, q3, _ = await ask(cache, upstream, question="Q3", policy=small)
    assert q1.headers["x-cache-status"] == "miss" and q3.headers["x-cache-status"] == "hit"


async def test_flush_by_tenant_and_model(cache):
    upstream = Upstream()
    await ask(cache, upstream, tenant="acme")
    await ask(cache, upstream, tenant="globex")
    assert await cache.flush(tenant_id="acme") == 1
    _, acme, _ = await ask(cache, upstream, tenant="acme")
    _, globex, _ = await ask(cache, upstream, tenant="globex")
    assert acme.headers["x-cache-status"] == "miss" and globex.headers["x-cache-status"] == "hit"
    assert await cache.flush(model="small") == 2
    assert await cache.flush(model="small") == 0


async def test_a_flush_the_store_cannot_take_is_a_503_to_retry():
    """The admin API's flush while Redis is down: a 503 with Retry-After, not a 500 (outside audit)."""

    class Unreachable(MemoryStore):
        async def flush(self, tenant_id=None, model=None):
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    service = CacheService(settings(), Unreachable())
    with pytest.raises(OpenAIError) as error:
        await service.flush("tenant-a")
    assert error.value.status == 503 and error.value.headers["retry-after"] == "1"
    assert "6390" not in error.value.message  # the store's address stays in the log
