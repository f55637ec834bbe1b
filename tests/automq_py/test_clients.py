"""Standard Kafka clients against the real broker process, storing in the real S3 server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3


@pytest.fixture
def broker(tmp_path: Path, s3_server: SeaweedFS) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path / "broker",
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"t{time.monotonic_ns()}"},
    )
    b.start()
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_tail()


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(15)


def produce_confluent(bootstrap: str, topic: str, compression: str) -> dict[int, list[tuple]]:
    """Produce N keyed records with headers; return what each partition should hold, in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": compression,
            "linger.ms": 5,
            "enable.idempotence": False,
        }
    )
    expected: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    base_ts = int(time.time() * 1000)
    for i in range(N):
        p = i % PARTITIONS
        key, value, ts = f"key-{i}".encode(), f"value-{i}-{'x' * (i % 50)}".encode(), base_ts + i
        headers = [("index", str(i).encode()), ("h2", b"")]
        producer.produce(topic, value, key, partition=p, timestamp=ts, headers=headers)
        expected[p].append((key, value, ts, headers))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return expected


def consume_and_check(bootstrap: str, topic: str, expected: dict[int, list[tuple]]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in expected])
    got: dict[int, list[tuple]] = {p: [] for p in expected}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < N and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        p = msg.partition()
        assert msg.offset() == len(got[p])  # offsets are dense and in order
        got[p].append((msg.key(), msg.value(), msg.timestamp()[1], msg.headers()))
    consumer.close()
    for p in expected:
        assert got[p] == expected[p], f"partition {p} differs"


@pytest.mark.parametrize("compression", ["gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_round_trip(broker: BrokerProcess, compression: str) -> None:
    topic = f"orders-{compression}"
    create_topic(broker.bootstrap, topic)
    expected = produce_confluent(broker.bootstrap, topic, compression)
    consume_and_check(broker.bootstrap, topic, expected)


def test_acknowledged_records_survive_kill_9(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "durable")
    expected = produce_confluent(broker.bootstrap, "durable", "lz4")
    broker.kill()
    broker.start()
    consume_and_check(broker.bootstrap, "durable", expected)


async def test_aiokafka_round_trip(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as TP

    create_topic(broker.bootstrap, "aio")
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="zstd")
    await producer.start()
    sent = []
    for i in range(2000):
        md = await producer.send_and_wait(
            "aio",
            f"v{i}".encode(),
            key=f"k{i}".encode(),
            partition=i % 3,
            headers=[("i", str(i).encode())],
        )
        sent.append((md.partition, md.offset, f"k{i}".encode(), f"v{i}".encode()))
    await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    await consumer.start()
    consumer.assign([TP("aio", p) for p in range(3)])
    for p in range(3):
        consumer.seek(TP("aio", p), 0)
    got = []
    while len(got) < len(sent):
        batch = await consumer.getmany(timeout_ms=5000)
        assert batch, f"stalled after {len(got)} records"
        for tp, records in batch.items():
            got += [(tp.partition, r.offset, r.key, r.value) for r in records]
    await consumer.stop()
    assert sorted(got) == sorted(sent)
