"""The leader epoch a consumer names in Fetch (v9+) and ListOffsets (v4+): the one Metadata
gives is served; an older one is FENCED_LEADER_EPOCH and a newer one UNKNOWN_LEADER_EPOCH, as
Kafka's checkCurrentLeaderEpoch answers, so a client with stale metadata refreshes it. A
broker started again leads at a newer epoch, and a consumer of the old one is told so."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsResponse, OffsetForLeaderEpochResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from automq_py.fetch_reader import leader_epoch_error
from protocol.errors import ErrorCode
from tests.automq_py.apis.test_admin import admin_for, create_topics
from tests.automq_py.conftest import MakeBroker
from tests.support.raw_connection import RawConnection

pytestmark = pytest.mark.integration

E = ErrorCode


def test_the_epochs_compare_as_kafkas() -> None:
    assert leader_epoch_error(-1, 7) is None
    assert leader_epoch_error(7, 7) is None
    assert leader_epoch_error(6, 7) is E.FENCED_LEADER_EPOCH
    assert leader_epoch_error(8, 7) is E.UNKNOWN_LEADER_EPOCH


def _leader_epoch(conn: RawConnection, topic: str) -> int:
    answer = conn.call(
        MetadataRequest[9](
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False,
        ),
        MetadataResponse,
    )
    return int(answer.topics[0].partitions[0].leader_epoch)


def _fetch(conn: RawConnection, topic: str, epoch: int) -> Any:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=epoch, fetch_offset=0, partition_max_bytes=1 << 20
    )
    answer = conn.call(
        FetchRequest[12](
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
            forgotten_topics_data=[],
        ),
        FetchResponse,
    )
    return answer.responses[0].partitions[0]


def _list_offsets(conn: RawConnection, topic: str, epoch: int) -> Any:
    t = ListOffsetsRequest.ListOffsetsTopic
    answer = conn.call(
        ListOffsetsRequest[7](
            replica_id=-1,
            topics=[
                t(
                    name=topic,
                    partitions=[
                        t.ListOffsetsPartition(
                            partition_index=0, current_leader_epoch=epoch, timestamp=-1
                        )
                    ],
                )
            ],
        ),
        ListOffsetsResponse,
    )
    return answer.topics[0].partitions[0]


@pytest.fixture
def topic_on(make_broker: MakeBroker) -> Iterator[tuple[Any, str]]:
    broker = make_broker()
    topic = f"epoch-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, b"v", partition=0)
    assert producer.flush(30) == 0
    yield broker, topic


def test_a_stale_or_future_leader_epoch_is_refused(topic_on: tuple[Any, str]) -> None:
    broker, topic = topic_on
    with RawConnection(broker.bootstrap) as conn:
        epoch = _leader_epoch(conn, topic)
        assert epoch >= 0
        for given, code in (
            (epoch, E.NONE),
            (-1, E.NONE),
            (epoch - 1, E.FENCED_LEADER_EPOCH),
            (epoch + 1, E.UNKNOWN_LEADER_EPOCH),
        ):
            fetched = _fetch(conn, topic, given)
            assert fetched.error_code == code, ("fetch", given, epoch)
            assert bool(fetched.records) is (code == E.NONE)
            listed = _list_offsets(conn, topic, given)
            assert listed.error_code == code, ("list offsets", given, epoch)
            assert listed.offset == (1 if code == E.NONE else -1)


def test_a_consumer_of_the_broker_before_its_restart_is_fenced_and_goes_on(
    topic_on: tuple[Any, str],
) -> None:
    """The epoch a consumer learned before the broker started again is fenced; the consumer
    (librdkafka) refreshes its metadata and reads on."""
    broker, topic = topic_on
    with RawConnection(broker.bootstrap) as conn:
        before = _leader_epoch(conn, topic)
    assert broker.stop() == 0
    broker.start()
    with RawConnection(broker.bootstrap) as conn:
        after = _leader_epoch(conn, topic)
        assert after > before
        assert _fetch(conn, topic, before).error_code == E.FENCED_LEADER_EPOCH
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        got = None
        for _ in range(60):
            got = consumer.poll(0.5)
            if got is not None and got.error() is None:
                break
        assert got is not None and got.error() is None and got.value() == b"v"
    finally:
        consumer.close()


def _end_offsets(conn: RawConnection, topic: str, *asked: tuple[int, int]) -> list[Any]:
    """OffsetForLeaderEpoch v4 for partition 0, once per ``(current epoch, epoch)``."""
    t = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    answer = conn.call(
        OffsetForLeaderEpochRequest[4](
            replica_id=-1,
            topics=[
                t(
                    topic=topic,
                    partitions=[
                        t.OffsetForLeaderPartition(
                            partition=0, current_leader_epoch=current, leader_epoch=epoch
                        )
                        for current, epoch in asked
                    ],
                )
            ],
        ),
        OffsetForLeaderEpochResponse,
    )
    return [(p.error_code, p.leader_epoch, p.end_offset) for p in answer.topics[0].partitions]


def _list(conn: RawConnection, topic: str, version: int, timestamps: list[int]) -> list[Any]:
    """One ListOffsets of partition 0 of ``topic``, once per timestamp (twice or more: the
    same partition asked again): each answer's ``(error, offset, leader epoch)``."""
    t = ListOffsetsRequest.ListOffsetsTopic
    answer = conn.call(
        ListOffsetsRequest[version](
            replica_id=-1,
            topics=[
                t(name=topic, partitions=[t.ListOffsetsPartition(partition_index=0, timestamp=ts)])
                for ts in timestamps
            ],
        ),
        ListOffsetsResponse,
    )
    return [(p.error_code, p.offset, p.leader_epoch) for t in answer.topics for p in t.partitions]


