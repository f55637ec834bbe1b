"""Produce validation a client can only reach by hand: a batch whose CRC is right but whose
records do not read (a codec stream that does not decompress, a record count that lies) is
refused with INVALID_RECORD, as Kafka's LogValidator refuses it, and never reaches the log;
the connection goes on serving. The tests share one broker, each with its own topic."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import NewTopic
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.records import Compression, RecordInput, build_batch, parse_records
from tests.automq_py.apis.test_admin import admin_for, create_topics
from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection, fetch_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


def _produce(conn: RawConnection, topic: str, batch: bytes) -> tuple[int, str | None]:
    request = ProduceRequest[9](
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)
                ],
            )
        ],
    )
    response = conn.call(request, ProduceResponse[9])
    partition = response.responses[0].partition_responses[0]
    return partition.error_code, partition.error_message


def _unreadable(codec: Compression) -> bytes:
    """A batch of ``codec`` whose records section is noise, its CRC recomputed."""
    batch = bytearray(
        build_batch([RecordInput(b"v%d" % i, b"k") for i in range(5)], compression=codec)
    )
    size = len(batch) - record_batch.HEADER_SIZE
    batch[record_batch.HEADER_SIZE :] = (bytes(range(7, 256)) * 64)[:size]
    record_batch.rewrite_crc(batch)
    return bytes(batch)


def _count_lies() -> bytes:
    batch = bytearray(build_batch([RecordInput(b"v%d" % i, b"k") for i in range(5)]))
    struct.pack_into(">i", batch, 57, 4)  # records count: 4 of the 5
    struct.pack_into(">i", batch, 23, 3)  # lastOffsetDelta to match, so only the count lies
    record_batch.rewrite_crc(batch)
    return bytes(batch)


def _span_lies(count: int, last_offset_delta: int) -> bytes:
    """A batch whose header's count and offset range disagree (Kafka's LogValidator refuses
    it INVALID_RECORD: "Inconsistent batch offset range", "invalid offset range")."""
    batch = bytearray(build_batch([RecordInput(b"v%d" % i, b"k") for i in range(5)]))
    struct.pack_into(">i", batch, 57, count)
    struct.pack_into(">i", batch, 23, last_offset_delta)
    record_batch.rewrite_crc(batch)
    return bytes(batch)


@pytest.mark.parametrize(
    "bad",
    [
        *(pytest.param(_unreadable(c), id=c.name) for c in Compression),
        pytest.param(_count_lies(), id="count"),
        pytest.param(_span_lies(5, 3), id="offset-range"),
        pytest.param(_span_lies(0, -1), id="empty-range"),
    ],
)
def test_a_batch_whose_records_do_not_read_is_refused(broker: BrokerProcess, bad: bytes) -> None:
    topic = f"validate-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    good = bytes(build_batch([RecordInput(b"good", b"k")], compression=Compression.GZIP))
    conn = RawConnection(broker.bootstrap)
    try:
        code, message = _produce(conn, topic, bad)
        assert code == ErrorCode.INVALID_RECORD, message
        assert message
        # the same connection goes on, and the log holds only what was accepted
        assert _produce(conn, topic, good) == (ErrorCode.NONE, None)
        fetched = conn.call(fetch_request(topic, {0: 0}), FetchResponse)
    finally:
        conn.close()
    data = memoryview(fetched.responses[0].partitions[0].records or b"")
    batches = [bytes(view) for _, view in record_batch.iter_batches(data)]
    assert [r.value for b in batches for r in parse_records(b)] == [b"good"]


def test_a_failed_acks_0_produce_closes_the_connection(broker: BrokerProcess) -> None:
    """No response can tell an acks=0 producer that a partition refused its records: Kafka
    closes the connection, so the producer finds out and refreshes its metadata. A
    successful one leaves the connection serving."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    from tests.support.raw_connection import partition_produce_request

    topic = f"acks0-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    batch = bytes(build_batch([RecordInput(b"v", b"k")]))
    with RawConnection(broker.bootstrap) as conn:
        conn.send(conn.frame(partition_produce_request(topic, 0, batch, acks=0))[1])
        answer = conn.call(MetadataRequest[1](topics=[topic]), MetadataResponse[1])
        assert [t.name for t in answer.topics] == [topic]
        for missing in ((topic, 3), (f"absent-{topic}", 0)):
            with RawConnection(broker.bootstrap) as closing:
                request = partition_produce_request(*missing, batch, acks=0)
                closing.send(closing.frame(request)[1])
                closing.sock.settimeout(10)
                assert closing.sock.recv(1) == b"", f"{missing}: the connection stayed open"


def _batch(value: bytes, codec: Compression = Compression.NONE) -> bytes:
    return bytes(build_batch([RecordInput(value, b"k")], compression=codec))


