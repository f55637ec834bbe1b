"""The leader epoch a consumer names in Fetch (v9+) and ListOffsets (v4+): the one Metadata
gives is served; an older one is FENCED_LEADER_EPOCH and a newer one UNKNOWN_LEADER_EPOCH, as
Kafka's checkCurrentLeaderEpoch answers, so a client with stale metadata refreshes it. A
broker started again leads at a newer epoch, and a consumer of the old one is told so."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsResponse
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
