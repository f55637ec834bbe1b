"""Transactions across a cluster: the coordinator, the partitions written and the group's
offsets partition on different brokers; markers reach the partitions' leaders."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.cluster.conftest import ClusterFactory


def _read_committed(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        # nothing more arrives: aborted records stay hidden
        end = time.monotonic() + 2
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    return got


def test_commit_and_abort_across_brokers(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(brokers=3)
    admin = cluster.admin(0)
    admin.create_topics([NewTopic("ledger", 6)])["ledger"].result(timeout=30)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": "ledger-writer"}
    )
    producer.init_transactions(30)
    for round_ in range(4):
        producer.begin_transaction()
        for i in range(60):
            producer.produce("ledger", value=f"{round_}-{i}".encode(), partition=i % 6)
        if round_ % 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    got = _read_committed(cluster.bootstrap, "ledger", 6, 120)
    assert sorted(got) == sorted(f"{r}-{i}".encode() for r in (0, 2) for i in range(60))


def test_offsets_committed_in_a_transaction(cluster_factory: ClusterFactory) -> None:
    cluster = cluster_factory(brokers=3)
    admin = cluster.admin(0)
    admin.create_topics([NewTopic("source", 3)])["source"].result(timeout=30)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": "offsets-writer"}
    )
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "tx-group"})
    try:
        metadata = consumer.consumer_group_metadata()
        producer.begin_transaction()
        offsets = [TopicPartition("source", p, 10 + p) for p in range(3)]
        producer.send_offsets_to_transaction(offsets, metadata, 30)
        producer.commit_transaction(30)
        committed = consumer.committed([TopicPartition("source", p) for p in range(3)], 30)
    finally:
        consumer.close()
    assert [tp.offset for tp in committed] == [10, 11, 12]
