"""Change propagation: a reload that fails after a change message is retried within a second."""

import asyncio
import time
import uuid

from redis.asyncio import Redis

from policies.notify import ChangeNotifier
from tests.policies_support import REDIS_URL


class FlakyDirectory:
    """Fails the reloads numbered in `failing` (1-based), records when each succeeded."""

    def __init__(self, failing: set[int]) -> None:
        self.failing, self.calls, self.succeeded = failing, 0, []

    async def reload(self) -> None:
        self.calls += 1
        if self.calls in self.failing:
            raise RuntimeError("database is locked")
        self.succeeded.append(time.monotonic())


async def test_a_failed_reload_after_a_change_is_retried_until_it_succeeds():
    channel = f"llmgw-test:{uuid.uuid4().hex[:8]}:changes"
    directory = FlakyDirectory(failing={2, 3, 4})  # 1: the catch-up on subscribing
    redis = Redis.from_url(REDIS_URL)
    notifier = ChangeNotifier(directory, redis, channel, refresh_s=3600)  # type: ignore[arg-type]
    notifier.start()
    try:
        await asyncio.wait_for(notifier.subscribed.wait(), 5)
        while not directory.succeeded:
            await asyncio.sleep(0.01)
        published = time.monotonic()
        assert await redis.publish(channel, "reload") == 1
        while len(directory.succeeded) < 2:
            assert time.monotonic() - published < 1.0, "the change was not picked up within 1 s"
            await asyncio.sleep(0.01)
        assert directory.calls == 5  # three failures, then the retry that worked
    finally:
        await notifier.aclose()
        await redis.aclose()


async def test_without_failures_one_message_is_one_reload():
    channel = f"llmgw-test:{uuid.uuid4().hex[:8]}:changes"
    directory = FlakyDirectory(failing=set())
    redis = Redis.from_url(REDIS_URL)
    notifier = ChangeNotifier(directory, redis, channel, refresh_s=3600)  # type: ignore[arg-type]
    notifier.start()
    try:
        await asyncio.wait_for(notifier.subscribed.wait(), 5)
        await redis.publish(channel, "reload")
        await redis.publish(channel, "reload")
        deadline = time.monotonic() + 1.0
        while directory.calls < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert directory.calls == 3
    finally:
        await notifier.aclose()
        await redis.aclose()
