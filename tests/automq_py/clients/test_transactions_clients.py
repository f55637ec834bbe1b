"""Transactions with real clients against the real broker process on the real S3 server:
commit and abort across partitions, read_committed and read_uncommitted consumers,
consume-transform-produce with a group's offsets in the transaction, fencing by a successor,
timeouts, and a kill -9 between the two phases of a commit. The tests share one broker, each
with its own topics and transactional ids, except those that kill it, configure it or list every
transaction it holds."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kafka import KafkaProducer
from kafka.protocol.metadata.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)

from tests.automq_py.clients.test_clients import create_topic
from tests.automq_py.conftest import MakeBroker, module_broker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server) as b:
        yield b


def txn_producer(bootstrap: str, txn_id: str, **extra: Any) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "linger.ms": 5,
            **extra,
        }
    )
    producer.init_transactions(30)
    return producer


def send(producer: Producer, topic: str, tag: str, count: int = 9) -> list[str]:
    """``count`` records spread over the partitions, values ``tag-i``; flushed."""
    values = [f"{tag}-{i}" for i in range(count)]
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), partition=i % PARTITIONS)
    producer.flush(30)
    return values


def read_all(
    bootstrap: str, topic: str, isolation: str, expected: int, timeout: float = 30
) -> dict[int, list[str]]:
    """Every record of ``topic`` from offset 0, per partition in order, with the given
    isolation level; reads until ``expected`` records came, then 1 s more (nothing else may
    come)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + timeout
    settle: float | None = None
    try:
        while time.monotonic() < deadline and (settle is None or time.monotonic() < settle):
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got[msg.partition()].append(msg.value().decode())
            if settle is None and sum(map(len, got.values())) >= expected:
                settle = time.monotonic() + 1.0
    finally:
        consumer.close()
    return got


def per_partition(values: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i, v in enumerate(values):
        out[i % PARTITIONS].append(v)
    return out


def merge(*parts: dict[int, list[str]]) -> dict[int, list[str]]:
    return {p: [v for part in parts for v in part[p]] for p in range(PARTITIONS)}


def test_read_committed_sees_exactly_the_committed_records(broker: BrokerProcess) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = txn_producer(broker.bootstrap, f"tx-{uuid.uuid4()}")
    producer.begin_transaction()
    committed1 = send(producer, topic, "a")
    producer.commit_transaction(30)
    producer.begin_transaction()
    aborted = send(producer, topic, "b")
    producer.abort_transaction(30)
    producer.begin_transaction()
    committed2 = send(producer, topic, "c")
    producer.commit_transaction(30)

    committed = merge(per_partition(committed1), per_partition(committed2))
    assert read_all(broker.bootstrap, topic, "read_committed", 18) == committed
    everything = merge(per_partition(committed1), per_partition(aborted), per_partition(committed2))
    assert read_all(broker.bootstrap, topic, "read_uncommitted", 27) == everything


def test_an_open_transaction_holds_read_committed_back(broker: BrokerProcess) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    producer = txn_producer(broker.bootstrap, f"tx-{uuid.uuid4()}")
    producer.begin_transaction()
    pending = send(producer, topic, "open")
    plain.produce(topic, b"after-0", partition=0)
    plain.flush(10)
    # the plain record comes after the open transaction's first offset: held back too
    assert read_all(broker.bootstrap, topic, "read_committed", 1, timeout=4) == per_partition([])
    producer.commit_transaction(30)
    expected = per_partition(pending)
    expected[0].append("after-0")
    assert read_all(broker.bootstrap, topic, "read_committed", 10) == expected


def test_consume_transform_produce_commits_the_groups_offsets(broker: BrokerProcess) -> None:
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, source, PARTITIONS)
    create_topic(broker.bootstrap, sink, PARTITIONS)
    feeder = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        feeder.produce(source, f"m-{i}".encode(), partition=i % PARTITIONS)
    feeder.flush(10)
    group = f"ctp-{uuid.uuid4()}"
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(source, p, 0) for p in range(PARTITIONS)])
    producer = txn_producer(broker.bootstrap, f"tx-{uuid.uuid4()}")

    def transform_batch(commit: bool) -> int:
        msgs = consumer.consume(10, 10)
        assert msgs and all(m.error() is None for m in msgs)
        producer.begin_transaction()
        for m in msgs:
            producer.produce(sink, m.value().upper(), partition=m.partition())
        positions = consumer.position([TopicPartition(source, p) for p in range(PARTITIONS)])
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        return len(msgs)

    done = 0
    while done < 30:
        done += transform_batch(commit=True)
    committed = consumer.committed([TopicPartition(source, p) for p in range(PARTITIONS)], 10)
    assert sorted(tp.offset for tp in committed) == [10, 10, 10]

    # an aborted transaction leaves the group's offsets where they were
    for i in range(30, 33):
        feeder.produce(source, f"m-{i}".encode(), partition=i % PARTITIONS)
    feeder.flush(10)
    assert transform_batch(commit=False) > 0
    committed = consumer.committed([TopicPartition(source, p) for p in range(PARTITIONS)], 10)
    assert sorted(tp.offset for tp in committed) == [10, 10, 10]
    consumer.close()
    out = read_all(broker.bootstrap, sink, "read_committed", 30)
    assert sorted(v for vs in out.values() for v in vs) == sorted(f"M-{i}" for i in range(30))


