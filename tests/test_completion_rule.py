"""Issue 42 point 5: the "max_completion_tokens, else max_tokens" rule is written once (core/completion.py)."""

import re
from pathlib import Path

import pytest

from core.completion import requested_completion_field, requested_completion_tokens

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("core", "gateway", "routing", "cache", "policies", "backends")
READS = re.compile(r"""\.get\(\s*["']max_completion_tokens["']|\[\s*["']max_completion_tokens["']\s*\]""")


@pytest.mark.parametrize(
    ("body", "field", "value"),
    [
        ({}, "max_tokens", None),
        ({"max_tokens": 5}, "max_tokens", 5),
        ({"max_completion_tokens": 7, "max_tokens": 5}, "max_completion_tokens", 7),
        ({"max_completion_tokens": 0, "max_tokens": 5}, "max_tokens", 5),  # 0: unset, as OpenAI reads it
        ({"max_completion_tokens": None, "max_tokens": 5}, "max_tokens", 5),
    ],
)
def test_the_newer_field_wins_where_set(body: dict, field: str, value: int | None) -> None:
    assert requested_completion_field(body) == field
    assert requested_completion_tokens(body) == value


def test_only_core_completion_reads_max_completion_tokens() -> None:
    readers = {
        str(path.relative_to(REPO))
        for package in PRODUCT
        for path in (REPO / package).rglob("*.py")
        if READS.search(path.read_text())
    }
    assert readers == {"core/completion.py"}
