"""The usage writer keeps records while the database is away and writes them when it returns."""

import asyncio
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from policies.db import create_engine
from policies.metrics import USAGE_RECORDS_BUFFERED, USAGE_RECORDS_DROPPED, USAGE_WRITE_FAILURES
from policies.tables import Base, UsageRow, utcnow
from policies.usage_writer import UsageWriter


def record(i: int) -> dict[str, Any]:
    return {"ts": utcnow(), "request_id": f"r{i}", "tenant_id": "t", "key_id": "k", "model": "m",
            "deployment": "d", "endpoint": "chat", "status": 200}  # fmt: skip


async def count_rows(engine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(UsageRow))).scalar_one()


async def test_records_wait_for_the_database_and_are_written_after_it_returns(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")  # no tables yet: every write fails
    writer = UsageWriter(engine, 100, 2, flush_interval_s=0.05, retry_max_s=0.05)
    failures, buffered = USAGE_WRITE_FAILURES._value.get(), USAGE_RECORDS_BUFFERED._value.get()
    writer.start()
    for i in range(5):
        writer.submit(record(i))
    assert USAGE_RECORDS_BUFFERED._value.get() == buffered + 5
    for _ in range(200):
        if USAGE_WRITE_FAILURES._value.get() >= failures + 3:
            break
        await asyncio.sleep(0.02)
    assert USAGE_WRITE_FAILURES._value.get() >= failures + 3 and writer.buffered == 5
    async with engine.begin() as conn:  # the database "comes back"
        await conn.run_sync(Base.metadata.create_all)
    for _ in range(200):
        if writer.buffered == 0:
            break
        await asyncio.sleep(0.02)
    assert await count_rows(engine) == 5
    assert USAGE_RECORDS_BUFFERED._value.get() == buffered
    await writer.aclose()
    await engine.dispose()


async def test_a_full_buffer_drops_and_counts(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    writer = UsageWriter(engine, 3, 10, flush_interval_s=60)
    dropped = USAGE_RECORDS_DROPPED._value.get()
    for i in range(5):
        writer.submit(record(i))
    assert writer.buffered == 3 and USAGE_RECORDS_DROPPED._value.get() == dropped + 2
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    await writer.flush()
    assert await count_rows(engine) == 3
    await engine.dispose()


async def test_shutdown_gives_up_after_its_timeout(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")  # never gets its tables
    writer = UsageWriter(engine, 10, 10, flush_interval_s=0.05, retry_max_s=0.05, shutdown_timeout_s=0.3)
    writer.start()
    dropped, buffered = USAGE_RECORDS_DROPPED._value.get(), USAGE_RECORDS_BUFFERED._value.get()
    for i in range(4):
        writer.submit(record(i))
    started = asyncio.get_running_loop().time()
    await writer.aclose()
    assert asyncio.get_running_loop().time() - started < 5
    assert writer.buffered == 0 and USAGE_RECORDS_DROPPED._value.get() == dropped + 4
    assert USAGE_RECORDS_BUFFERED._value.get() == buffered
    await engine.dispose()


async def test_a_flush_under_steady_load_ends_and_writes_full_batches(tmp_path: Path) -> None:
    """Records that arrive while a flush writes wait for the next one (no endless run of tiny batches)."""
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'usage.db'}")
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    writer = UsageWriter(engine, 100, 2, flush_interval_s=60)
    for i in range(5):
        writer.submit(record(i))
    write_head, arrivals = writer._write_head, iter(range(100, 200))

    async def write_while_requests_arrive(at_most: int) -> int:
        writer.submit(record(next(arrivals)))  # a request ends during every write
        return await write_head(at_most)

    writer._write_head = write_while_requests_arrive  # type: ignore[method-assign]
    await asyncio.wait_for(writer.flush(), 5)
    assert await count_rows(engine) == 5 and writer.buffered == 3  # 3 writes (2 + 2 + 1), 3 arrivals
    await engine.dispose()