def test_a_successor_fences_the_producer_and_aborts_its_transaction(
    broker: BrokerProcess,
) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    txn_id = f"tx-{uuid.uuid4()}"
    first = txn_producer(broker.bootstrap, txn_id)
    first.begin_transaction()
    send(first, topic, "zombie")
    second = txn_producer(broker.bootstrap, txn_id)  # fences the first, aborts its transaction
    second.begin_transaction()
    survivors = send(second, topic, "heir")
    second.commit_transaction(30)
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(10)
    assert raised.value.args[0].fatal()
    assert read_all(broker.bootstrap, topic, "read_committed", 9) == per_partition(survivors)


def test_an_expired_transaction_is_aborted(make_broker: Any) -> None:
    broker = make_broker(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = txn_producer(
        broker.bootstrap, f"tx-{uuid.uuid4()}", **{"transaction.timeout.ms": 2000}
    )
    producer.begin_transaction()
    send(producer, topic, "late")
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"plain", partition=0)
    plain.flush(10)
    # aborted by the broker after 2 s: the plain record behind it becomes readable
    assert read_all(broker.bootstrap, topic, "read_committed", 1, timeout=20) == {
        0: ["plain"],
        1: [],
        2: [],
    }


def test_a_larger_timeout_than_the_brokers_maximum_is_refused(make_broker: Any) -> None:
    broker = make_broker(**{"transaction.max.timeout.ms": "5000"})
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": f"tx-{uuid.uuid4()}",
            "transaction.timeout.ms": 60000,
        }
    )
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(20)
    assert "INVALID_TRANSACTION_TIMEOUT" in raised.value.args[0].name()


def test_kafka_python_commits_and_aborts(broker: BrokerProcess) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, transactional_id=f"kp-{uuid.uuid4()}"
    )
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(6):
        producer.send(topic, f"keep-{i}".encode(), partition=i % PARTITIONS)
    producer.commit_transaction()
    producer.begin_transaction()
    for i in range(6):
        producer.send(topic, f"drop-{i}".encode(), partition=i % PARTITIONS)
    producer.abort_transaction()
    producer.close()
    assert read_all(broker.bootstrap, topic, "read_committed", 6) == per_partition(
        [f"keep-{i}" for i in range(6)]
    )


def test_a_commit_survives_a_kill_between_its_two_phases(make_broker: MakeBroker) -> None:
    broker = make_broker()
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    txn_id = f"tx-{uuid.uuid4()}"
    producer = txn_producer(broker.bootstrap, txn_id)
    producer.begin_transaction()
    committed = send(producer, topic, "kept")
    producer.commit_transaction(30)
    producer.begin_transaction()
    open_values = send(producer, topic, "open")
    assert open_values
    broker.kill()  # kill -9: the second transaction is open, the first decided
    broker.start()
    # the successor's InitProducerId aborts the open transaction left behind
    successor = txn_producer(broker.bootstrap, txn_id)
    successor.begin_transaction()
    more = send(successor, topic, "more")
    successor.commit_transaction(30)
    assert read_all(broker.bootstrap, topic, "read_committed", 18) == merge(
        per_partition(committed), per_partition(more)
    )


