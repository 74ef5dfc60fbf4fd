"""Semantic cache with the real MiniLM model, FAISS and the shipped verifier: paraphrases hit, hard
negatives and other tenants or contexts do not; a hit reported wrong is evicted; two replicas sharing
the real Redis see each other's entries (and verify them)."""

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from cache.config import CachePolicy, CacheSettings
from cache.embedder import SentenceEmbedder
from cache.encoder import build_encoder
from cache.redis_store import RedisStore
from cache.service import CacheService
from cache.store import MemoryStore
from cache.vector_index import SemanticIndex
from cache.verifier import load_verifier
from tests.cache_helpers import Upstream, ctx_for, drain, pipeline

SETTINGS = CacheSettings(sweep_interval_s=3600, defaults=CachePolicy(semantic="static"))


@pytest.fixture(scope="module")
def embedder():
    verifier = load_verifier()  # questions in the form its weights were trained on, as the gateway does
    normalise = verifier is not None and verifier.normalise_text
    return SentenceEmbedder(build_encoder(None, SETTINGS.torch_threads, onnx=False, normalise_text=normalise))


def semantic_service(embedder, store) -> CacheService:
    return CacheService(
        SETTINGS, store, SemanticIndex(embedder.dim, SETTINGS.index), embedder, load_verifier()
    )


@pytest.fixture
async def cache(embedder):
    service = semantic_service(embedder, MemoryStore())
    await service.start()
    yield service
    await service.aclose()


async def ask(service, upstream, **kwargs):
    ctx = ctx_for(**kwargs)
    reply = await pipeline(service, upstream)(ctx)
    if reply.stream is not None:
        await drain(reply)
    await service.settle()
    return ctx, reply


async def test_a_paraphrase_is_a_semantic_hit(cache):
    upstream = Upstream()
    await ask(cache, upstream, question="What is the capital of France?")
    ctx, reply = await ask(cache, upstream, question="What's the capital of France?")
    assert reply.headers["x-cache-status"] == "semantic-hit" and upstream.calls == 1
    assert SETTINGS.defaults.similarity_threshold <= float(reply.headers["x-cache-similarity"]) <= 1.0
    assert 0.0 < float(reply.headers["x-cache-verifier"]) <= 1.0
    assert ctx.cache.saved_completion_tokens == 7


@pytest.mark.parametrize(
    "negative",
    [
        "What is the capital of Germany?",  # entity
        "What is not the capital of France?",  # negation
        "What is the capital of France? Answer in French.",  # constraint
        "What is the former capital of France?",  # scope
        "What is the largest city of France?",  # intent
    ],
)
async def test_hard_negatives_miss(cache, negative):
    upstream = Upstream()
    await ask(cache, upstream, question="What is the capital of France?")
    _, reply = await ask(cache, upstream, question=negative)
    assert reply.headers["x-cache-status"] == "miss"


async def test_a_hit_reported_wrong_by_header_is_evicted_and_answered_fresh(cache):
    upstream = Upstream()
    await ask(cache, upstream, question="What is the capital of France?")
    _, hit = await ask(cache, upstream, question="What's the capital of France?")
    assert hit.headers["x-cache-status"] == "semantic-hit"
    headers = {"x-cache-feedback": "wrong"}
    _, fresh = await ask(cache, upstream, question="What's the capital of France?", headers=headers)
    assert fresh.headers["x-cache-status"] == "miss" and upstream.calls == 2
    assert len(cache.index) == 1  # the wrong entry went; the fresh answer was stored
    _, again = await ask(cache, upstream, question="What is the capital of France?")
    assert again.headers["x-cache-status"] == "semantic-hit" and upstream.calls == 2  # served the fresh one


async def test_a_hit_reported_wrong_through_the_admin_api_is_evicted(cache):
    upstream = Upstream()
    await ask(cache, upstream, question="How tall is Mount Everest?")
    ctx, hit = await ask(cache, upstream, question="What is the height of Mount Everest?")
    assert hit.headers["x-cache-status"] == "semantic-hit"
    assert await cache.feedback(ctx.request_id) and not await cache.feedback(ctx.request_id)
    _, again = await ask(cache, upstream, question="What is the height of Mount Everest?")
    assert again.headers["x-cache-status"] == "miss" and len(cache.index) == 1 and upstream.calls == 2


async def test_swapped_arguments_miss_even_at_high_similarity(cache):
    upstream = Upstream()
    await ask(cache, upstream, question="Is Paris larger than London?")
    _, reply = await ask(cache, upstream, question="Is London larger than Paris?")
    assert reply.headers["x-cache-status"] == "miss"


