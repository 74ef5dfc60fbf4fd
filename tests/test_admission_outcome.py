"""A lease's SLO outcome when its stream ends (routing/admission/admission.py): met / missed on an answer,
failed on an error, and for a client that left: judged on what it was sent, or cancelled (no verdict) when it
left before its first token but still within the TTFT target."""

import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from core.errors import OpenAIError
from core.reply import Reply
from routing.admission.admission import Lease
from routing.admission.config import AdmissionSettings
from routing.admission.fair import Ticket
from routing.admission.guard import SloGuard
from routing.admission.metrics import AdmissionMetrics

ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
TOKEN = {"choices": [{"index": 0, "delta": {"content": "hi"}}]}


class _Gate:
    alias = "pool"

    def __init__(self, settings: AdmissionSettings) -> None:
        self.guard = SloGuard(settings.slo_guard, settings.classes, time.monotonic)
        self.released: list[int | None] = []

    def release(self, ticket: Ticket, tokens: int | None) -> None:
        self.released.append(tokens)


async def _chunks(first_token: bool, fail: bool = False) -> AsyncIterator[dict[str, Any]]:
    yield ROLE
    if first_token:
        yield TOKEN
    if fail:
        raise OpenAIError(502, "upstream broke")
    yield TOKEN


async def _end(waited_s: float, first_token: bool, read: int, fail: bool = False) -> tuple[str, _Gate]:
    """A standard-class stream (TTFT target 2.5 s) that started `waited_s` ago, read `read` chunks, then closed."""
    settings = AdmissionSettings()
    registry = CollectorRegistry()
    admission = SimpleNamespace(settings=settings, metrics=AdmissionMetrics(registry))
    gate = _Gate(settings)
    ctx = SimpleNamespace(started_at=time.perf_counter() - waited_s)
    ticket = Ticket("t", "standard", 1.0, 10.0, time.monotonic() + 15, time.monotonic())
    lease = Lease(admission, gate, ticket, ctx)  # type: ignore[arg-type]
    reply = Reply(stream=_chunks(first_token, fail))
    await lease.follow(reply)
    assert reply.stream is not None
    try:
        for _ in range(read):
            await anext(reply.stream)
    except (OpenAIError, StopAsyncIteration):
        pass
    await reply.stream.aclose()  # type: ignore[attr-defined]
    outcomes = [s.labels["outcome"] for m in registry.collect() if m.name == "llmgw_admission_slo_requests"
                for s in m.samples if s.name.endswith("_total") and s.value]  # fmt: skip
    assert len(outcomes) == 1 and gate.released  # counted once, and the slot given back
    return outcomes[0], gate


@pytest.mark.parametrize(
    ("waited_s", "first_token", "read", "fail", "expected"),
    [
        (0.0, True, 9, False, "met"),  # the whole answer (read to its end), quickly
        (0.0, False, 1, False, "cancelled"),  # left after the role chunk, 0 s in: no verdict
        (3.0, False, 1, False, "missed"),  # left after 3 s without a token: the 2.5 s target was missed
        (0.0, True, 2, False, "met"),  # left after its first token, in time: judged on what it got
        (3.0, True, 2, False, "missed"),  # its first token came after the target
        (0.0, True, 9, True, "failed"),  # the upstream broke mid-stream
    ],
)
async def test_outcome_when_the_stream_ends(
    waited_s: float, first_token: bool, read: int, fail: bool, expected: str
) -> None:
    outcome, _ = await _end(waited_s, first_token, read, fail)
    assert outcome == expected


@pytest.mark.parametrize(
    ("waited_s", "cancelled", "expected"),
    [(0.0, True, "cancelled"), (3.0, True, "missed"), (0.0, False, "failed")],
)
def test_no_reply_is_failed_unless_the_client_left(waited_s: float, cancelled: bool, expected: str) -> None:
    """A body request whose client went away before any answer (cancelled) is judged by how long it had
    waited, as a stream cut before its first token; every attempt failing is `failed`."""
    settings = AdmissionSettings()
    registry = CollectorRegistry()
    admission = SimpleNamespace(settings=settings, metrics=AdmissionMetrics(registry))
    ctx = SimpleNamespace(started_at=time.perf_counter() - waited_s)
    ticket = Ticket("t", "standard", 1.0, 10.0, time.monotonic() + 15, time.monotonic())
    lease = Lease(admission, _Gate(settings), ticket, ctx)  # type: ignore[arg-type]
    lease.failed(cancelled=cancelled)
    lease.failed(cancelled=cancelled)  # once only
    outcomes = [(s.labels["outcome"], s.value) for m in registry.collect() if m.name == "llmgw_admission_slo_requests"
                for s in m.samples if s.name.endswith("_total") and s.value]  # fmt: skip
    assert outcomes == [(expected, 1.0)]