def test_admin_lists_describes_and_aborts_transactions(make_broker: MakeBroker) -> None:
    from kafka import TopicPartition as KafkaTopicPartition
    from kafka.admin import AbortTransactionSpec, KafkaAdminClient
    from kafka.errors import TransactionalIdNotFoundError
    from kafka.protocol.admin import ListTransactionsRequest, ListTransactionsResponse

    from tests.support.raw_connection import RawConnection

    broker = make_broker()  # its listing of every transaction names only this test's

    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    open_id, done_id = f"open-{uuid.uuid4()}", f"done-{uuid.uuid4()}"
    done = txn_producer(broker.bootstrap, done_id)
    done.begin_transaction()
    send(done, topic, "d", count=2)
    done.commit_transaction(30)
    hanging = txn_producer(broker.bootstrap, open_id, **{"transaction.timeout.ms": 600_000})
    hanging.begin_transaction()
    send(hanging, topic, "h", count=2)  # partitions 0 and 1

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        # one listing per broker: this broker's is the only one
        (listings,) = admin.list_transactions().values()
        listed = {t.transactional_id: t for t in listings}
        assert listed[open_id].state.name == "ONGOING"
        assert listed[done_id].state.name == "COMPLETE_COMMIT"
        (ongoing,) = admin.list_transactions(state_filters=["Ongoing"]).values()
        assert [t.transactional_id for t in ongoing] == [open_id]
        # KIP-994's duration filter, as Kafka's: the transaction open for less than a minute
        # is left out; an id with none open (start time -1) is older than any duration
        idle_id = f"idle-{uuid.uuid4()}"
        txn_producer(broker.bootstrap, idle_id)
        with RawConnection(broker.bootstrap) as conn:
            older = conn.call(
                ListTransactionsRequest[1](
                    state_filters=[], producer_id_filters=[], duration_filter=60_000
                ),
                ListTransactionsResponse,
            )
        long_running = {t.transactional_id for t in older.transaction_states}
        assert idle_id in long_running and open_id not in long_running

        described = admin.describe_transactions([open_id])[open_id]
        assert described.state.name == "ONGOING"
        assert described.topic_partitions == {
            KafkaTopicPartition(topic, 0),
            KafkaTopicPartition(topic, 1),
        }
        assert described.transaction_timeout_ms == 600_000
        assert described.transaction_start_time_ms > 0
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions(["never-seen"])

        # an operator aborts the hanging transaction in the partitions it holds back
        for p in (0, 1):
            admin.abort_transaction(
                AbortTransactionSpec(
                    KafkaTopicPartition(topic, p), described.producer_id, described.producer_epoch
                )
            )
    finally:
        admin.close()
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"after", partition=0)
    plain.flush(10)
    # the partitions' stable offsets moved past the aborted records
    got = read_all(broker.bootstrap, topic, "read_committed", 3)
    assert got == {0: ["d-0", "after"], 1: ["d-1"], 2: []}


