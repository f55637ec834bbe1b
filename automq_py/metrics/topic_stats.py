"""Kafka's BrokerTopicMetrics: bytes and messages in and out, produce and fetch requests and
their failures, per topic (the all-topics figures are their sums). Counted where Kafka counts
them: a partition's append started or refused, a partition's read answered."""

from __future__ import annotations

import struct

_LENGTH = struct.Struct(">i")
_RECORDS_COUNT_OFFSET = 57  # a v2 batch's record count (after producer id, epoch, sequence)
_LOG_OVERHEAD = 12  # base offset and batch length, which the batch length does not count


class TopicCounters:
    __slots__ = (
        "bytes_in",
        "bytes_out",
        "failed_fetch_requests",
        "failed_produce_requests",
        "fetch_requests",
        "messages_in",
        "produce_requests",
    )

    def __init__(self) -> None:
        self.bytes_in = 0
        self.messages_in = 0
        self.produce_requests = 0
        self.failed_produce_requests = 0
        self.bytes_out = 0
        self.fetch_requests = 0
        self.failed_fetch_requests = 0


class BrokerTopicStats:
    def __init__(self) -> None:
        self.topics: dict[str, TopicCounters] = {}

    def topic(self, name: str) -> TopicCounters:
        counters = self.topics.get(name)
        if counters is None:
            counters = self.topics[name] = TopicCounters()
        return counters

    def appended(self, name: str, records: memoryview) -> None:
        counters = self.topic(name)
        counters.produce_requests += 1
        counters.bytes_in += len(records)
        counters.messages_in += record_count(records)

    def append_failed(self, name: str) -> None:
        counters = self.topic(name)
        counters.produce_requests += 1
        counters.failed_produce_requests += 1

    def fetched(self, name: str, size: int, failed: bool) -> None:
        counters = self.topic(name)
        counters.fetch_requests += 1
        counters.bytes_out += size
        if failed:
            counters.failed_fetch_requests += 1

    def remove(self, name: str) -> None:
        """A deleted topic's series go, as Kafka removes its meters."""
        self.topics.pop(name, None)


def record_count(records: memoryview) -> int:
    """The records in a produce request's v2 batches (validated already: the walk stops at
    anything short)."""
    count = 0
    position = 0
    end = len(records)
    while position + _RECORDS_COUNT_OFFSET + 4 <= end:
        count += _LENGTH.unpack_from(records, position + _RECORDS_COUNT_OFFSET)[0]
        position += _LOG_OVERHEAD + _LENGTH.unpack_from(records, position + 8)[0]
    return count
