"""Fetch's size limits against the real broker, with raw Fetch requests over three partitions of
three equal batches each: as in Kafka's readFromLog, each partition returns at most its
partition_max_bytes and what is left of the request's max_bytes, except that until a partition
has returned data a read returns at least one batch, however large. So the only batch past
either limit is the first batch of the first partition with data."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch
from tests.automq_py.clients.test_clients import create_topic
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection, fetch_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TOPIC = "limits"
PARTITIONS = 3
BATCHES = 3  # per partition
RECORDS = 4  # per batch
BATCH = len(build_batch([RecordInput(b"v" * 1000) for _ in range(RECORDS)]))
LARGE = 1 << 20


@pytest.fixture(scope="module")
def limits_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("limits"),
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"limits{time.monotonic_ns()}"},
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        produce_batches(broker.bootstrap)
        yield broker
    finally:
        assert broker.stop() == 0, broker.log_tail()


def produce_batches(bootstrap: str) -> None:
    """BATCHES batches of BATCH bytes in each partition, one request per batch."""
    t = ProduceRequest.TopicProduceData
    conn = RawConnection(bootstrap)
    try:
        for partition in range(PARTITIONS):
            for i in range(BATCHES):
                records = bytes(
                    build_batch([RecordInput(bytes([i]) * 1000) for _ in range(RECORDS)])
                )
                request = ProduceRequest[7](
                    acks=-1,
                    timeout_ms=15_000,
                    topic_data=[
                        t(
                            name=TOPIC,
                            partition_data=[
                                t.PartitionProduceData(index=partition, records=records)
                            ],
                        )
                    ],
                )
                response = conn.call(request, ProduceResponse)
                assert response.responses[0].partition_responses[0].error_code == 0
    finally:
        conn.close()


def fetch(bootstrap: str, max_bytes: int, partition_max_bytes: int, offsets: dict[int, int]) -> Any:
    request = fetch_request(
        TOPIC,
        offsets,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        partition_max_bytes=partition_max_bytes,
        version=12,
    )
    conn = RawConnection(bootstrap)
    try:
        return conn.call(request, FetchResponse)
    finally:
        conn.close()


def batches_returned(response: Any) -> list[list[int]]:
    """Per partition (in request order), the size of each whole batch returned; checks that
    nothing else (no partial batch) came back."""
    out = []
    for part in response.responses[0].partitions:
        assert part.error_code == ErrorCode.NONE, part
        data = memoryview(part.records or b"")
        sizes = []
        pos = 0
        while pos < len(data):
            size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
            assert pos + size <= len(data), "a partial batch"
            sizes.append(size)
            pos += size
        out.append(sizes)
    return out


FROM_START = dict.fromkeys(range(PARTITIONS), 0)


@pytest.mark.parametrize(
    ("max_bytes", "partition_max_bytes", "expected"),
    [
        # room for two and a half batches: the first partition takes two, the half left
        # is no room for the second's first batch
        (BATCH * 5 // 2, LARGE, [[BATCH, BATCH], [], []]),
        # one and a half: the first batch, then nothing
        (BATCH * 3 // 2, LARGE, [[BATCH], [], []]),
        # the first batch alone is past max_bytes: it comes back, nothing after it
        (BATCH // 2, LARGE, [[BATCH], [], []]),
        # every partition's limit is below a batch (they fit in max_bytes): only the first
        # partition's first batch goes past its limit
        (LARGE, BATCH // 2, [[BATCH], [], []]),
        # plenty of room: everything
        (LARGE, LARGE, [[BATCH] * BATCHES] * PARTITIONS),
        # partition limits of one batch and a half: one batch from each
        (LARGE, BATCH * 3 // 2, [[BATCH]] * PARTITIONS),
    ],
)
def test_a_fetch_stays_within_max_bytes_but_for_the_first_batch(
    limits_broker: BrokerProcess, max_bytes: int, partition_max_bytes: int, expected: list
) -> None:
    response = fetch(limits_broker.bootstrap, max_bytes, partition_max_bytes, FROM_START)
    assert response.error_code == ErrorCode.NONE
    returned = batches_returned(response)
    assert returned == expected
    total = sum(map(sum, returned))
    first = next(sizes[0] for sizes in returned if sizes)
    assert total <= max(max_bytes, first)


@pytest.mark.parametrize("max_bytes", [BATCH // 2, LARGE])
def test_the_batch_past_the_limits_is_from_the_first_partition_with_data(
    limits_broker: BrokerProcess, max_bytes: int
) -> None:
    # partition 0 is read from its end: nothing there, so partition 1 returns the batch
    offsets = {0: BATCHES * RECORDS, 1: 0, 2: 0}
    response = fetch(limits_broker.bootstrap, max_bytes, BATCH // 2, offsets)
    assert batches_returned(response) == [[], [BATCH], []]
