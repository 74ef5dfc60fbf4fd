"""What an admission is made of, cached where it can be: the plan (policies/ratelimit/plan.py) and the
limiter's key names, built once per key, policy and model, yet every request gets its own reservation,
budget periods and a reloaded policy's limits; the rate-limit headers; the budget reservation's price."""

from datetime import UTC, datetime

from core.context import Principal
from core.models import ModelConfig
from policies.policy import Budget, Limits, Policy
from policies.ratelimit import redis_limiter
from policies.ratelimit.buckets import Bucket, BucketState, Decision
from policies.ratelimit.factory import cost_estimator
from policies.ratelimit.plan import PlanCache
from policies.ratelimit.redis_limiter import RedisLimiter
from policies.ratelimit.resp import RespPool
from policies.ratelimit.responses import rate_headers

KEY = Principal(tenant_id="acme", key_id="key_1", key_prefix="sk-1")
NOW = datetime(2026, 12, 3, 22, 0, tzinfo=UTC)


def test_each_request_reserves_its_own_tokens_and_cost():
    policy = Policy(
        key_limits=Limits(rpm=10, tpm=1000),
        tenant_limits=Limits(max_concurrent=3),
        tenant_budget=Budget(usd_per_day=5.0),
    )
    plans = PlanCache()
    first = plans.get(KEY, policy, "m").buckets(120, NOW, 0.25)
    second = plans.get(KEY, policy, "m").buckets(7, NOW, 0.5)
    assert first == [
        Bucket("requests", "k:key_1:rpm", "acme", 10, 1, "key key_1"),
        Bucket("tokens", "k:key_1:tpm", "acme", 1000, 120, "key key_1"),
        Bucket("concurrency", "t:inflight", "acme", 3, 1, "tenant acme"),
        Bucket("budget", "t:usd:d:2026-12-03", "acme", 5.0, 0.25, "tenant acme", 2 * 3600),
    ]
    assert [b.cost for b in second] == [1, 7, 1, 0.5]


def test_budget_periods_follow_the_clock():
    policy = Policy(key_budget=Budget(usd_per_day=1.0, usd_per_month=9.0))
    plans = PlanCache()
    today = plans.get(KEY, policy, "m").buckets(1, NOW, 0.0)
    next_month = plans.get(KEY, policy, "m").buckets(1, datetime(2027, 1, 1, tzinfo=UTC), 0.0)
    assert [b.name for b in today] == ["k:key_1:usd:d:2026-12-03", "k:key_1:usd:m:2026-12"]
    assert [b.name for b in next_month] == ["k:key_1:usd:d:2027-01-01", "k:key_1:usd:m:2027-01"]
    assert next_month[0].retry_hint_s == 86_400


def test_a_reloaded_policy_or_key_gets_a_new_plan():
    plans = PlanCache()
    assert plans.get(KEY, Policy(key_limits=Limits(rpm=10)), "m").buckets(1, NOW, 0.0)[0].limit == 10
    reloaded = Policy(key_limits=Limits(rpm=2))  # a directory reload: new objects, same key id
    assert plans.get(KEY, reloaded, "m").buckets(1, NOW, 0.0)[0].limit == 2
    moved = Principal(tenant_id="other", key_id="key_1", key_prefix="sk-1")
    assert plans.get(moved, reloaded, "m").buckets(1, NOW, 0.0)[0].scope == "other"


def test_model_limits_apply_to_their_model_only():
    policy = Policy(model_limits={"big": Limits(rpm=1)})
    plans = PlanCache()
    assert [b.name for b in plans.get(KEY, policy, "big").buckets(1, NOW, 0.0)] == ["m:big:rpm"]
    assert plans.get(KEY, policy, "small").buckets(1, NOW, 0.0) == []
    assert [b.name for b in plans.get(KEY, policy, "big").buckets(1, NOW, 0.0)] == ["m:big:rpm"]


