"""Any OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI) over one pooled aiohttp session."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from backends.base import PATHS, UpstreamError
from gateway.settings import DeploymentConfig

_PASSED_THROUGH = {400, 401, 403, 404, 409, 413, 415, 422, 429}
_DATA = b"data:"


class OpenAICompatBackend:
    def __init__(self, config: DeploymentConfig, base_url: str | None = None) -> None:
        self.name = config.name
        self.config = config
        self.base_url = (base_url or config.base_url or "").rstrip("/")
        self._secret = config.api_key()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.config.max_connections, keepalive_timeout=75)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.config.connect_timeout_s, sock_read=self.config.read_timeout_s
        )
        headers = {"content-type": "application/json"}
        if self._secret:
            headers["authorization"] = f"Bearer {self._secret}"
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=headers, auto_decompress=True
        )

    async def aclose(self) -> None:
        if self._session:
            await self._session.close()

    async def complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        async with self._post(endpoint, body, request_id) as response:
            data = await self._read(response)
        return orjson.loads(data)

    async def stream(
        self, endpoint: str, body: dict[str, Any], request_id: str
    ) -> AsyncIterator[dict[str, Any]]:
        async with self._post(endpoint, body, request_id) as response:
            if response.status != 200:
                await self._read(response)
            async for chunk in self._events(response):
                yield chunk

    async def health(self) -> bool:
        try:
            async with self._session.get(
                f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=2)
            ) as r:
                return r.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    def _post(self, endpoint: str, body: dict[str, Any], request_id: str) -> "_Call":
        payload = orjson.dumps({**body, "model": self.config.model})
        url = self.base_url + PATHS[endpoint]
        return _Call(self, self._session.post(url, data=payload, headers={"x-request-id": request_id}))

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        data = await response.read()
        if response.status != 200:
            raise self._status_error(response.status, data)
        return data

    async def _events(self, response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
        async for line in response.content:
            if not line.startswith(_DATA):
                continue
            payload = line[len(_DATA) :].strip()
            if payload == b"[DONE]":
                return
            chunk = orjson.loads(payload)
            if "error" in chunk:
                raise self._error_event(chunk["error"])
            yield chunk
        raise UpstreamError(502, f"deployment {self.name} closed the stream before [DONE]", retryable=False)

    def _status_error(self, status: int, data: bytes) -> UpstreamError:
        message = self._redact(_upstream_message(data) or f"HTTP {status}")
        if status in _PASSED_THROUGH:
            return UpstreamError(status, message, retryable=status == 429)
        mapped = status if status in (503, 504) else 502
        return UpstreamError(mapped, f"deployment {self.name} failed: {message}", retryable=True)

    def _error_event(self, error: Any) -> UpstreamError:
        message = error.get("message") if isinstance(error, dict) else str(error)
        return UpstreamError(
            502, f"deployment {self.name} failed mid-stream: {self._redact(message)}", retryable=False
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text


class _Call:
    """Maps transport failures of one upstream call to UpstreamError (503 unreachable, 504 timeout)."""

    def __init__(self, backend: OpenAICompatBackend, request: Any) -> None:
        self._backend = backend
        self._request = request

    async def __aenter__(self) -> aiohttp.ClientResponse:
        try:
            return await self._request.__aenter__()
        except TimeoutError as exc:
            raise UpstreamError(504, f"deployment {self._backend.name} timed out", retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                503, f"deployment {self._backend.name} is unreachable", retryable=True
            ) from exc

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        error = exc_info[1]
        await self._request.__aexit__(*exc_info)
        if isinstance(error, asyncio.TimeoutError):
            raise UpstreamError(504, f"deployment {self._backend.name} timed out", retryable=False) from error
        if isinstance(error, aiohttp.ClientError):
            raise UpstreamError(
                502, f"deployment {self._backend.name} broke the connection", retryable=False
            ) from error
        return None


def _upstream_message(data: bytes) -> str | None:
    try:
        error = orjson.loads(data).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return data[:200].decode("utf-8", "replace") or None
    if isinstance(error, dict):
        return str(error.get("message") or "")
    return str(error) if error else None
