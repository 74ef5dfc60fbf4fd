"""Usage records written off the request path: a bounded queue drained in batches by one task."""

import asyncio
import logging
from contextlib import suppress
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from policies.metrics import USAGE_RECORDS_DROPPED, USAGE_RECORDS_WRITTEN
from policies.tables import UsageRow

log = logging.getLogger(__name__)


class UsageWriter:
    def __init__(
        self, engine: AsyncEngine, queue_size: int, batch_size: int, flush_interval_s: float
    ) -> None:
        self._engine = engine
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(queue_size)
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-writer")

    def submit(self, record: dict[str, Any]) -> None:
        """Never blocks: a full queue drops the record (counted and logged)."""
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            USAGE_RECORDS_DROPPED.inc()
            log.warning("usage writer queue full; dropped a usage record")

    async def flush(self) -> None:
        """Write everything queued so far (used on shutdown and by tests)."""
        while not self._queue.empty():
            await self._write(self._take_batch())

    async def aclose(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
        await self.flush()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval)
            await self.flush()

    def _take_batch(self) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        while not self._queue.empty() and len(batch) < self._batch_size:
            batch.append(self._queue.get_nowait())
        return batch

    async def _write(self, batch: list[dict[str, Any]]) -> None:
        if not batch:
            return
        try:
            async with self._engine.begin() as conn:
                await conn.execute(insert(UsageRow), batch)
            USAGE_RECORDS_WRITTEN.inc(len(batch))
        except Exception:
            USAGE_RECORDS_DROPPED.inc(len(batch))
            log.exception("writing %d usage records failed; they are dropped", len(batch))
