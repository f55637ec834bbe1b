"""The metrics' pure parts: sample windows, record counts, consumer lag, S3 request stats."""

from __future__ import annotations

import struct
from collections import deque

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from automq_py.coordinator.records import OffsetValue
from automq_py.metrics.collector import _write
from automq_py.metrics.consumer_lag import group_lags
from automq_py.metrics.topic_stats import BrokerTopicStats, record_count
from automq_py.metrics.window import SampleWindow, latest
from protocol import record_batch
from storage.operator.base import LATENCY_BUCKETS_S, RequestStats


def test_a_window_keeps_the_latest_samples_and_counts_them_all() -> None:
    window = SampleWindow(4)
    for v in range(1, 11):
        window.add(float(v))
    assert window.count == 10 and window.total == 55.0
    assert window.samples() == [7.0, 8.0, 9.0, 10.0]
    assert sorted(window.latest()) == window.sorted() == [7.0, 8.0, 9.0, 10.0]
    assert sorted(window.latest(3)) == [8.0, 9.0, 10.0]  # across the ring's wrap
    window.add(11.0)
    window.add(12.0)  # the ring's next slot is 2 now
    assert sorted(window.latest(2)) == [11.0, 12.0]
    assert sorted(window.latest(3)) == [10.0, 11.0, 12.0]
    growing = SampleWindow(100)
    for v in range(10):
        growing.add(float(v))
    assert sorted(growing.latest(3)) == [7.0, 8.0, 9.0]
    assert sorted(latest(deque(range(10)), 3)) == [7, 8, 9]


def batch(records: int) -> bytes:
    """A v2 batch header claiming ``records`` records (what record_count reads), no body."""
    header = bytearray(61)
    struct.pack_into(">qi", header, 0, 0, len(header) - 12)
    header[record_batch.MAGIC_OFFSET] = 2
    struct.pack_into(">i", header, 57, records)
    return bytes(header)


def test_record_count_sums_every_batch_of_a_request() -> None:
    assert record_count(memoryview(batch(3) + batch(5) + batch(1))) == 9
    assert record_count(memoryview(b"")) == 0
    stats = BrokerTopicStats()
    stats.appended("t", memoryview(batch(3) + batch(2)))
    stats.append_failed("t")
    stats.fetched("t", 100, failed=False)
    stats.fetched("t", 0, failed=True)
    t = stats.topic("t")
    assert (t.messages_in, t.produce_requests, t.failed_produce_requests) == (5, 2, 1)
    assert (t.bytes_out, t.fetch_requests, t.failed_fetch_requests) == (100, 2, 1)
    stats.remove("t")
    assert stats.topics == {}


def test_lag_is_the_high_watermark_minus_the_committed_offset() -> None:
    offsets = {
        "g2": {("a", 0): OffsetValue(5)},
        "g1": {("a", 1): OffsetValue(10), ("a", 0): OffsetValue(7), ("b", 0): OffsetValue(3)},
    }
    ends = {("a", 0): 10, ("a", 1): 10}  # b-0 is not led here: no lag for it
    assert list(group_lags(offsets, ends)) == [
        ("g1", "a", [(0, 7, 3), (1, 10, 0)]),
        ("g2", "a", [(0, 5, 5)]),
    ]
    # an offset past the end (the log was truncated) is no negative lag
    assert list(group_lags({"g": {("a", 0): OffsetValue(12)}}, ends)) == [("g", "a", [(0, 12, 0)])]


def test_operation_stats_travel_from_the_upload_worker_as_differences() -> None:
    worker = RequestStats()
    worker.put += 2
    worker.timed("PutObject", 0.004, failed=False)
    worker.timed("PutObject", 30.0, failed=True)
    before = RequestStats().full_snapshot()
    now = worker.full_snapshot()
    broker = RequestStats()
    broker.add({k: v - before.get(k, 0) for k, v in now.items()})
    put = broker.operations["PutObject"]
    assert broker.put == 2 and (put.attempts, put.errors) == (2, 1)
    assert put.micros == 30_004_000
    assert put.buckets[LATENCY_BUCKETS_S.index(0.005)] == 1 and put.buckets[-1] == 1
    assert "operations" not in broker.snapshot()


def test_the_text_is_what_prometheus_client_writes_and_parses_back() -> None:
    counter = CounterMetricFamily("t_bytes", "a \\ doc\nof two lines", labels=["topic"])
    counter.add_metric(['we"ird\\to\npic'], 3)
    counter.add_metric(["plain"], 2.5)
    summary = Metric("t_ms", "a summary", "summary")
    summary.add_sample("t_ms_count", {"request": "Produce"}, 7)
    summary.add_sample("t_ms", {"quantile": "0.99", "request": "Produce"}, float("inf"))
    gauge = GaugeMetricFamily("t_free", "free", value=float("nan"))
    families = [counter, summary, gauge]
    out: list[str] = []
    for family in families:
        _write(family, out)
    text = "".join(out)

    class Registry:
        def collect(self) -> list[Metric]:
            return families

    # (the same bytes, labels given in order: prometheus-client sorts them, which costs)
    assert text.encode() == generate_latest(Registry())  # type: ignore[arg-type]
    parsed = {m.name: m for m in text_string_to_metric_families(text)}
    assert parsed["t_bytes"].samples[0].labels == {"topic": 'we"ird\\to\npic'}
    assert parsed["t_ms"].samples[1].value == float("inf")
