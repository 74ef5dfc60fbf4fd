"""OpenTelemetry: one trace per request, a span per stage and per backend attempt, traceparent in and out."""

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import GatewayApp, create_app
from tests.conftest import MASTER_KEY, gateway_settings
from tests.fakes import FakeUpstream, ServerThread

AUTH = {"authorization": f"Bearer {MASTER_KEY}"}
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def traced(
    upstream: tuple[FakeUpstream, ServerThread],
) -> Iterator[tuple[ServerThread, InMemorySpanExporter]]:
    settings = gateway_settings(upstream[1].url, tracing={"enabled": True, "exporter": "none"},
                                routing={"backoff_base_s": 0.01, "backoff_max_s": 0.02})  # fmt: skip
    app: GatewayApp = create_app(settings)
    exporter = InMemorySpanExporter()
    with ServerThread(app) as server:
        app.state.services.tracing.provider.add_span_processor(SimpleSpanProcessor(exporter))
        yield server, exporter


def chat(url: str, text: str, stream: bool = False, traceparent: str | None = None) -> httpx.Response:
    headers = {**AUTH, **({"traceparent": traceparent} if traceparent else {})}
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}], "stream": stream}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def spans_of(exporter: InMemorySpanExporter, request_id: str) -> list[ReadableSpan]:
    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.attributes.get("llmgw.request_id") == request_id]
    return [s for s in spans if s.context.trace_id == root.context.trace_id]


def test_one_trace_with_a_span_per_stage_under_the_callers_traceparent(
    traced: tuple[ServerThread, InMemorySpanExporter], upstream: tuple[FakeUpstream, ServerThread]
) -> None:
    server, exporter = traced
    response = chat(server.url, "trace me", traceparent=f"00-{TRACE_ID}-{PARENT}-01")
    assert response.status_code == 200
    spans = spans_of(exporter, response.headers["x-request-id"])
    by_name = {s.name: s for s in spans}
    assert {"llmgw chat", "observe", "auth", "policy", "limits", "exact_cache", "cascade", "accounting", "route",
            "admission.queue", "backend.attempt"} <= set(by_name)  # fmt: skip
    assert (
        by_name["admission.queue"].parent.span_id == by_name["route"].context.span_id
    )  # the wait for a slot
    root = by_name["llmgw chat"]
    assert format(root.context.trace_id, "032x") == TRACE_ID and format(root.parent.span_id, "016x") == PARENT
    assert (
        root.attributes["llmgw.deployment"] == "fake-1"
        and root.attributes["http.response.status_code"] == 200
    )
    assert by_name["drain"].parent.span_id == by_name["observe"].context.span_id  # stages nest in order
    assert by_name["auth"].parent.span_id == by_name["drain"].context.span_id
    attempt = by_name["backend.attempt"]
    assert (attempt.attributes["llmgw.deployment"], attempt.attributes["llmgw.retry"]) == ("fake-1", False)
    sent = upstream[0].requests[-1]["headers"][b"traceparent"].decode()
    assert sent == f"00-{TRACE_ID}-{format(attempt.context.span_id, '016x')}-01"


def test_retries_are_separate_attempt_spans(traced: tuple[ServerThread, InMemorySpanExporter]) -> None:
    server, exporter = traced
    response = chat(server.url, "fail:500")
    assert response.status_code == 502
    attempts = [
        s for s in spans_of(exporter, response.headers["x-request-id"]) if s.name == "backend.attempt"
    ]
    assert sorted(s.attributes["llmgw.attempt"] for s in attempts) == [0, 1, 2]
    assert [s.attributes["llmgw.retry"] for s in sorted(attempts, key=lambda s: s.attributes["llmgw.attempt"])] == [
        False, True, True]  # fmt: skip
    root = next(s for s in spans_of(exporter, response.headers["x-request-id"]) if s.name == "llmgw chat")
    assert not root.status.is_ok


def test_a_streamed_request_ends_its_trace_with_the_stream(
    traced: tuple[ServerThread, InMemorySpanExporter],
) -> None:
    server, exporter = traced
    response = chat(server.url, "a b c", stream=True)
    assert response.status_code == 200 and "[DONE]" in response.text
    root = next(s for s in spans_of(exporter, response.headers["x-request-id"]) if s.name == "llmgw chat")
    assert root.attributes["llmgw.completion_tokens"] == 4 and root.attributes["llmgw.stream"]


def test_off_by_default_nothing_is_forwarded(
    gateway: ServerThread, upstream: tuple[FakeUpstream, ServerThread]
) -> None:
    assert chat(gateway.url, "untraced", traceparent=f"00-{TRACE_ID}-{PARENT}-01").status_code == 200
    assert b"traceparent" not in upstream[0].requests[-1]["headers"]


def test_a_request_refused_before_the_pipeline_has_its_own_span(
    traced: tuple[ServerThread, InMemorySpanExporter],
) -> None:
    server, exporter = traced
    parent = {"traceparent": f"00-{TRACE_ID}-{PARENT}-01"}
    wrong_key = httpx.post(server.url + "/v1/chat/completions", json={"model": "fake-model"}, timeout=30,
                           headers={"authorization": "Bearer sk-wrong", **parent})  # fmt: skip
    malformed = httpx.post(server.url + "/v1/chat/completions", content=b"{nope", headers={**AUTH, **parent},
                           timeout=30)  # fmt: skip
    for response, status in ((wrong_key, 401), (malformed, 400)):
        assert response.status_code == status
        request_id = response.headers["x-request-id"]
        [root] = [
            s for s in exporter.get_finished_spans() if s.attributes.get("llmgw.request_id") == request_id
        ]
        assert (root.name, root.attributes["llmgw.rejected"]) == ("llmgw chat", True)
        assert root.attributes["http.response.status_code"] == status
        assert (
            format(root.context.trace_id, "032x") == TRACE_ID
            and format(root.parent.span_id, "016x") == PARENT
        )
    assert "sk-wrong" not in str([dict(s.attributes) for s in exporter.get_finished_spans()])
