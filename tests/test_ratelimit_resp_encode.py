"""The RESP encoder (hiredis's C one) and the cached period names keep the bytes and names they had."""

from datetime import UTC, datetime

import pytest

from policies.ratelimit.plan import day_period, month_period
from policies.ratelimit.resp import encode


def reference(*parts: str | bytes | int | float) -> bytes:
    items = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
    return b"".join([b"*%d\r\n" % len(items), *(b"$%d\r\n%s\r\n" % (len(i), i) for i in items)])


@pytest.mark.parametrize(
    "parts",
    [
        ("EVALSHA", "ab12", 2, "llmgw:{t}:k:1:rpm", "x:log", "m", 60000, 30000, "R 1000 1 T 1e+12 50"),
        ("SET", b"\x00\xffbinary", 0.30000000000000004, -5, 2.5e20, 12345678901234567890),
        ("ECHO", "é ünïcode", ""),
    ],
)
def test_encode_matches_the_python_reference(parts: tuple) -> None:
    assert encode(*parts) == reference(*parts)


def test_period_names() -> None:
    now = datetime(2026, 3, 7, 23, 59, tzinfo=UTC)
    assert (day_period(now), month_period(now)) == ("d:2026-03-07", "m:2026-03")
