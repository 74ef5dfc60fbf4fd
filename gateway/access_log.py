"""One JSON line per request on the `llmgw.access` logger.

A line holds who asked (tenant, key prefix), what (model alias, endpoint), how it was served (deployment,
cache status, cascade decision), usage (tokens, cost), timing and the status. It never holds API keys or
headers; prompt and response text only when ObservabilitySettings.access_log_bodies is on, cut to
access_log_body_chars. The structured dict also travels as `record.access` for custom handlers.
"""

import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from core.context import RequestContext
from gateway.metrics import Outcome
from gateway.observability_config import ObservabilitySettings

LOGGER_NAME = "llmgw.access"


class AccessLog:
    def __init__(self, settings: ObservabilitySettings, logger: logging.Logger) -> None:
        self._settings = settings
        self._logger = logger

    @property
    def wants_bodies(self) -> bool:
        return self._settings.access_log and self._settings.access_log_bodies

    def write(
        self,
        ctx: RequestContext,
        outcome: Outcome,
        error: str | None = None,
        response_text: str | None = None,
    ) -> None:
        if not self._settings.access_log or not self._logger.isEnabledFor(logging.INFO):
            return
        entry = access_entry(ctx, outcome, error)
        if ctx.extra_params:
            entry["extra_params"] = extra_params(ctx, self._settings.sensitive_params)
        if self.wants_bodies:
            limit = self._settings.access_log_body_chars
            entry["prompt"] = prompt_text(ctx.body)[:limit]
            entry["response"] = (response_text or "")[:limit]
        line = orjson.dumps(entry).decode()
        handler = _sole_line_handler(self._logger)
        if handler is not None:  # the default set-up: no LogRecord (measured: 23 → 8 µs per line)
            handler.add_line(line)
            return
        record = logging.LogRecord(LOGGER_NAME, logging.INFO, __file__, 0, line, None, None)
        record.access = entry
        self._logger.handle(record)  # as logger.info(), without its costly caller lookup


def _sole_line_handler(logger: logging.Logger) -> "BufferedLineHandler | None":
    """The handler configure_access_logger() set, when nothing else (handler, filter) would see a record."""
    handlers = logger.handlers
    if len(handlers) != 1 or logger.filters:
        return None
    handler = handlers[0]
    if not getattr(handler, "_llmgw_access", False) or handler.filters:
        return None
    return handler  # type: ignore[return-value]


def access_entry(ctx: RequestContext, outcome: Outcome, error: str | None) -> dict[str, Any]:
    principal = ctx.principal
    return {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "request_id": ctx.request_id,
        "tenant": principal.tenant_id if principal else None,
        "key_prefix": principal.key_prefix if principal else None,
        "model": ctx.model,
        "endpoint": ctx.endpoint,
        "stream": ctx.stream,
        "deployment": ctx.deployment,
        "cache_status": ctx.cache_status,
        "cascade": ctx.cascade,
        "prompt_tokens": ctx.usage.prompt_tokens,
        "completion_tokens": ctx.usage.completion_tokens,
        "cached_tokens": ctx.usage.cached_tokens,
        "cost_usd": round(ctx.cost_usd, 8),
        "latency_ms": round(outcome.e2e_s * 1000, 3),
        "ttft_ms": None if outcome.ttft_s is None else round(outcome.ttft_s * 1000, 3),
        "status": outcome.status,
        "error": error,
    }


def extra_params(ctx: RequestContext, sensitive: list[str]) -> dict[str, Any]:
    """The request's non-OpenAI parameters, values of those marked sensitive replaced."""
    return {name: "[redacted]" if name in sensitive else ctx.body.get(name) for name in ctx.extra_params}


def prompt_text(body: dict[str, Any]) -> str:
    """The request's text: chat messages as `role: content` lines, or the completion/embedding input."""
    if "messages" in body:
        return "\n".join(f"{m.get('role')}: {_content_text(m.get('content'))}" for m in body["messages"])
    value = body.get("prompt", body.get("input", ""))
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def response_text(body: dict[str, Any] | None) -> str:
    """The answer's text from a non-streamed chat or completion body."""
    choices = (body or {}).get("choices") or []
    return "".join(_content_text((c.get("message") or {}).get("content") or c.get("text")) for c in choices)


def chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    return "".join(_content_text((c.get("delta") or {}).get("content") or c.get("text")) for c in choices)


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return " ".join(part.get("text", "") for part in content if isinstance(part, dict))


def configure_access_logger(stream: TextIO = sys.stdout, name: str = LOGGER_NAME) -> logging.Logger:
    """The `llmgw.access` logger (or `name`) writing bare JSON lines to `stream` (idempotent)."""
    logger = logging.getLogger(name)
    if not any(getattr(h, "_llmgw_access", False) for h in logger.handlers):
        handler = BufferedLineHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._llmgw_access = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


class BufferedLineHandler(logging.Handler):
    """Writes lines in batches: one write per `batch` lines or `interval_s`, not one syscall per request.

    A background thread flushes what waits at least every `interval_s`; close() flushes the rest.
    """

    def __init__(self, stream: TextIO, batch: int = 256, interval_s: float = 0.2) -> None:
        super().__init__()
        self._stream = stream
        self._batch = batch
        self._lines: list[str] = []
        self._stopped = threading.Event()
        self._flusher = threading.Thread(target=self._flush_every, args=(interval_s,), daemon=True)
        self._flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        self.add_line(self.format(record))

    def add_line(self, line: str) -> None:
        with self.lock:
            self._lines.append(line)
            if len(self._lines) >= self._batch:
                self.flush()

    def flush(self) -> None:
        with self.lock:
            lines, self._lines = self._lines, []
            if lines:
                self._stream.write("\n".join(lines) + "\n")
                self._stream.flush()

    def _flush_every(self, interval_s: float) -> None:
        while not self._stopped.wait(interval_s):
            self.flush()

    def close(self) -> None:
        self._stopped.set()
        self.flush()
        super().close()
