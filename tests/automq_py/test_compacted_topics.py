"""Compacted topics (``cleanup.policy=compact``) against the real broker: records without a key
are refused with INVALID_RECORD, as Kafka's LogValidator does, while keyed ones are taken. A
batch mixing both fails whole, naming the keyless records (KIP-467), so librdkafka fails those
with INVALID_RECORD and the others with its local _INVALID_DIFFERENT_RECORD, as against Kafka."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration


def produce_one(bootstrap: str, topic: str, key: bytes | None) -> KafkaError | None:
    """Produce one record (no retries); the delivery error, None when it was taken."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "retries": 0, "enable.idempotence": False})
    producer.produce(topic, b"value", key=key, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(15)
    assert len(outcome) == 1
    return outcome[0]


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_a_compacted_topic_refuses_records_without_a_key(
    broker: BrokerProcess, policy: str
) -> None:
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic(topic, 1, 1, config={"cleanup.policy": policy})
    admin.create_topics([new])[topic].result(15)
    assert produce_one(broker.bootstrap, topic, b"k") is None
    error = produce_one(broker.bootstrap, topic, None)
    assert error is not None and error.code() == KafkaError.INVALID_RECORD


def test_a_topic_made_compact_starts_refusing_them(broker: BrokerProcess) -> None:
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    assert produce_one(broker.bootstrap, topic, None) is None
    entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)
    error = produce_one(broker.bootstrap, topic, None)
    assert error is not None and error.code() == KafkaError.INVALID_RECORD


def produce_hundred(bootstrap: str, topic: str, **config: object) -> dict[int, KafkaError | None]:
    """Produce records 0-99 to partition 0, every tenth without a key; each one's delivery
    error (None: taken)."""
    reports: dict[int, KafkaError | None] = {}
    producer = Producer(
        {"bootstrap.servers": bootstrap, "retries": 0, "enable.idempotence": False, **config}
    )
    # The partition's leader is known before the first produce(). Records produced earlier
    # wait in the topic's unassigned queue, and librdkafka moves them to the partition one at
    # a time once it learns the leader; a flush() under way lets its broker thread make a
    # batch of whatever has arrived by then, and the records split into two batches.
    deadline = time.monotonic() + 15
    while True:
        meta = producer.list_topics(topic, timeout=5).topics[topic]
        if meta.error is None and 0 in meta.partitions and meta.partitions[0].leader >= 0:
            break
        assert time.monotonic() < deadline, f"no leader for {topic} partition 0: {meta.error}"
        time.sleep(0.1)
    for i in range(100):
        key = None if i % 10 == 0 else b"k%d" % i
        producer.produce(
            topic,
            b"v%d" % i,
            key=key,
            partition=0,
            on_delivery=lambda err, _msg, i=i: reports.__setitem__(i, err),
        )
    assert producer.flush(15) == 0
    assert len(reports) == 100
    return reports


def test_a_batch_with_keyless_records_fails_them_by_name(broker: BrokerProcess) -> None:
    topic = f"mixed-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([new])[topic].result(15)
    keyless = set(range(0, 100, 10))

    # one batch in one Produce request: nothing of it is appended (flush() sends at once,
    # whatever the linger; a linger the produce() loop cannot outlast keeps the batch whole)
    reports = produce_hundred(broker.bootstrap, topic, **{"linger.ms": 60_000})
    failed = {i: e for i, e in reports.items() if e is not None}
    taken = sorted(set(range(100)) - failed.keys())
    assert not taken, (taken, sorted({e.str() for e in failed.values()}))
    assert {i for i, e in failed.items() if e.code() == KafkaError.INVALID_RECORD} == keyless
    others = {e.code() for i, e in failed.items() if i not in keyless}
    assert others == {KafkaError._INVALID_DIFFERENT_RECORD}
    # the strings librdkafka 2.16 reports for each kind against Kafka 3.9.0
    assert failed[0].str() == "Broker: Broker failed to validate record"
    assert failed[1].str() == (
        "Local: an invalid record in the same batch caused the failure of this message too"
    )

    # one record per batch: the keyed ones are taken, the keyless ones alone refused
    reports = produce_hundred(broker.bootstrap, topic, **{"linger.ms": 0, "batch.size": 1})
    assert {i for i, e in reports.items() if e is None} == set(range(100)) - keyless
    assert all(reports[i].code() == KafkaError.INVALID_RECORD for i in keyless)  # type: ignore[union-attr]