def test_a_transactional_write_to_a_partition_not_in_the_transaction_is_refused(
    broker: BrokerProcess,
) -> None:
    """KIP-890 part 1: the broker asks the coordinator before a transaction opens in a
    partition, so a write the coordinator does not know about cannot leave a hanging one."""
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
    from kafka.protocol.producer.transaction import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnResponse,
        InitProducerIdRequest,
        InitProducerIdResponse,
    )

    from protocol.errors import ErrorCode
    from protocol.records import RecordInput, build_batch
    from tests.support.raw_connection import RawConnection

    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    txn_id = f"raw-{uuid.uuid4()}"
    conn = RawConnection(broker.bootstrap)
    try:
        conn.call(FindCoordinatorRequest[1](key=txn_id, key_type=1), FindCoordinatorResponse)
        init = conn.call(
            InitProducerIdRequest[1](transactional_id=txn_id, transaction_timeout_ms=60000),
            InitProducerIdResponse,
        )
        assert init.error_code == ErrorCode.NONE
        pid, epoch = init.producer_id, init.producer_epoch

        def produce(version: int, seq: int) -> tuple[int, str | None]:
            batch = build_batch(
                [RecordInput(b"v", b"k", [], 1_700_000_000_000)],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                is_transactional=True,
            )
            topic_data = ProduceRequest.TopicProduceData
            response = conn.call(
                ProduceRequest[version](
                    transactional_id=txn_id,
                    acks=-1,
                    timeout_ms=10000,
                    topic_data=[
                        topic_data(
                            name=topic,
                            partition_data=[
                                topic_data.PartitionProduceData(index=0, records=bytes(batch))
                            ],
                        )
                    ],
                ),
                ProduceResponse,
            )
            answer = response.responses[0].partition_responses[0]
            return int(answer.error_code), answer.error_message

        not_added = "Partition was not added to the transaction"
        assert produce(9, 0) == (ErrorCode.INVALID_TXN_STATE, not_added)
        assert produce(11, 0) == (ErrorCode.TRANSACTION_ABORTABLE, None)
        added = conn.call(
            AddPartitionsToTxnRequest[3](
                v3_and_below_transactional_id=txn_id,
                v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[
                    AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])
                ],
            ),
            AddPartitionsToTxnResponse,
        )
        codes = [
            p.partition_error_code
            for t in added.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ]
        assert codes == [ErrorCode.NONE]
        assert produce(9, 0) == (ErrorCode.NONE, None)

        # what a partition leader asks the coordinator (v4+, KIP-890): v5, Kafka 3.9's highest,
        # verifies as v4 does, the partition not in the transaction is TRANSACTION_ABORTABLE
        for version in (4, 5):
            verified = conn.call(
                AddPartitionsToTxnRequest[version](
                    transactions=[
                        AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
                            transactional_id=txn_id,
                            producer_id=pid,
                            producer_epoch=epoch,
                            verify_only=True,
                            topics=[
                                AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(
                                    name=topic, partitions=[0, 1]
                                )
                            ],
                        )
                    ]
                ),
                AddPartitionsToTxnResponse,
            )
            assert verified.error_code == ErrorCode.NONE
            [txn] = verified.results_by_transaction
            assert txn.transactional_id == txn_id
            assert {
                p.partition_index: p.partition_error_code
                for t in txn.topic_results
                for p in t.results_by_partition
            } == {0: ErrorCode.NONE, 1: ErrorCode.TRANSACTION_ABORTABLE}
    finally:
        conn.close()


def test_offsets_committed_outside_the_transaction_are_refused(broker: BrokerProcess) -> None:
    """KIP-890 part 1 for offsets: the group coordinator asks the transaction coordinator
    whether the group's offsets partition is in the transaction before a TxnOffsetCommit
    writes there. Without AddOffsetsToTxn no marker would ever end those offsets, and the
    group's stable offsets would wait on them for ever."""
    from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
    from kafka.protocol.producer.transaction import (
        AddOffsetsToTxnRequest,
        AddOffsetsToTxnResponse,
        EndTxnRequest,
        EndTxnResponse,
        InitProducerIdRequest,
        InitProducerIdResponse,
        TxnOffsetCommitRequest,
        TxnOffsetCommitResponse,
    )

    from protocol.errors import ErrorCode
    from tests.support.raw_connection import RawConnection

    topic = f"txn-offsets-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    txn_id, group = f"raw-{uuid.uuid4()}", f"group-{uuid.uuid4().hex[:8]}"
    with RawConnection(broker.bootstrap) as conn:
        for key, key_type in ((txn_id, 1), (group, 0)):
            found = conn.call(
                FindCoordinatorRequest[1](key=key, key_type=key_type), FindCoordinatorResponse
            )
            assert found.error_code == ErrorCode.NONE
        init = conn.call(
            InitProducerIdRequest[1](transactional_id=txn_id, transaction_timeout_ms=60000),
            InitProducerIdResponse,
        )
        pid, epoch = init.producer_id, init.producer_epoch

        def commit(version: int, offset: int) -> int:
            request = TxnOffsetCommitRequest[version]
            answer = conn.call(
                request(
                    transactional_id=txn_id,
                    group_id=group,
                    producer_id=pid,
                    producer_epoch=epoch,
                    topics=[
                        request.TxnOffsetCommitRequestTopic(
                            name=topic,
                            partitions=[
                                request.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                                    partition_index=0,
                                    committed_offset=offset,
                                    committed_metadata="",
                                )
                            ],
                        )
                    ],
                ),
                TxnOffsetCommitResponse,
            )
            return int(answer.topics[0].partitions[0].error_code)

        def stable() -> tuple[int, int]:
            fetched = conn.call(
                OffsetFetchRequest[7](
                    group_id=group,
                    topics=[
                        OffsetFetchRequest.OffsetFetchRequestTopic(
                            name=topic, partition_indexes=[0]
                        )
                    ],
                    require_stable=True,
                ),
                OffsetFetchResponse,
            )
            p = fetched.topics[0].partitions[0]
            return int(p.error_code), int(p.committed_offset)

        assert commit(3, 5) == ErrorCode.INVALID_TXN_STATE
        assert commit(4, 5) == ErrorCode.TRANSACTION_ABORTABLE
        assert stable() == (ErrorCode.NONE, -1)  # nothing was written, nothing hangs
        added = conn.call(
            AddOffsetsToTxnRequest[1](
                transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group
            ),
            AddOffsetsToTxnResponse,
        )
        assert added.error_code == ErrorCode.NONE
        assert commit(3, 5) == ErrorCode.NONE
        assert stable()[0] == ErrorCode.UNSTABLE_OFFSET_COMMIT
        assert commit(4, 7) == ErrorCode.NONE  # written in this transaction already
        ended = conn.call(
            EndTxnRequest[1](
                transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=True
            ),
            EndTxnResponse,
        )
        assert ended.error_code == ErrorCode.NONE
        deadline = time.monotonic() + 10
        while (got := stable()) != (ErrorCode.NONE, 7) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert got == (ErrorCode.NONE, 7)