async def test_no_semantic_hit_across_tenants_even_for_near_identical_prompts(cache):
    upstream = Upstream()
    await ask(cache, upstream, tenant="acme", question="What is the capital of France?")
    for tenant in ("acme ", "ACME", "acme\x00", "globex"):
        _, reply = await ask(cache, upstream, tenant=tenant, question="What is the capital of France?")
        assert reply.headers["x-cache-status"] == "miss", tenant
    assert upstream.calls == 5


async def test_same_question_under_another_system_prompt_misses(cache):
    upstream = Upstream()
    await ask(cache, upstream, system="Answer in French.", question="What is the capital of France?")
    _, reply = await ask(
        cache, upstream, system="Answer in German.", question="What's the capital of France?"
    )
    assert reply.headers["x-cache-status"] == "miss"
    _, same = await ask(cache, upstream, system="Answer in French.", question="What's the capital of France?")
    assert same.headers["x-cache-status"] == "semantic-hit"


async def test_other_parameters_are_another_namespace(cache):
    upstream = Upstream()
    await ask(cache, upstream, question="What is the capital of France?", max_tokens=5)
    _, reply = await ask(cache, upstream, question="What's the capital of France?", max_tokens=500)
    assert reply.headers["x-cache-status"] == "miss"


async def test_semantic_hit_streams(cache):
    upstream = Upstream(text="Paris")
    await ask(cache, upstream, question="What is the capital of France?")
    ctx = ctx_for(question="What's the capital of France?", stream=True)
    reply = await pipeline(cache, upstream)(ctx)
    chunks = await drain(reply)
    assert reply.headers["x-cache-status"] == "semantic-hit"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "usage" in chunks[-1]


@pytest.fixture
async def redis_pair(embedder):
    prefix = f"llmgw-test:{uuid.uuid4().hex[:8]}"
    clients = [Redis.from_url("redis://127.0.0.1:6379/0") for _ in range(2)]
    services = []
    try:
        yield clients, prefix, services
    finally:
        for service in services:
            await service.aclose()
        async for key in clients[0].scan_iter(match=f"{prefix}:*"):
            await clients[0].delete(key)
        for client in clients:
            await client.aclose()


async def start_replica(embedder, client, prefix) -> CacheService:
    service = semantic_service(embedder, RedisStore(client, prefix))
    await service.store.start(service.index)
    return service


async def test_two_replicas_share_entries_and_follow_each_other(embedder, redis_pair):
    clients, prefix, services = redis_pair
    first = await start_replica(embedder, clients[0], prefix)
    services.append(first)
    upstream = Upstream()
    await ask(first, upstream, question="How tall is Mount Everest?")
    second = await start_replica(embedder, clients[1], prefix)  # loads what is already there
    services.append(second)
    _, reply = await ask(second, upstream, question="What is the height of Mount Everest?")
    assert reply.headers["x-cache-status"] == "semantic-hit"
    await ask(second, upstream, question="How do I reverse a list in Python?")  # followed by the first
    for _ in range(50):
        if len(first.index) == 2:
            break
        await asyncio.sleep(0.05)
    _, reply = await ask(first, upstream, question="What's the way to reverse a Python list?")
    assert reply.headers["x-cache-status"] == "semantic-hit" and upstream.calls == 2


async def test_flush_on_one_replica_empties_the_other_index(embedder, redis_pair):
    clients, prefix, services = redis_pair
    first, second = [await start_replica(embedder, c, prefix) for c in clients]
    services += [first, second]
    upstream = Upstream()
    await ask(first, upstream, question="How tall is Mount Everest?")
    assert await second.flush(tenant_id="acme", model="small") == 1
    for _ in range(50):
        if len(first.index) == 0:
            break
        await asyncio.sleep(0.05)
    assert len(first.index) == 0
    _, reply = await ask(first, upstream, question="How tall is Mount Everest?")
    assert reply.headers["x-cache-status"] == "miss"


async def test_a_replica_started_while_redis_is_away_loads_the_index_when_it_returns(embedder, tmp_path):
    """Start-up does not wait for Redis (an outside audit: the gateway exited); the index fills once it answers."""
    from tests.redis_servers import RedisServer

    server = RedisServer(16388, tmp_path)  # not started yet
    client = Redis.from_url(server.url)
    replica = await start_replica(embedder, client, "llmgw-test:late")  # no exception: Redis is away
    try:
        server.start()
        writer = Redis.from_url(server.url)
        other = await start_replica(embedder, writer, "llmgw-test:late")
        await ask(other, Upstream(), question="How tall is Mount Everest?")
        for _ in range(100):
            if len(replica.index) == 1:
                break
            await asyncio.sleep(0.05)
        assert len(replica.index) == 1
        await other.aclose()
        await writer.aclose()
    finally:
        await replica.aclose()
        await client.aclose()
        server.kill()
