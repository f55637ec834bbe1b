"""Idempotent producers against the real broker process on the real S3 server: InitProducerId,
per-partition sequence checks, duplicates answered with the original offset, across kill -9.
The tests that neither stop nor kill their broker share one, each with its own topic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from protocol.errors import ErrorCode
from protocol.records import Compression, RecordInput, build_batch
from tests.automq_py.apis.test_config_surface import alter_cluster_defaults
from tests.automq_py.clients.test_clients import PARTITIONS, N, consume_and_check, create_topic
from tests.automq_py.conftest import MakeBroker, module_broker
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration


def init_producer_id(conn: RawConnection, producer_id: int = -1, epoch: int = -1) -> Any:
    return conn.call(
        InitProducerIdRequest[4](
            transactional_id=None,
            transaction_timeout_ms=60000,
            producer_id=producer_id,
            producer_epoch=epoch,
        ),
        InitProducerIdResponse,
    )


def produce(
    conn: RawConnection, topic: str, producer_id: int, epoch: int, seq: int, count: int = 3
) -> tuple[int, int]:
    """Send one idempotent batch to partition 0 with acks=all: ``(error code, base offset)``."""
    part = produce_answer(conn, topic, producer_id, epoch, seq, count)
    return part.error_code, part.base_offset


def produce_answer(
    conn: RawConnection, topic: str, producer_id: int, epoch: int, seq: int, count: int = 3
) -> Any:
    """:func:`produce`'s partition response, whole."""
    batch = build_batch(
        [RecordInput(f"v{seq + i}".encode(), b"k", [], 1_700_000_000_000) for i in range(count)],
        compression=Compression.LZ4,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    topic_data = ProduceRequest.TopicProduceData
    response = conn.call(
        ProduceRequest[9](
            transactional_id=None,
            acks=-1,
            timeout_ms=10000,
            topic_data=[
                topic_data(
                    name=topic,
                    partition_data=[topic_data.PartitionProduceData(index=0, records=bytes(batch))],
                )
            ],
        ),
        ProduceResponse,
    )
    (part,) = response.responses[0].partition_responses
    return part


def log_end(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
        return int(high)
    finally:
        consumer.close()


# -- InitProducerId -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """The module's broker, for the tests that neither stop nor kill it."""
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


def test_init_producer_id_gives_new_ids(make_broker: MakeBroker) -> None:
    broker = make_broker()
    conn = RawConnection(broker.bootstrap)
    try:
        first, second = init_producer_id(conn), init_producer_id(conn)
        assert first.error_code == second.error_code == ErrorCode.NONE
        assert first.producer_id >= 0 and second.producer_id > first.producer_id
        assert first.producer_epoch == second.producer_epoch == 0
        # a producer resetting its sequences (KIP-360) gets a new id, as from Kafka
        reset = init_producer_id(conn, first.producer_id, 0)
        assert reset.error_code == ErrorCode.NONE
        assert reset.producer_id > second.producer_id and reset.producer_epoch == 0
        exhausted = init_producer_id(conn, reset.producer_id, 32766)
        assert exhausted.producer_id > reset.producer_id
        assert exhausted.producer_epoch == 0
        # an id without its epoch, or an epoch without its id, as Kafka answers them
        for pair in ((reset.producer_id, -1), (-1, 0)):
            assert init_producer_id(conn, *pair).error_code == ErrorCode.INVALID_REQUEST
        # a transactional id gets an id of the same blocks, then its epoch bumped
        transactional, again = (
            conn.call(
                InitProducerIdRequest[4](transactional_id="txn", transaction_timeout_ms=60000),
                InitProducerIdResponse,
            )
            for _ in range(2)
        )
        assert transactional.error_code == again.error_code == ErrorCode.NONE
        assert transactional.producer_id not in (first.producer_id, exhausted.producer_id)
        assert (again.producer_id, again.producer_epoch) == (transactional.producer_id, 1)
    finally:
        conn.close()
    broker.kill()  # ids of the reserved block are never handed out again
    broker.start()
    conn = RawConnection(broker.bootstrap)
    try:
        after = init_producer_id(conn)
        assert after.producer_id > exhausted.producer_id
    finally:
        conn.close()


# -- duplicates and sequence errors at the protocol level ------------------------------------------


def test_a_retried_produce_is_answered_with_the_original_offset(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "dedup", 1)
    conn = RawConnection(broker.bootstrap)
    try:
        pid = init_producer_id(conn).producer_id
        assert produce(conn, "dedup", pid, 0, 0) == (ErrorCode.NONE, 0)
        assert produce(conn, "dedup", pid, 0, 3) == (ErrorCode.NONE, 3)
        assert produce(conn, "dedup", pid, 0, 0) == (ErrorCode.NONE, 0)  # the same batch again
        # the duplicate's log append time is the original's max timestamp, as in Kafka
        retried = produce_answer(conn, "dedup", pid, 0, 3)
        assert (retried.error_code, retried.base_offset) == (ErrorCode.NONE, 3)
        assert retried.log_append_time_ms == 1_700_000_000_000
        assert log_end(broker.bootstrap, "dedup") == 6  # nothing appended twice
        assert produce(conn, "dedup", pid, 0, 9)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(conn, "dedup", pid, 1, 5)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert produce(conn, "dedup", pid, 1, 0) == (ErrorCode.NONE, 6)  # a new epoch at 0
        assert produce(conn, "dedup", pid, 0, 6)[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        assert log_end(broker.bootstrap, "dedup") == 9
    finally:
        conn.close()
    # each refusal logged, as Kafka's ReplicaManager logs them: what a client did next follows
    refused = [
        line for line in broker.log_path.read_text().splitlines() if "dedup-0 refused" in line
    ]
    assert [line.split(" refused: ")[1].split(":")[0] for line in refused] == [
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "OUT_OF_ORDER_SEQUENCE_NUMBER",
        "INVALID_PRODUCER_EPOCH",
    ], refused
    assert f"producer {pid} sent sequence 9, expected 6" in refused[0]


def test_a_retried_produce_to_a_log_append_time_topic_gets_the_original_append_time(
    broker: BrokerProcess,
) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = NewTopic("dedup-append-time", 1, 1, config={"message.timestamp.type": "LogAppendTime"})
    for future in admin.create_topics([topic]).values():
        future.result(15)
    conn = RawConnection(broker.bootstrap)
    try:
        pid = init_producer_id(conn).producer_id
        first = produce_answer(conn, "dedup-append-time", pid, 0, 0)
        assert first.error_code == ErrorCode.NONE and first.log_append_time_ms > 1_700_000_000_000
        time.sleep(0.01)  # a new append now would get a later time
        again = produce_answer(conn, "dedup-append-time", pid, 0, 0)
        assert (again.error_code, again.base_offset) == (ErrorCode.NONE, first.base_offset)
        assert again.log_append_time_ms == first.log_append_time_ms
    finally:
        conn.close()


def test_a_batch_refused_before_it_was_appended_is_owed_before_the_next(
    broker: BrokerProcess,
) -> None:
    """A new producer's first batch is refused with an error the client retries (here: the
    topic is not there yet, as for a broker whose metadata lags its creation); its next batch,
    sent before the refusal came back, arrives once the partition can take it. Taking that one
    would leave the first out (a partition takes any sequence from a producer it does not know)
    and librdkafka would report the first delivered when the second is: it is refused the same
    way until the first comes again."""
    conn = RawConnection(broker.bootstrap)
    try:
        pid = init_producer_id(conn).producer_id
        early = produce(conn, "owed", pid, 0, 0)
        assert early[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        create_topic(broker.bootstrap, "owed", 1)
        assert produce(conn, "owed", pid, 0, 3)[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert produce(conn, "owed", pid, 0, 0) == (ErrorCode.NONE, 0)  # the retry
        assert produce(conn, "owed", pid, 0, 3) == (ErrorCode.NONE, 3)
        # another producer, never refused, starts where it likes (KIP-360)
        other = init_producer_id(conn).producer_id
        assert produce(conn, "owed", other, 0, 12) == (ErrorCode.NONE, 6)
        assert log_end(broker.bootstrap, "owed") == 9
    finally:
        conn.close()


def test_idle_producers_are_forgotten_after_producer_id_expiration_ms(
    make_broker: MakeBroker,
) -> None:
    """``producer.id.expiration.ms`` is a dynamic cluster-wide config, as in Kafka, and the
    leaders check for idle producers every ``producer.id.expiration.check.interval.ms``: a
    producer forgotten may start at any sequence (KIP-360), one still known may not."""
    broker = make_broker(**{"producer.id.expiration.check.interval.ms": "300"})
    create_topic(broker.bootstrap, "expiring", 1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    conn = RawConnection(broker.bootstrap)
    try:
        pid = init_producer_id(conn).producer_id
        assert produce(conn, "expiring", pid, 0, 0) == (ErrorCode.NONE, 0)
        time.sleep(1.0)  # a few checks: 24 h by default
        assert produce(conn, "expiring", pid, 0, 9)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        alter_cluster_defaults(broker, producer_id_expiration_ms="500")
        described = admin.describe_configs([ConfigResource(ResourceType.BROKER, "0")])
        (config,) = (future.result(15) for future in described.values())
        value = config["producer.id.expiration.ms"]
        assert (value.value, value.is_read_only) == ("500", False)
        assert value.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        time.sleep(1.5)
        assert produce(conn, "expiring", pid, 0, 9) == (ErrorCode.NONE, 3)  # a stranger now
        assert produce(conn, "expiring", pid, 0, 15)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    finally:
        conn.close()
    assert "forgot 1 producer ids idle for producer.id.expiration.ms" in broker.log_path.read_text()


def test_duplicates_are_recognised_after_kill_9_and_restart(make_broker: MakeBroker) -> None:
    broker = make_broker()
    create_topic(broker.bootstrap, "dedup-crash", 1)
    conn = RawConnection(broker.bootstrap)
    pid = init_producer_id(conn).producer_id
    assert produce(conn, "dedup-crash", pid, 0, 0) == (ErrorCode.NONE, 0)
    conn.close()
    broker.kill()  # no snapshot yet: the state is rebuilt from the log's batches
    broker.start()
    conn = RawConnection(broker.bootstrap)
    assert produce(conn, "dedup-crash", pid, 0, 0) == (ErrorCode.NONE, 0)
    assert produce(conn, "dedup-crash", pid, 0, 3) == (ErrorCode.NONE, 3)
    conn.close()
    assert log_end(broker.bootstrap, "dedup-crash") == 6
    assert broker.stop() == 0  # a clean stop snapshots the state in PRODUCER_SNAPSHOTS
    broker.start()
    conn = RawConnection(broker.bootstrap)
    assert produce(conn, "dedup-crash", pid, 0, 3) == (ErrorCode.NONE, 3)
    assert produce(conn, "dedup-crash", pid, 0, 6) == (ErrorCode.NONE, 6)
    conn.close()
    broker.kill()  # snapshot at 6 plus the batch after it
    broker.start()
    conn = RawConnection(broker.bootstrap)
    try:
        for seq in (0, 3, 6):
            assert produce(conn, "dedup-crash", pid, 0, seq) == (ErrorCode.NONE, seq)
        assert produce(conn, "dedup-crash", pid, 0, 12)[0] == (
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        )
        assert produce(conn, "dedup-crash", pid, 0, 9) == (ErrorCode.NONE, 9)
    finally:
        conn.close()
    assert log_end(broker.bootstrap, "dedup-crash") == 12


# -- real clients ---------------------------------------------------------------------------------


def test_kafka_python_idempotent_producer_round_trip(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaTopicPartition

    create_topic(broker.bootstrap, "kp-idem")
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)  # idempotent
    futures = []
    for i in range(3000):
        key, value = f"key-{i}".encode(), f"value-{i}".encode()
        futures.append((key, value, producer.send("kp-idem", value, key=key)))
    producer.flush(30)
    producer_id = producer._transaction_manager.producer_id_and_epoch.producer_id
    producer.close()
    assert producer_id >= 0  # the producer was idempotent, with an id from InitProducerId
    expected: dict[int, dict[int, tuple[bytes, bytes]]] = {p: {} for p in range(PARTITIONS)}
    for key, value, future in futures:
        md = future.get(timeout=10)
        expected[md.partition][md.offset] = (key, value)
    for p in range(PARTITIONS):  # offsets are dense from 0: every record once
        assert sorted(expected[p]) == list(range(len(expected[p])))

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=10000
    )
    consumer.assign([KafkaTopicPartition("kp-idem", p) for p in range(PARTITIONS)])
    for p in range(PARTITIONS):
        consumer.seek(KafkaTopicPartition("kp-idem", p), 0)
    got: dict[int, dict[int, tuple[bytes, bytes]]] = {p: {} for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < 3000 and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=1000).items():
            for r in records:
                assert r.offset not in got[tp.partition]
                got[tp.partition][r.offset] = (r.key, r.value)
    consumer.close()
    assert got == expected


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_idempotent_round_trip(broker: BrokerProcess, compression: str) -> None:
    topic = f"idem-{compression}"
    create_topic(broker.bootstrap, topic)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "compression.type": compression,
            "linger.ms": 5,
        }
    )
    expected: dict[int, list[tuple[Any, ...]]] = {p: [] for p in range(PARTITIONS)}
    base_ts = int(time.time() * 1000)
    for i in range(N):
        p = i % PARTITIONS
        key, value, ts = f"key-{i}".encode(), f"value-{i}-{'y' * (i % 40)}".encode(), base_ts + i
        headers: list[tuple[str, str | bytes | None]] = [("index", str(i).encode())]
        producer.produce(topic, value, key, partition=p, timestamp=ts, headers=headers)
        expected[p].append((key, value, ts, headers))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    consume_and_check(broker.bootstrap, topic, expected)  # exactly once, in order