def test_the_plan_cache_is_bounded():
    plans = PlanCache(size=2)
    policy = Policy(key_limits=Limits(rpm=1))
    for i in range(5):
        key = Principal(tenant_id="acme", key_id=f"key_{i}", key_prefix="sk")
        assert plans.get(key, policy, "m").buckets(1, NOW, 0.0)[0].name == f"k:key_{i}:rpm"
    assert len(plans._plans) <= 2


def test_limiter_key_names_are_cached_and_bounded(monkeypatch):
    monkeypatch.setattr(redis_limiter, "KEY_NAMES_CACHED", 2)
    limiter = RedisLimiter(RespPool("127.0.0.1", 1), "p:", 60, 30.0)
    buckets = [
        Bucket("requests", "k:a:rpm", "acme", 5, 1),
        Bucket("tokens", "k:a:tpm", "acme", 5, 3),
        Bucket("budget", "t:usd:d:2026-12-03", "acme", 1.0, 0.1),
    ]
    expected = [
        "p:{acme}:k:a:rpm",
        "p:{acme}:k:a:tpm:log",
        "p:{acme}:k:a:tpm:w",
        "p:{acme}:t:usd:d:2026-12-03",
        "p:{acme}:t:usd:d:2026-12-03:r",
        "p:{acme}:t:usd:d:2026-12-03:rw",
    ]
    for _ in range(2):
        keys, args = limiter.admission_call("member", buckets)
        assert keys == expected
        assert args == ["member", 60_000, 30_000, "R 5 1 L 5 3 B 1.0 0.1"]
    assert len(limiter._key_names) <= 2


def test_rate_headers_describe_the_tightest_bucket_of_each_kind():
    key_rpm = Bucket("requests", "k:a:rpm", "acme", 10, 1)
    tenant_rpm = Bucket("requests", "t:rpm", "acme", 100, 1)
    tenant_tpm = Bucket("tokens", "t:tpm", "acme", 1000, 50)
    tie = Bucket("tokens", "k:a:tpm", "acme", 600, 50)
    states = [
        BucketState(Bucket("concurrency", "t:inflight", "acme", 1, 1), 1, 0.0, 0.0),  # no headers
        BucketState(key_rpm, 4, 30.0, 0.0),  # 6 left
        BucketState(tenant_rpm, 97, 0.5, 0.0),  # 3 left: the tightest
        BucketState(tenant_tpm, 500, 2.0, 0.0),  # 500 left, first of two
        BucketState(tie, 100, 75.0, 0.0),  # 500 left too
    ]
    headers = rate_headers(Decision(True, states))
    assert list(headers.items()) == [
        ("x-ratelimit-limit-requests", "100"),
        ("x-ratelimit-remaining-requests", "3"),
        ("x-ratelimit-reset-requests", "500ms"),
        ("x-ratelimit-limit-tokens", "1000"),
        ("x-ratelimit-remaining-tokens", "500"),
        ("x-ratelimit-reset-tokens", "2s"),
    ]
    assert rate_headers(Decision(True, states[:1])) == {}


def test_cost_estimate_follows_the_current_aliases():
    def alias(name: str, *prices: float) -> ModelConfig:
        deployments = [
            {
                "name": f"{name}-{i}",
                "base_url": "http://x/v1",
                "model": "u",
                "input_price_per_1m": p,
                "output_price_per_1m": 2 * p,
            }  # fmt: skip
            for i, p in enumerate(prices)
        ]
        return ModelConfig.model_validate({"name": name, "deployments": deployments})

    current = [alias("m", 1.0, 3.0), alias("m", 100.0)]  # the first alias of a name wins, as before
    estimate = cost_estimator(lambda: current)
    assert estimate("m", 1_000_000, 1_000_000) == 3.0 + 6.0  # the dearest deployment
    assert estimate("unknown", 1_000_000, 0) == 0.0
    current = [alias("m", 10.0)]  # a reload: a new list
    assert estimate("m", 1_000_000, 0) == 10.0
