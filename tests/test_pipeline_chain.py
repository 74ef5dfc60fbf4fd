"""gateway/pipeline.py: the stages folded into one handler (each stage's call_next is the next stage)."""

import pytest

from core.context import Handler, RequestContext
from core.errors import OpenAIError
from core.reply import Reply
from gateway.pipeline import chain


def context() -> RequestContext:
    return RequestContext(request_id="r", endpoint="chat", body={}, headers={}, model="m")


def recording(name: str, seen: list[str]):
    async def stage(ctx: RequestContext, call_next: Handler) -> Reply:
        seen.append(f"{name} in")
        try:
            reply = await call_next(ctx)
        except OpenAIError as error:
            seen.append(f"{name} saw {error.status}")
            raise
        seen.append(f"{name} out")
        reply.headers[name] = "1"
        return reply

    return stage


async def answer(ctx: RequestContext, call_next: Handler) -> Reply:
    return Reply(body={"ok": True})


async def refuse(ctx: RequestContext, call_next: Handler) -> Reply:
    raise OpenAIError(429, "slow down")


async def test_stages_run_in_order_and_see_the_reply_on_the_way_back():
    seen: list[str] = []
    reply = await chain([recording("a", seen), recording("b", seen), answer])(context())
    assert seen == ["a in", "b in", "b out", "a out"]
    assert reply.body == {"ok": True} and reply.headers == {"b": "1", "a": "1"}


async def test_an_error_below_reaches_every_stage_above():
    seen: list[str] = []
    with pytest.raises(OpenAIError) as raised:
        await chain([recording("a", seen), recording("b", seen), refuse])(context())
    assert raised.value.status == 429
    assert seen == ["a in", "b in", "b saw 429", "a saw 429"]


async def test_a_pipeline_without_an_answer_is_a_500():
    with pytest.raises(OpenAIError) as raised:
        await chain([recording("a", [])])(context())
    assert raised.value.status == 500


async def test_around_wraps_each_stage():
    wrapped: list[str] = []

    def around(stage):
        async def traced(ctx: RequestContext, call_next: Handler) -> Reply:
            wrapped.append(stage.__name__)
            return await stage(ctx, call_next)

        return traced

    seen: list[str] = []
    reply = await chain([recording("a", seen), answer], around)(context())
    assert wrapped == ["stage", "answer"] and reply.body == {"ok": True}
