"""Any OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI) over one keep-alive connection pool."""

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from email.utils import parsedate_to_datetime
from typing import Any

import orjson

from backends import responses_wire
from backends.base import PATHS, UpstreamError
from backends.http_client import HttpPool, Response, TransportError
from backends.responses_wire import to_responses
from core import tracing
from core.models import DeploymentConfig

_RETRY_AFTER_STATUSES = (429, 503)
_DATA = b"data:"


class OpenAICompatBackend:
    def __init__(self, config: DeploymentConfig, base_url: str | None = None) -> None:
        self.name = config.name
        self.config = config
        self.base_url = (base_url or config.base_url or "").rstrip("/")
        self._secret = config.api_key()
        self._headers = {"content-type": "application/json"}
        if self._secret:
            self._headers["authorization"] = f"Bearer {self._secret}"
        self._pool = HttpPool(
            self.base_url,
            max_connections=config.max_connections,
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
        )

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        if endpoint == "responses":  # a chat body, sent to the upstream's own Responses API
            return responses_wire.to_completion(
                await self._complete(endpoint, to_responses(body), request_id)
            )
        return await self._complete(endpoint, body, request_id)

    async def _complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        response = await self._post(PATHS[endpoint], body, request_id)
        data = await self._guard(response.read())
        if response.status != 200:
            raise self._status_error(response.status, data, response.headers)
        return orjson.loads(data)

    def stream(self, endpoint: str, body: dict[str, Any], request_id: str) -> AsyncIterator[dict[str, Any]]:
        if endpoint == "responses":
            return self._responses_stream(body, request_id)
        return self._stream(endpoint, body, request_id)

    async def _responses_stream(self, body: dict[str, Any], request_id: str) -> AsyncIterator[dict[str, Any]]:
        translator = responses_wire.ChunkTranslator()
        async with aclosing(self._stream("responses", to_responses(body), request_id)) as events:
            async for event in events:
                for chunk in translator.on_event(event):
                    yield chunk

    async def _stream(
        self, endpoint: str, body: dict[str, Any], request_id: str
    ) -> AsyncIterator[dict[str, Any]]:
        response = await self._post(PATHS[endpoint], body, request_id)
        try:
            if response.status != 200:
                data = await self._guard(response.read())
                raise self._status_error(response.status, data, response.headers)
            async for chunk in self._events(response):
                yield chunk
        finally:
            response.close()

    async def health(self) -> bool:
        probe = await self.probe()
        return probe is not None and probe[0] == 200

    async def probe(self) -> tuple[int, bytes] | None:
        """GET /models: its status and body, or None when the server cannot be reached."""
        try:
            response = await self._pool.request("GET", "/models", headers=self._headers, read_timeout=2.0)
            return response.status, await response.read()
        except TransportError:
            return None

    def unready_reason(self) -> str | None:
        """Why this deployment can never be ready (None: nothing known; health() tells the rest)."""
        return None

    async def tokenize(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """vLLM's POST /tokenize beside the API (`…/v1` → `…/tokenize`): the prompt's tokens as this
        deployment's own tokenizer and chat template make them (`count`, `max_model_len`, `tokens`)."""
        response = await self._post("/tokenize", body, request_id, beside_api=True)
        data = await self._guard(response.read())
        if response.status in (404, 405):  # OpenAI, llama.cpp, an older vLLM: retryable on another deployment
            raise UpstreamError(400, f"deployment {self.name} cannot count tokens: it serves no /tokenize.",
                                retryable=True, code="count_tokens_unsupported")  # fmt: skip
        if response.status != 200:
            raise self._status_error(response.status, data, response.headers)
        answer = orjson.loads(data)
        if not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
            raise UpstreamError(502, f"deployment {self.name} sent no token count.", retryable=True)
        return answer

    def _payload(self, body: dict[str, Any]) -> bytes:
        """The body as this deployment takes it: its model name; vLLM's continuous usage only for our engine
        and where extra parameters are accepted (OpenAI itself refuses unknown stream options)."""
        options = body.get("stream_options")
        takes_it = self.config.backend == "local_engine" or self.config.accepts_extras()
        if options and "continuous_usage_stats" in options and not takes_it:
            body = {
                **body,
                "stream_options": {k: v for k, v in options.items() if k != "continuous_usage_stats"},
            }
        return orjson.dumps({**body, "model": self.config.model})

    async def _post(
        self, path: str, body: dict[str, Any], request_id: str, beside_api: bool = False
    ) -> Response:
        payload = self._payload(body)
        headers = {**self._headers, "x-request-id": request_id}
        tracing.inject(headers)  # traceparent of this attempt's span, when tracing is on
        try:
            return await self._pool.request("POST", path, payload, headers, beside_api=beside_api)
        except TransportError as error:
            raise self._transport_error(error, before_first_byte=True) from error

    async def _guard(self, reading: Any) -> bytes:
        try:
            return await reading
        except TransportError as error:
            raise self._transport_error(error, before_first_byte=False) from error

    async def _events(self, response: Response) -> AsyncIterator[dict[str, Any]]:
        lines = response.iter_lines()
        while True:
            try:
                line = await anext(lines, None)
            except TransportError as error:
                raise self._transport_error(error, before_first_byte=False) from error
            if line is None:
                break
            if not line.startswith(_DATA):
                continue
            payload = line[len(_DATA) :].strip()
            if payload == b"[DONE]":
                await self._guard(response.drain())
                return
            chunk = orjson.loads(payload)
            if "error" in chunk:
                raise self._error_event(chunk["error"])
            yield chunk
            if chunk.get("type") in responses_wire.FINAL_EVENTS:  # Responses streams end without [DONE]
                await self._guard(response.drain())
                return
        raise UpstreamError(502, f"deployment {self.name} closed the stream before [DONE]", retryable=False)

    def _transport_error(self, error: TransportError, before_first_byte: bool) -> UpstreamError:
        status = 504 if error.timeout else (503 if not error.sent else 502)
        what = (
            "timed out" if error.timeout else ("is unreachable" if not error.sent else "broke the connection")
        )
        return UpstreamError(status, f"deployment {self.name} {what}", retryable=before_first_byte)

    def _status_error(self, status: int, data: bytes, headers: list[tuple[bytes, bytes]]) -> UpstreamError:
        """4xx (but 408) reach the client as the upstream sent them; 5xx become 502 (503/504 kept)."""
        fields = _upstream_error(data)
        message = self._redact(fields.get("message") or f"HTTP {status}")
        retry_after = retry_after_s(headers) if status in _RETRY_AFTER_STATUSES else None
        if 400 <= status < 500 and status != 408:
            return UpstreamError(status, message, retryable=status == 429, type=fields.get("type"),
                                 param=fields.get("param"), code=fields.get("code"),
                                 retry_after_s=retry_after)  # fmt: skip
        mapped = status if status in (503, 504) else (504 if status == 408 else 502)
        return UpstreamError(
            mapped, f"deployment {self.name} failed: {message}", retryable=True, retry_after_s=retry_after
        )

    def _error_event(self, error: Any) -> UpstreamError:
        message = error.get("message") if isinstance(error, dict) else str(error)
        return UpstreamError(
            502, f"deployment {self.name} failed mid-stream: {self._redact(str(message))}", retryable=False
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text


def _upstream_error(data: bytes) -> dict[str, str]:
    """message, type, param and code of an OpenAI-style error body ({"error": {...}} or vLLM's flat one)."""
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {"message": data[:200].decode("utf-8", "replace")}
    error = body.get("error", body) if isinstance(body, dict) else body
    if not isinstance(error, dict):
        return {"message": str(error)} if error else {}
    fields = {k: error.get(k) for k in ("message", "type", "param", "code")}
    return {k: str(v) for k, v in fields.items() if v is not None and v != ""}


def retry_after_s(headers: list[tuple[bytes, bytes]], now: float | None = None) -> float | None:
    """Seconds from `retry-after-ms`, or `retry-after` (seconds or an HTTP date); None if absent or bad."""
    values = dict(headers)
    try:
        if b"retry-after-ms" in values:
            return max(0.0, float(values[b"retry-after-ms"]) / 1000)
        raw = values.get(b"retry-after")
        if raw is None:
            return None
        text = raw.decode("latin-1").strip()
        if text.replace(".", "", 1).isdigit():
            return float(text)
        when = parsedate_to_datetime(text).timestamp()
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))
