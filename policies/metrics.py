"""Prometheus metrics of this package (process-wide by nature, like every prometheus_client metric)."""

from prometheus_client import Counter, Gauge

REDIS_FAILURES = Counter(
    "llmgw_ratelimit_redis_failures_total",
    "Rate-limit calls that could not reach Redis (answered by the fallback or refused)",
    ["operation", "mode"],
)
REDIS_BREAKER_OPEN = Gauge(
    "llmgw_ratelimit_redis_breaker_open", "1 while rate limiting bypasses Redis (circuit open or half-open)"
)
USAGE_RECORDS_DROPPED = Counter(
    "llmgw_usage_records_dropped_total",
    "Usage records dropped: the buffer was full, or the database was unreachable at shutdown",
)
USAGE_RECORDS_BUFFERED = Gauge(
    "llmgw_usage_records_buffered",
    "Usage records waiting to be written (they pile up while the database is away)",
    multiprocess_mode="livesum",
)
USAGE_WRITE_FAILURES = Counter(
    "llmgw_usage_write_failures_total", "Failed attempts to write a batch of usage records (retried)"
)
USAGE_RECORDS_WRITTEN = Counter("llmgw_usage_records_written_total", "Usage records written to the database")
RATE_LIMITED = Counter("llmgw_ratelimit_rejections_total", "Requests refused by a limit or budget", ["kind"])
