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


def _coordinator(bootstrap: str, key: str, key_type: int) -> int:
    """The node FindCoordinator names for a group (0) or transactional id (1)."""
    from kafka.protocol.metadata.find_coordinator import (
        FindCoordinatorRequest,
        FindCoordinatorResponse,
    )

    from tests.support.raw_connection import RawConnection

    with RawConnection(bootstrap) as conn:
        for _ in range(100):
            found = conn.call(
                FindCoordinatorRequest[1](key=key, key_type=key_type), FindCoordinatorResponse
            )
            if found.error_code == 0:
                return int(found.node_id)
            time.sleep(0.1)
    raise AssertionError(f"no coordinator for {key}")


def test_offsets_committed_in_a_transaction(cluster_factory: ClusterFactory) -> None:
    """The group's coordinator is not the transaction's: it verifies the offsets partition
    with the transaction coordinator on another broker (KIP-890) before it writes."""
    cluster = cluster_factory(brokers=3)
    admin = cluster.admin(0)
    admin.create_topics([NewTopic("source", 3)])["source"].result(timeout=30)
    bootstrap = cluster.brokers[0].bootstrap
    txn_node = _coordinator(bootstrap, "offsets-writer", 1)
    group = next(
        g for g in (f"tx-group-{i}" for i in range(50)) if _coordinator(bootstrap, g, 0) != txn_node
    )
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": "offsets-writer"}
    )
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
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


def test_a_write_the_dead_coordinator_cannot_verify_is_retriable(
    cluster_factory: ClusterFactory,
) -> None:
    """A partition leader asks the transaction coordinator before a transaction opens in its
    partition (KIP-890 part 1). With the coordinator's broker dead, the Produce is answered
    NOT_ENOUGH_REPLICAS, as Kafka answers it: a retriable error every client retries, where
    the coordinator's own error is one a client may give up on."""
    from kafka.protocol.producer.produce import ProduceResponse
    from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

    from automq_py.coordinator.runtime import partition_for
    from protocol.errors import ErrorCode
    from protocol.records import RecordInput, build_batch
    from tests.support.raw_connection import RawConnection, partition_produce_request

    cluster = cluster_factory(brokers=3)
    admin = cluster.admin(0)
    admin.create_topics([NewTopic("unverified", 3)])["unverified"].result(timeout=30)
    # a coordinator exists for every partition of __transaction_state once one is asked for
    Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "t"}).init_transactions(
        30
    )
    coordinators = cluster.leaders("__transaction_state")
    leaders = cluster.leaders("unverified")
    txn_id, coordinator, partition = next(
        (t, coordinators[partition_for(t, len(coordinators))], p)
        for t in (f"writer-{i}" for i in range(100))
        for p, leader in leaders.items()
        if leader != coordinators[partition_for(t, len(coordinators))]
    )
    with RawConnection(cluster.brokers[coordinator].bootstrap) as conn:
        init = conn.call(
            InitProducerIdRequest[1](transactional_id=txn_id, transaction_timeout_ms=60000),
            InitProducerIdResponse,
        )
    assert init.error_code == ErrorCode.NONE
    batch = build_batch(
        [RecordInput(b"v", b"k", [], 1_700_000_000_000)],
        producer_id=init.producer_id,
        producer_epoch=init.producer_epoch,
        base_sequence=0,
        is_transactional=True,
    )
    cluster.brokers[coordinator].kill()
    try:
        request = partition_produce_request(
            "unverified", partition, bytes(batch), timeout_ms=10000, transactional_id=txn_id
        )
        with RawConnection(cluster.brokers[leaders[partition]].bootstrap) as conn:
            response = conn.call(request, ProduceResponse)
    finally:
        cluster.brokers[coordinator].start()
    answer = response.responses[0].partition_responses[0]
    assert (answer.error_code, answer.error_message) == (
        ErrorCode.NOT_ENOUGH_REPLICAS,
        "Unable to verify the partition has been added to the transaction. "
        "Underlying error: COORDINATOR_NOT_AVAILABLE",
    )
