"""bench/lib/admission_records.py: AIPerf's per-request records read back (status, Retry-After, tokens), windows, Jain."""

import json
from pathlib import Path

from bench.lib.admission_records import jain, read_records, served_windows, summarise


def _row(start_s: float, end_s: float, status: int, tokens: tuple[int, int] = (0, 0), retry: str | None = None,
         error: dict | None = None) -> dict:  # fmt: skip
    metrics = {"time_to_first_token": {"value": 100.0, "unit": "ms"}, "inter_token_latency": {"value": 20.0},
               "usage_prompt_tokens": {"value": tokens[0]}, "usage_completion_tokens": {"value": tokens[1]}}  # fmt: skip
    headers = {"Retry-After": retry} if retry else {}
    row = {"metadata": {"request_start_ns": int(start_s * 1e9), "request_end_ns": int(end_s * 1e9)},
           "metrics": metrics if status == 200 else {},
           "trace_data": {"response_status_code": status, "response_headers": headers}}  # fmt: skip
    if error:
        row["error"] = error
    return row


def test_records_carry_status_retry_after_and_served_tokens(tmp_path: Path) -> None:
    rows = [
        _row(0.0, 1.0, 200, (90, 10)),
        _row(0.5, 0.6, 429, retry="3", error={"code": 429, "type": "HTTPError"}),
        _row(1.0, 41.0, 0, error={"type": "TimeoutError", "code": None}),
        _row(31.0, 32.0, 200, (40, 10)),
    ]
    streaming = _row(2.0, 42.0, 0, error={"type": "TimeoutError", "code": None})
    streaming["trace_data"]["response_chunks_count"] = 120  # tokens were flowing when the client gave up
    rows.append(streaming)
    (tmp_path / "profile_export.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    records = read_records(tmp_path)
    assert [r.status for r in records] == ["200", "429", "timeout", "cut_streaming", "200"]
    assert records[1].retry_after == "3" and records[0].tokens == 100
    figures = summarise(records, ttft_ms=200, itl_ms=50, window=(0.0, 60.0))
    assert figures["refused"] == {"429": {"count": 1, "with_retry_after": 1},
                                  "timeout": {"count": 1, "with_retry_after": 0},
                                  "cut_streaming": {"count": 1, "with_retry_after": 0}}  # fmt: skip
    assert figures["timeouts"] == 1 and figures["cut_streaming"] == 1
    assert figures["goodput"] == 0.4 and figures["served_tokens"] == 150
    assert served_windows(records, 0.0, 60.0, 30.0) == [100, 50]


def test_jain_is_one_for_equal_shares_and_one_over_n_for_one_taker() -> None:
    assert jain([5.0, 5.0]) == 1.0
    assert jain([10.0, 0.0]) == 0.5
    assert abs(jain([2.0, 1.5]) - 12.25 / 12.5) < 1e-12
