"""The JSON access log: one line per request, no secrets, text only when allowed."""

import io
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from core.context import Principal, Reply, RequestContext, Usage
from core.errors import OpenAIError
from gateway.access_log import AccessLog, BufferedLineHandler, configure_access_logger, prompt_text
from gateway.metrics import GatewayMetrics, Outcome
from gateway.observability_config import ObservabilitySettings
from gateway.observe import ObserveStage
from gateway.pipeline import chain
from gateway.settings import Settings

SECRET = "sk-live-0123456789abcdef"


def make_stage(**observability: Any) -> tuple[ObserveStage, io.StringIO]:
    out = io.StringIO()
    logger = logging.getLogger(f"test.access_log.{len(observability)}.{id(out)}")
    logger.addHandler(logging.StreamHandler(out))
    logger.setLevel(logging.INFO)
    metrics = GatewayMetrics.from_settings(Settings(), CollectorRegistry())
    return ObserveStage(metrics, AccessLog(ObservabilitySettings(**observability), logger)), out


def context(stream: bool = False) -> RequestContext:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "my private question"}]}
    headers = {"authorization": f"Bearer {SECRET}"}
    ctx = RequestContext("req-1", "chat", body, headers, "smollm2", stream=stream, started_at=0.0)
    ctx.principal = Principal(tenant_id="acme", key_id="key-1", key_prefix="sk-live-01")
    return ctx


async def answer(ctx: RequestContext) -> Reply:
    ctx.deployment, ctx.cache_status, ctx.cascade = "local-smollm2", "miss", "small"
    ctx.usage, ctx.cost_usd = Usage(12, 3, 4), 0.5
    return Reply(body={"choices": [{"index": 0, "message": {"role": "assistant", "content": "the answer"}}]})


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_one_json_line_per_request_with_the_serving_facts_and_no_key_or_text() -> None:
    stage, out = make_stage()
    await chain([stage, lambda ctx, _next: answer(ctx)])(context())
    [entry] = lines(out)
    assert (
        entry["request_id"] == "req-1" and entry["tenant"] == "acme" and entry["key_prefix"] == "sk-live-01"
    )
    assert (entry["model"], entry["deployment"], entry["cache_status"], entry["cascade"]) == (
        "smollm2", "local-smollm2", "miss", "small",
    )  # fmt: skip
    assert (entry["prompt_tokens"], entry["completion_tokens"], entry["cached_tokens"]) == (12, 3, 4)
    assert entry["cost_usd"] == 0.5 and entry["status"] == 200 and entry["latency_ms"] >= 0
    assert SECRET not in out.getvalue()
    assert "private question" not in out.getvalue() and "the answer" not in out.getvalue()


async def test_failed_requests_are_logged_with_status_and_error() -> None:
    stage, out = make_stage()

    async def refuse(ctx: RequestContext) -> Reply:
        raise OpenAIError(429, "Rate limit reached for requests per minute.", code="rate_limit_exceeded")

    with pytest.raises(OpenAIError):
        await chain([stage, lambda ctx, _next: refuse(ctx)])(context())
    [entry] = lines(out)
    assert entry["status"] == 429 and entry["error"].startswith("rate_limit_error: Rate limit reached")


async def test_prompt_and_response_text_only_when_the_setting_allows_and_cut_to_length() -> None:
    stage, out = make_stage(access_log_bodies=True, access_log_body_chars=12)
    await chain([stage, lambda ctx, _next: answer(ctx)])(context())
    [entry] = lines(out)
    assert entry["prompt"] == "user: my pri" and entry["response"] == "the answer"
    assert SECRET not in out.getvalue()


async def test_streamed_response_text_is_collected_when_allowed() -> None:
    stage, out = make_stage(access_log_bodies=True)

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        for text in ("", "the ", "answer"):
            yield {"choices": [{"index": 0, "delta": {"content": text}}]}

    async def streamed(ctx: RequestContext) -> Reply:
        return Reply(stream=chunks())

    reply = await chain([stage, lambda ctx, _next: streamed(ctx)])(context(stream=True))
    assert out.getvalue() == ""  # nothing until the stream ends
    _ = [chunk async for chunk in reply.stream]
    [entry] = lines(out)
    assert entry["response"] == "the answer" and entry["stream"] is True and entry["ttft_ms"] is not None


def test_access_logger_is_named_and_writes_bare_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        logging.getLogger("llmgw.access"), "handlers", []
    )  # a gateway started earlier set one
    stream = io.StringIO()
    logger = configure_access_logger(stream)
    configure_access_logger(stream)  # idempotent: still one handler
    logger.info('{"a": 1}')
    for handler in logger.handlers:
        handler.flush()
    assert logger.name == "llmgw.access" and stream.getvalue() == '{"a": 1}\n'


def test_buffered_handler_writes_in_batches_and_flushes_on_its_own() -> None:
    stream = io.StringIO()
    handler = BufferedLineHandler(stream, batch=3, interval_s=0.05)
    logger = logging.getLogger("test.access_log.buffered")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.info("one")
    logger.info("two")
    assert stream.getvalue() == ""
    logger.info("three")
    assert stream.getvalue() == "one\ntwo\nthree\n"
    logger.info("four")
    time.sleep(0.3)
    assert stream.getvalue().endswith("three\nfour\n")
    handler.close()
    logger.removeHandler(handler)
    assert prompt_text({"input": ["x", "y"]}) == '["x","y"]'


async def test_default_logger_gets_the_same_line_without_a_record_and_added_handlers_still_get_records() -> (
    None
):
    out = io.StringIO()
    logger = configure_access_logger(out, name="test.access_log.direct")
    [default] = logger.handlers
    log = AccessLog(ObservabilitySettings(), logger)
    log.write(context(), Outcome(200, 0.002))
    default.flush()
    [line] = out.getvalue().splitlines()
    assert json.loads(line)["status"] == 200 and json.loads(line)["request_id"] == "req-1"

    records: list[logging.LogRecord] = []
    extra = logging.Handler()
    extra.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(extra)
    try:
        log.write(context(), Outcome(404, 0.002))
    finally:
        logger.removeHandler(extra)
    default.flush()
    default.close()
    assert records[0].access["status"] == 404 and json.loads(out.getvalue().splitlines()[1])["status"] == 404
