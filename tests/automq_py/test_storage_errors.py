"""Storage failures reach clients as Kafka error codes on a connection that stays usable
(Kafka's ReplicaManager and handleError), here with the object store really down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from protocol.errors import ErrorCode
from tests.automq_py.test_clients import create_topic
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own: it is stopped in the middle."""
    server = SeaweedFS(tmp_path / "s3", base_port=SeaweedFS.default_base_port() + 300)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def fetch(conn: RawConnection, topic: str, offset: int) -> tuple[int, int]:
    """Fetch v4 of partition 0 from ``offset``: (error code, bytes of records)."""
    t = FetchRequest.FetchTopic
    response = conn.call(
        FetchRequest[4](
            replica_id=-1,
            max_wait_ms=100,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            topics=[
                t(
                    topic=topic,
                    partitions=[
                        t.FetchPartition(
                            partition=0, fetch_offset=offset, partition_max_bytes=1 << 20
                        )
                    ],
                )
            ],
        ),
        FetchResponse,
    )
    (part,) = response.responses[0].partitions
    return part.error_code, len(part.records or b"")


def test_object_store_down_is_a_storage_error_and_the_connection_stays(
    tmp_path: Path, own_s3: SeaweedFS
) -> None:
    broker = BrokerProcess(
        tmp_path / "broker",
        {
            "s3.data.buckets": own_s3.url(),
            "cluster.id": "errors",
            "s3.request.retry.timeout.ms": "1500",
        },
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, "cold", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for _ in range(200):
            producer.produce("cold", b"x" * 1000, partition=0)
        assert producer.flush(30) == 0
        broker.stop()  # everything goes to S3; after the restart every read is cold
        broker.start()
        conn = RawConnection(broker.bootstrap)
        try:
            own_s3.stop()
            code, _ = fetch(conn, "cold", 0)
            assert code == ErrorCode.KAFKA_STORAGE_ERROR
            # the same connection still answers
            versions = conn.call(ApiVersionsRequest[0](), ApiVersionsResponse)
            assert versions.error_code == 0
            own_s3.restart()
            code, size = fetch(conn, "cold", 0)
            assert code == 0 and size > 0
        finally:
            conn.close()
        assert "KAFKA_STORAGE_ERROR" in broker.log_path.read_text()
    finally:
        assert broker.stop() == 0, broker.log_tail()
