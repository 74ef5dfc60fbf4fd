"""The Backend protocol: what the router needs from anything that serves a model."""

from collections.abc import AsyncIterator
from typing import Any, Protocol

from core.errors import OpenAIError
from core.models import DeploymentConfig

PATHS = {"chat": "/chat/completions", "completions": "/completions", "embeddings": "/embeddings",
         "responses": "/responses"}  # fmt: skip


class UpstreamError(OpenAIError):
    """An error from a deployment. `retryable` errors may be retried elsewhere before the first byte.

    `retry_after_s` is the upstream's Retry-After (429/503): that deployment is not tried again before it.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retryable: bool,
        code: str | None = None,
        type: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(status, message, type=type, param=param, code=code)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class Backend(Protocol):
    name: str
    config: DeploymentConfig

    async def start(self) -> None: ...

    async def complete(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]: ...

    def stream(self, endpoint: str, body: dict[str, Any], request_id: str) -> AsyncIterator[dict[str, Any]]:
        """Yield OpenAI chunk dicts. Raises UpstreamError before the first chunk or mid-stream."""
        ...

    async def tokenize(self, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """vLLM's /tokenize answer (`count`, …) for a chat body; an UpstreamError 400 where it cannot count."""
        ...

    async def health(self) -> bool: ...

    def unready_reason(self) -> str | None:
        """Why the deployment cannot serve (e.g. its model failed to load), for /health/ready; else None."""
        ...

    async def aclose(self) -> None: ...
