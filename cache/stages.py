"""The two pipeline stages. ExactCacheStage must run before SemanticCacheStage: it decides what the
cache may do for the request (a CacheRequest, kept in ctx.notes), answers identical requests, tags every
reply with x-cache-status and stores complete answers. SemanticCacheStage answers paraphrases the
verifier accepts; a request with `x-cache-feedback: wrong` reports the semantic hit it would get as a
wrong answer: that entry is evicted and counted, and a fresh answer is fetched (and cached)."""

from cache.request import CacheRequest, plan
from cache.service import CacheService, SemanticMatch
from core.context import CacheNote, Handler, RequestContext
from core.reply import Reply

FEEDBACK_HEADER = "x-cache-feedback"


class ExactCacheStage:
    def __init__(self, service: CacheService) -> None:
        self._service = service

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        request = plan(ctx, self._service.settings.defaults)
        if request is None:
            ctx.cache_status = "bypass"
            return _tagged(ctx, await call_next(ctx))
        ctx.put(request)
        if request.lookup and request.policy.exact:
            entry = await self._service.get_exact(request.key)
            if entry is not None:
                return self._service.serve(ctx, entry, "hit")
        ctx.cache_status = "miss" if request.lookup else "bypass"
        reply = await call_next(ctx)
        if request.store and ctx.cache_status in ("miss", "bypass"):
            await self._service.store_when_complete(ctx, request, reply)
        return _tagged(ctx, reply)


class SemanticCacheStage:
    def __init__(self, service: CacheService) -> None:
        self._service = service

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Reply:
        request = ctx.get(CacheRequest)
        if request is None or request.parts is None or not self._service.semantic:
            return await call_next(ctx)
        request.encoded = await self._service.embed(request.parts.question)
        if not request.lookup:
            return await call_next(ctx)
        lookup = await self._service.find_similar(request)
        match = lookup.match
        if match is not None and _reports_wrong(ctx):
            await self._service.report_wrong(match, "header")
        elif match is not None:
            return self._serve(ctx, match, call_next)
        ctx.cache = CacheNote("miss")  # looked, found nothing: a semantic miss for the metrics
        reply = await call_next(ctx)
        if lookup.unserved and self._service.verified is not None:
            await self._service.verified.label_with_reply(ctx, reply, lookup.unserved)
        return reply

    def _serve(self, ctx: RequestContext, match: SemanticMatch, call_next: Handler) -> Reply:
        service = self._service
        reply = service.serve(ctx, match.entry, "semantic-hit")
        if ctx.cache is not None:
            ctx.cache.similarity = match.similarity
        reply.headers["x-cache-similarity"] = f"{match.similarity:.4f}"
        reply.headers["x-cache-verifier"] = f"{match.probability:.4f}"
        service.remember_hit(ctx.request_id, match)
        verified = ctx.get(CacheRequest).policy.semantic.mode == "verified"  # type: ignore[union-attr]
        if verified and service.verified is not None and match.candidate is not None:
            service.verified.after_hit(ctx, match.candidate, match.entry, call_next)
        elif service.shadow is not None:
            service.shadow.maybe_check(ctx, match.entry.answer, call_next)
        return reply


def _reports_wrong(ctx: RequestContext) -> bool:
    return ctx.headers.get(FEEDBACK_HEADER, "").strip().lower() == "wrong"


def _tagged(ctx: RequestContext, reply: Reply) -> Reply:
    reply.headers.setdefault("x-cache-status", ctx.cache_status)
    return reply
