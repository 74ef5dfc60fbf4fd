"""The shutdown drain: work that ends within the grace period is untouched; what outlives it is cut
with a 503 (a request) or an error (a stream), and only the drain's own cancellation is converted."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from core.context import Reply, RequestContext
from core.errors import OpenAIError
from gateway.lifecycle import Drain, DrainStage, close_within


def ctx() -> RequestContext:
    return RequestContext(request_id="r", endpoint="chat", body={}, headers={}, model="m")


def answer_after(seconds: float):
    async def handler(ctx: RequestContext) -> Reply:
        await asyncio.sleep(seconds)
        return Reply(body={"ok": True})

    return handler


def stream_of(chunks: int, pause_s: float):
    async def chunks_out() -> AsyncIterator[dict[str, Any]]:
        for i in range(chunks):
            yield {"i": i}
            await asyncio.sleep(pause_s)

    async def handler(ctx: RequestContext) -> Reply:
        return Reply(stream=chunks_out())

    return handler


async def test_a_request_within_the_grace_period_finishes() -> None:
    drain = Drain(grace_s=2.0)
    call = asyncio.create_task(DrainStage(drain)(ctx(), answer_after(0.2)))
    await asyncio.sleep(0.05)
    drain.begin()
    assert drain.draining and not drain.expired
    assert (await call).body == {"ok": True}


async def test_a_request_past_the_grace_period_gets_503() -> None:
    drain = Drain(grace_s=0.1)
    call = asyncio.create_task(DrainStage(drain)(ctx(), answer_after(30)))
    await asyncio.sleep(0.05)
    drain.begin()
    with pytest.raises(OpenAIError) as cut:
        await asyncio.wait_for(call, 10)
    assert cut.value.status == 503 and cut.value.code == "server_shutting_down"
    assert cut.value.headers["retry-after"] == "1"


async def test_a_stream_past_the_grace_period_ends_with_an_error() -> None:
    drain = Drain(grace_s=0.3)

    async def consume() -> list[dict[str, Any]]:
        reply = await DrainStage(drain)(ctx(), stream_of(1000, 0.02))
        assert reply.stream is not None
        return [chunk async for chunk in reply.stream]

    call = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    drain.begin()
    with pytest.raises(OpenAIError) as cut:
        await asyncio.wait_for(call, 10)
    assert cut.value.code == "server_shutting_down"


async def test_a_stream_within_the_grace_period_completes() -> None:
    drain = Drain(grace_s=5.0)
    reply = await DrainStage(drain)(ctx(), stream_of(5, 0.01))
    drain.begin()
    assert reply.stream is not None
    assert [c async for c in reply.stream] == [{"i": i} for i in range(5)]


async def test_other_cancellations_stay_cancellations() -> None:
    drain = Drain(grace_s=30)
    call = asyncio.create_task(DrainStage(drain)(ctx(), answer_after(30)))
    await asyncio.sleep(0.05)
    call.cancel()  # e.g. the client left
    with pytest.raises(asyncio.CancelledError):
        await call


async def test_a_stuck_closer_is_abandoned_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    closed: list[str] = []

    async def flush() -> None:
        closed.append("flush")

    async def stuck() -> None:
        await asyncio.Event().wait()  # a peer that never answers

    async def pools() -> None:
        closed.append("pools")

    loop = asyncio.get_running_loop()
    started = loop.time()
    await close_within([flush, stuck, pools], timeout_s=0.3)
    assert closed == ["flush", "pools"]
    assert loop.time() - started < 2.5  # the stuck one got what was left (at least 1 s), not forever
    assert "stuck did not finish" in caplog.text


async def test_closers_that_finish_are_all_awaited_in_order() -> None:
    closed: list[int] = []

    def closer(n: int):
        async def close() -> None:
            await asyncio.sleep(0.01)
            closed.append(n)

        return close

    await close_within([closer(1), closer(2), closer(3)], timeout_s=5)
    assert closed == [1, 2, 3]