def test_a_produce_request_holds_one_magic_2_batch_per_partition(broker: BrokerProcess) -> None:
    """Kafka's own rules for a Produce request's records, checked before the partition reads
    them: at least and at most one batch, of magic 2; zstd only from v7 (KIP-110). Nothing of
    a refused request reaches the log."""
    from tests.support.raw_connection import partition_produce_request

    topic = f"one-batch-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    legacy = bytes(8) + (14).to_bytes(4, "big") + bytes(4) + b"\x01" + bytes(9)
    refused = [
        (9, b"", ErrorCode.INVALID_RECORD),
        (9, _batch(b"a") + _batch(b"b"), ErrorCode.INVALID_RECORD),
        (9, legacy, ErrorCode.INVALID_RECORD),
        (6, _batch(b"z", Compression.ZSTD), ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
    ]
    with RawConnection(broker.bootstrap) as conn:
        for version, records, code in refused:
            answer = conn.call(
                partition_produce_request(topic, 0, records, version=version),
                ProduceResponse[version],
            )
            partition = answer.responses[0].partition_responses[0]
            assert partition.error_code == code, (version, records[:20], partition)
        answer = conn.call(
            partition_produce_request(topic, 0, _batch(b"z", Compression.ZSTD), version=7),
            ProduceResponse[7],
        )
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        fetched = conn.call(fetch_request(topic, {0: 0}, version=10), FetchResponse[10])
    data = memoryview(fetched.responses[0].partitions[0].records or b"")
    batches = [bytes(view) for _, view in record_batch.iter_batches(data)]
    assert [r.value for b in batches for r in parse_records(b)] == [b"z"]


def test_a_zstd_topic_is_not_fetched_below_v10(broker: BrokerProcess) -> None:
    """A consumer whose Fetch predates zstd (v9 and older) gets UNSUPPORTED_COMPRESSION_TYPE
    for a partition of a ``compression.type=zstd`` topic, as Kafka answers it, where it could
    not read the batches; a topic of another codec serves it."""
    zstd, gzip = (f"{c}-{uuid.uuid4().hex[:8]}" for c in ("zstd", "gzip"))
    create_topics(
        admin_for(broker),
        NewTopic(zstd, 1, 1, config={"compression.type": "zstd"}),
        NewTopic(gzip, 1, 1, config={"compression.type": "gzip"}),
    )
    with RawConnection(broker.bootstrap) as conn:
        for topic in (zstd, gzip):
            assert _produce(conn, topic, _batch(b"v")) == (ErrorCode.NONE, None)
        for version in (4, 9, 10):
            for topic in (zstd, gzip):
                answer = conn.call(
                    fetch_request(topic, {0: 0}, version=version), FetchResponse[version]
                )
                partition = answer.responses[0].partitions[0]
                refused = topic == zstd and version < 10
                expected = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE if refused else ErrorCode.NONE
                assert partition.error_code == expected, (topic, version)
                assert bool(partition.records) is not refused, (topic, version)


def test_transactional_records_without_a_transactional_id_are_refused(
    broker: BrokerProcess,
) -> None:
    """Kafka refuses a Produce holding a transactional batch but naming no transactional id
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition): no coordinator would end the
    transaction it opened, and read_committed consumers would wait on it for ever."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

    from tests.support.raw_connection import partition_produce_request

    topic = f"no-txn-id-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    transactional = bytes(
        build_batch(
            [RecordInput(b"v", b"k")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
    )
    t = ListOffsetsRequest.ListOffsetsTopic
    stable = ListOffsetsRequest[7](
        replica_id=-1,
        isolation_level=1,
        topics=[
            t(name=topic, partitions=[t.ListOffsetsPartition(partition_index=0, timestamp=-1)])
        ],
    )
    with RawConnection(broker.bootstrap) as conn:
        answer = conn.call(partition_produce_request(topic, 0, transactional), ProduceResponse[9])
        refused = answer.responses[0].partition_responses[0]
        assert refused.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert _produce(conn, topic, _batch(b"plain")) == (ErrorCode.NONE, None)
        # nothing holds the stable offset back: the plain record is readable committed
        listed = conn.call(stable, ListOffsetsResponse).topics[0].partitions[0]
        assert listed.offset == 1


def test_a_batch_recompressed_past_max_message_bytes_is_too_large(broker: BrokerProcess) -> None:
    """As Kafka's UnifiedLog.append checks a batch again once its size may have changed: a
    zstd batch within max.message.bytes that the topic's compression.type=uncompressed makes
    larger than it is refused MESSAGE_TOO_LARGE (the Java producer splits such a batch)."""
    topic = f"recompressed-{uuid.uuid4().hex[:8]}"
    create_topics(
        admin_for(broker),
        NewTopic(
            topic, 1, 1, config={"compression.type": "uncompressed", "max.message.bytes": "4000"}
        ),
    )
    small = bytes(build_batch([RecordInput(b"x" * 8000, b"k")], compression=Compression.ZSTD))
    assert len(small) < 4000
    with RawConnection(broker.bootstrap) as conn:
        code, message = _produce(conn, topic, small)
        assert code == ErrorCode.MESSAGE_TOO_LARGE, message
        fine = bytes(build_batch([RecordInput(b"x" * 100, b"k")], compression=Compression.ZSTD))
        assert _produce(conn, topic, fine) == (ErrorCode.NONE, None)


def test_invalid_acks_leave_unknown_partitions_their_own_error(broker: BrokerProcess) -> None:
    """As Kafka: the partitions refused or unknown keep their errors, the others of a request
    with acks neither -1, 0 nor 1 are INVALID_REQUIRED_ACKS."""
    topic = f"acks-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    batch = bytes(build_batch([RecordInput(b"v", b"k")]))
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](
        transactional_id=None,
        acks=2,
        timeout_ms=10_000,
        topic_data=[
            data(name=name, partition_data=[data.PartitionProduceData(index=0, records=batch)])
            for name in (topic, f"absent-{topic}")
        ],
    )
    with RawConnection(broker.bootstrap) as conn:
        response = conn.call(request, ProduceResponse[9])
    errors = {t.name: t.partition_responses[0].error_code for t in response.responses}
    assert errors == {
        topic: ErrorCode.INVALID_REQUIRED_ACKS,
        f"absent-{topic}": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
