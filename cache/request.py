"""What the cache may do for one request: look up, store, both or neither, under which policy."""

from dataclasses import dataclass
from typing import Any

from cache.config import CachePolicy
from cache.encoder import EncodedQuestion
from cache.keys import SemanticParts, exact_key, is_deterministic, semantic_parts
from core.context import Policy, RequestContext
from core.errors import OpenAIError

_OPTIONS = frozenset({"no_cache", "no_store"})
CACHEABLE_ENDPOINTS = frozenset({"chat", "completions"})


@dataclass
class CacheRequest:
    policy: CachePolicy
    tenant: str
    key: str
    lookup: bool  # false for no-cache: fetch a fresh answer
    store: bool  # false for no-store
    parts: SemanticParts | None = None
    encoded: EncodedQuestion | None = None  # the question's vectors, once computed


def plan(ctx: RequestContext, defaults: CachePolicy) -> CacheRequest | None:
    """None when the cache must stay out of this request entirely."""
    no_cache, no_store = _opt_outs(ctx)
    policy = resolve_policy(ctx.policy, defaults)
    deterministic = is_deterministic(ctx.body) or policy.cache_nondeterministic
    if not policy.enabled or ctx.endpoint not in CACHEABLE_ENDPOINTS or not deterministic:
        return None
    if no_cache and no_store:
        return None
    tenant = ctx.principal.tenant_id if ctx.principal else ""
    return CacheRequest(
        policy=policy,
        tenant=tenant,
        key=exact_key(tenant, ctx.model, ctx.endpoint, ctx.body),
        lookup=not no_cache,
        store=not no_store,
        parts=semantic_parts(tenant, ctx.model, ctx.endpoint, ctx.body) if policy.semantic.on else None,
    )


def resolve_policy(policy: Policy | None, defaults: CachePolicy) -> CachePolicy:
    """The tenant policy's cache section (a CachePolicy or a dict of overrides), else the defaults."""
    section = getattr(policy, "cache", None)
    if isinstance(section, CachePolicy):
        return section
    if isinstance(section, dict) and section:
        return CachePolicy.model_validate({**defaults.model_dump(), **section})
    return defaults


def _opt_outs(ctx: RequestContext) -> tuple[bool, bool]:
    directives = {d.strip().lower() for d in ctx.headers.get("cache-control", "").split(",")}
    flags = _body_flags(ctx.options.get("cache"))
    return (
        "no-cache" in directives or flags.get("no_cache", False),
        "no-store" in directives or flags.get("no_store", False),
    )


def _body_flags(option: Any) -> dict[str, bool]:
    if option is None:
        return {}
    valid = isinstance(option, dict) and set(option) <= _OPTIONS
    if not valid or not all(isinstance(v, bool) for v in option.values()):
        raise OpenAIError(
            400,
            "Invalid 'cache': expected an object with boolean 'no_cache' and/or 'no_store'.",
            param="cache",
            code="invalid_cache_option",
        )
    return option
