"""kafka-python 3 (pure Python client) against the real broker process: gzip, headers, assign."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # type: ignore[import-untyped]
from kafka.admin import KafkaAdminClient, NewTopic  # type: ignore[import-untyped]

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration

N = 10_000
PARTITIONS = 3
TOPIC = "kafka-python-orders"

Record = tuple[int, bytes, bytes, int, list[tuple[str, bytes]]]  # offset, key, value, ts, headers


def produce(bootstrap: str) -> dict[int, list[Record]]:
    """Send N records to explicit partitions; the expected offsets come from the acks."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        compression_type="gzip",
        linger_ms=5,
        enable_idempotence=False,
    )
    base_ts = int(time.time() * 1000)
    futures = []
    for i in range(N):
        p = i % PARTITIONS
        key, value = f"key-{i}".encode(), f"value-{i}-{'z' * (i % 60)}".encode()
        headers = [("index", str(i).encode()), ("empty", b""), ("bin", bytes([i % 256, 0]))]
        future = producer.send(TOPIC, value, key, headers, partition=p, timestamp_ms=base_ts + i)
        futures.append((p, key, value, base_ts + i, headers, future))
    producer.flush(60)
    producer.close()
    expected: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    for p, key, value, ts, headers, future in futures:
        md = future.get(0)
        assert md.partition == p
        expected[p].append((md.offset, key, value, ts, headers))
    return expected


def read_back(bootstrap: str, count: int) -> dict[int, list[Record]]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000
    )
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    got: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    try:
        while sum(map(len, got.values())) < count and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                for r in records:
                    assert r.timestamp_type == 0, f"{tp} offset {r.offset}: not CreateTime"
                    got[tp.partition].append(
                        (r.offset, r.key, r.value, r.timestamp, list(r.headers))
                    )
    finally:
        consumer.close()
    return got


def test_kafka_python_gzip_round_trip(broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    finally:
        admin.close()

    expected = produce(broker.bootstrap)
    for p, records in expected.items():
        acked = [offset for offset, *_ in records]
        assert acked == list(range(len(records))), f"partition {p}: acked offsets not dense"

    check(read_back(broker.bootstrap, N), expected)
    # the same after a crash (kill -9), then from object storage after a clean restart
    for restart in (broker.kill, broker.stop):
        restart()
        broker.start()
        check(read_back(broker.bootstrap, N), expected)


def check(got: dict[int, list[Record]], expected: dict[int, list[Record]]) -> None:
    for p in range(PARTITIONS):
        assert len(got[p]) == len(expected[p]), f"partition {p}"
        for have, want in zip(got[p], expected[p], strict=True):
            assert have == want, f"partition {p} offset {want[0]}"


def test_list_partition_offsets_by_every_spec(broker: BrokerProcess) -> None:
    """kafka-python's admin sends ListOffsets at the broker's highest version, v9, and refuses
    LATEST_TIERED (KIP-1005) below it. Answered as Kafka 3.9 answers without tiered storage:
    the local log start is the log start, and no offset is in remote storage (-1)."""
    from kafka.admin import OffsetSpec  # type: ignore[import-untyped]

    topic = "kafka-python-specs"
    tp = TopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        base_ts = 1_700_000_000_000
        for i in range(5):  # one batch each, timestamps 0, 10, ..., 40 ms past base_ts
            producer.send(topic, b"v", partition=0, timestamp_ms=base_ts + 10 * i).get(30)
        admin.delete_records({tp: 2})

        specs = {
            "earliest": OffsetSpec.EARLIEST,
            "latest": OffsetSpec.LATEST,
            "max_timestamp": OffsetSpec.MAX_TIMESTAMP,
            "earliest_local": OffsetSpec.EARLIEST_LOCAL,
            "latest_tiered": OffsetSpec.LATEST_TIERED,
        }
        got = {name: admin.list_partition_offsets({tp: spec})[tp] for name, spec in specs.items()}
    finally:
        producer.close()
        admin.close()
    found = {name: (r.offset, r.timestamp) for name, r in got.items()}
    assert found == {
        "earliest": (2, -1),
        "latest": (5, -1),
        "max_timestamp": (4, base_ts + 40),
        "earliest_local": (2, -1),
        "latest_tiered": (-1, -1),
    }
    assert got["latest_tiered"].leader_epoch is None  # -1 on the wire
    assert got["earliest_local"].leader_epoch is not None