def test_a_time_lookup_answers_only_what_the_isolation_level_may_read(
    broker: BrokerProcess,
) -> None:
    """ListOffsets by timestamp, and for the largest timestamp, answers no offset at or past
    what the consumer may read (Kafka's fetchOffsetForTimestamp): a read_committed consumer
    is not sent into an open transaction, a read_uncommitted one reads it, and a request of a
    replica or a debugging one (replica id -2) reads to the log's end whatever its isolation."""
    from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

    from tests.support.raw_connection import RawConnection

    topic = f"txn-times-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"old", partition=0, timestamp=1_000_000)
    assert plain.flush(30) == 0
    producer = txn_producer(broker.bootstrap, f"times-{uuid.uuid4()}")
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0, timestamp=2_000_000)
    assert producer.flush(30) == 0

    def lookup(
        conn: RawConnection, isolation: int, timestamp: int, replica_id: int = -1
    ) -> tuple[int, int]:
        t = ListOffsetsRequest.ListOffsetsTopic
        answer = conn.call(
            ListOffsetsRequest[7](
                replica_id=replica_id,
                isolation_level=isolation,
                topics=[
                    t(
                        name=topic,
                        partitions=[t.ListOffsetsPartition(partition_index=0, timestamp=timestamp)],
                    )
                ],
            ),
            ListOffsetsResponse,
        )
        p = answer.topics[0].partitions[0]
        assert p.error_code == 0
        return int(p.offset), int(p.timestamp)

    max_timestamp = -3
    with RawConnection(broker.bootstrap) as conn:
        assert lookup(conn, 1, 1_500_000) == (-1, -1)
        assert lookup(conn, 0, 1_500_000) == (1, 2_000_000)
        assert lookup(conn, 1, 500_000) == (0, 1_000_000)
        assert lookup(conn, 1, max_timestamp) == (-1, -1)
        assert lookup(conn, 0, max_timestamp) == (1, 2_000_000)
        latest, debugging = -1, -2
        assert lookup(conn, 1, latest) == (1, -1)
        assert lookup(conn, 1, latest, debugging) == (2, -1)
        assert lookup(conn, 1, 1_500_000, debugging) == (1, 2_000_000)
        producer.commit_transaction(30)
        deadline = time.monotonic() + 10  # the markers follow the commit's answer
        while (found := lookup(conn, 1, 1_500_000)) == (-1, -1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found == (1, 2_000_000)
