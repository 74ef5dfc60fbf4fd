"""Closed-loop load against gateway replicas, recording every outcome (status, latency, how a stream ended)."""

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

CONNECTION_FAILED = 0  # the status recorded when no HTTP answer came back


@dataclass
class Outcome:
    started: float  # time.monotonic() when sent
    latency_s: float
    status: int
    stream: bool
    done: bool = False  # a stream ended with [DONE]
    error_code: str | None = None  # the code of an error event that ended a stream

    @property
    def complete(self) -> bool:
        """A 200 with its whole answer (a stream that reached [DONE])."""
        return self.status == 200 and (self.done or not self.stream)


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)

    def statuses(self) -> Counter:
        return Counter(o.status for o in self.outcomes)

    def server_errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status >= 500 or o.status == CONNECTION_FAILED]

    def complete(self) -> int:
        return sum(o.complete for o in self.outcomes)

    def latency(self, quantile: float) -> float:
        values = sorted(o.latency_s for o in self.outcomes)
        return values[min(len(values) - 1, int(quantile * len(values)))] if values else 0.0

    def summary(self) -> str:
        return (f"{len(self.outcomes)} requests, statuses {dict(self.statuses())}, complete {self.complete()}, "
                f"p50 {self.latency(0.5):.3f}s p99 {self.latency(0.99):.3f}s max {self.latency(1.0):.3f}s")  # fmt: skip


def chat(text: str, stream: bool = False, model: str = "m") -> dict:
    body: dict = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def send(client: httpx.AsyncClient, url: str, key: str, body: dict) -> Outcome:
    started = time.monotonic()
    stream = bool(body.get("stream"))
    outcome = Outcome(started, 0.0, CONNECTION_FAILED, stream)
    headers = {"authorization": f"Bearer {key}"}
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            outcome.status = response.status_code
            if stream and response.status_code == 200:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        outcome.done = True
                    elif line.startswith('data: {"error"'):
                        outcome.error_code = orjson.loads(line[6:])["error"].get("code") or "error"
            else:
                await response.aread()
    except httpx.HTTPError:
        pass  # recorded as CONNECTION_FAILED, or as a stream that did not reach [DONE]
    outcome.latency_s = time.monotonic() - started
    return outcome


async def run_load(
    urls: list[str],
    key: str,
    bodies: Callable[[int], dict],
    duration_s: float,
    concurrency: int,
    timeout_s: float = 60.0,
) -> LoadResult:
    """`concurrency` clients, each sending one request after another to the replicas in turn, for
    `duration_s` seconds; request i has body `bodies(i)`."""
    result = LoadResult()
    numbers = itertools.count()
    deadline = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def client_loop() -> None:
            while time.monotonic() < deadline:
                i = next(numbers)
                outcome = await send(client, urls[i % len(urls)], key, bodies(i))
                result.outcomes.append(outcome)
                if outcome.status == CONNECTION_FAILED:
                    await asyncio.sleep(0.1)  # a replica that is gone: no busy loop

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return result
