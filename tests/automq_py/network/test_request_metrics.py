"""RequestMetrics: per-API total times and their summary lines."""

from __future__ import annotations

from automq_py.network.request_metrics import RequestMetrics
from protocol.api_keys import ApiKey


def test_percentiles_and_summary_per_api() -> None:
    metrics = RequestMetrics(window=1000)
    for i in range(1, 1001):
        metrics.record(ApiKey.PRODUCE, i / 1e6)  # 1 us .. 1 ms
    metrics.record(ApiKey.FETCH, 0.5)
    p = metrics.percentiles(ApiKey.PRODUCE)
    assert round(p["p50"], 3) == 0.501
    assert round(p["p99"], 3) == 0.991
    assert p["max"] == 1.0
    lines = metrics.summary()
    assert lines[0].startswith("request total time PRODUCE: 1000 requests, p50 0.50 ms")
    assert lines[1] == (
        "request total time FETCH: 1 requests, p50 500.00 ms, p99 500.00 ms, p99.9 500.00 ms, "
        "max 500.00 ms"
    )
    assert metrics.percentiles(ApiKey.METADATA)["max"] == 0.0


def test_only_the_latest_requests_are_kept_but_all_are_counted() -> None:
    metrics = RequestMetrics(window=10)
    for _ in range(100):
        metrics.record(ApiKey.PRODUCE, 1.0)
    for _ in range(10):
        metrics.record(ApiKey.PRODUCE, 0.001)
    assert metrics.percentiles(ApiKey.PRODUCE)["max"] == 1.0  # ms: the 1 s ones are gone
    assert "110 requests" in metrics.summary()[0]
