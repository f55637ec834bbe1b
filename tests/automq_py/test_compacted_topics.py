"""Compacted topics (``cleanup.policy=compact``) against the real broker: records without a key
are refused with INVALID_RECORD, as Kafka's LogValidator does, while keyed ones are taken."""

from __future__ import annotations

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