def _offsets(conn: RawConnection, topic: str, version: int, *timestamps: int) -> list[Any]:
    """ListOffsets of partition 0 of ``topic`` for each timestamp, a request each."""
    return [_list(conn, topic, version, [ts])[0] for ts in timestamps]


def test_where_each_leader_epoch_ends_and_which_epoch_an_offset_has(
    topic_on: tuple[Any, str],
) -> None:
    """OffsetForLeaderEpoch as Kafka's lastOffsetForLeaderEpoch answers a consumer (KIP-320):
    an older epoch ends where the next starts, the latest at the log end, one past the latest
    is -1/-1; ListOffsets gives each offset the epoch it was written in."""
    broker, topic = topic_on  # one record at offset 0
    with RawConnection(broker.bootstrap) as conn:
        before = _leader_epoch(conn, topic)
    assert broker.stop() == 0
    broker.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    later = int(time.time() * 1000) + 3_600_000  # past the first record's
    for _ in range(2):
        producer.produce(topic, b"w", partition=0, timestamp=later)
    assert producer.flush(30) == 0
    with RawConnection(broker.bootstrap) as conn:
        after = _leader_epoch(conn, topic)
        assert _end_offsets(
            conn, topic, (after, before), (-1, after), (after, after + 1), (-1, before - 1)
        ) == [
            (E.NONE, before, 1),  # the next epoch starts at 1
            (E.NONE, after, 3),  # the latest: the log end
            (E.NONE, -1, -1),
            # below the first known: it ends where the first starts (-1 is no epoch)
            (E.NONE, before - 1, 0) if before > 0 else (E.NONE, -1, -1),
        ]
        assert _end_offsets(conn, topic, (before, before)) == [(E.FENCED_LEADER_EPOCH, -1, -1)]
        assert _end_offsets(conn, topic, (after + 1, after)) == [(E.UNKNOWN_LEADER_EPOCH, -1, -1)]
        assert _end_offsets(conn, "no-such-topic", (-1, 0)) == [
            (E.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
        ]
        # earliest, latest, the largest timestamp, a time
        assert _offsets(conn, topic, 7, -2, -1, -3, later) == [
            (E.NONE, 0, before),
            (E.NONE, 3, after),
            (E.NONE, 1, after),
            (E.NONE, 1, after),
        ]


def test_list_offsets_refuses_a_partition_asked_twice_and_a_timestamp_its_version_lacks(
    topic_on: tuple[Any, str],
) -> None:
    """As Kafka's handleListOffsetRequest: a partition asked twice is INVALID_REQUEST (each
    time), a special timestamp older than the version (MAX_TIMESTAMP before v7,
    EARLIEST_LOCAL before v8, LATEST_TIERED before v9) or unknown is UNSUPPORTED_VERSION."""
    broker, topic = topic_on
    with RawConnection(broker.bootstrap) as conn:
        # (answered once, as Kafka's answer is built from a map of partitions)
        assert _list(conn, topic, 7, [-1, -1]) == [(E.INVALID_REQUEST, -1, -1)]
        assert [e for e, _, _ in _offsets(conn, topic, 6, -3)] == [E.UNSUPPORTED_VERSION]
        assert [e for e, _, _ in _offsets(conn, topic, 7, -4)] == [E.UNSUPPORTED_VERSION]
        assert [e for e, _, _ in _offsets(conn, topic, 8, -5)] == [E.UNSUPPORTED_VERSION]
        assert [e for e, _, _ in _offsets(conn, topic, 9, -6)] == [E.UNSUPPORTED_VERSION]
        assert [e for e, _, _ in _offsets(conn, topic, 9, -3)] == [E.NONE]


def test_the_largest_timestamp_is_the_record_s_not_its_batch_s(make_broker: MakeBroker) -> None:
    """ListOffsets MAX_TIMESTAMP answers the offset of the record holding the largest
    timestamp inside its batch, as Kafka's offsetOfMaxTimestamp."""
    broker = make_broker()
    topic = f"max-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, 1, 1))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 200})
    for ts in (1_800_000_000_000, 1_800_000_000_009, 1_800_000_000_003):
        producer.produce(topic, b"v", partition=0, timestamp=ts)
    assert producer.flush(30) == 0
    with RawConnection(broker.bootstrap) as conn:
        assert [offset for _, offset, _ in _offsets(conn, topic, 7, -3)] == [1]
