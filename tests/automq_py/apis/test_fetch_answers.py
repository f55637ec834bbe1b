"""What a Fetch answers besides records, as Kafka's KafkaApis and ReplicaManager answer it: the
partitions it does not know are answered without being read (they neither wait for data nor
cut the others' wait short), an id that names no topic is UNKNOWN_TOPIC_ID while a partition a
known topic lacks is UNKNOWN_TOPIC_OR_PARTITION, a partition whose read failed carries no
offsets, and the request's max_bytes holds within the broker's ``fetch.max.bytes``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from protocol.errors import ErrorCode
from tests.automq_py.apis.test_admin import admin_for, create_topics
from tests.automq_py.conftest import MakeBroker
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection

pytestmark = pytest.mark.integration

E = ErrorCode
MAX_WAIT_MS = 600
RECORD = b"x" * 600  # one record a batch: a batch of ~670 bytes


def _topic_with_records(broker: BrokerProcess, partitions: int) -> str:
    """A new topic whose every partition holds one batch of one RECORD."""
    topic = f"fetch-{uuid.uuid4().hex[:8]}"
    create_topics(admin_for(broker), NewTopic(topic, partitions, 1))
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for p in range(partitions):
        producer.produce(topic, RECORD, partition=p)
        producer.flush(30)
    assert producer.flush(30) == 0
    return topic


def _topic_id(conn: RawConnection, topic: str) -> uuid.UUID:
    answer = conn.call(
        MetadataRequest[12](
            topics=[MetadataRequest.MetadataRequestTopic(name=topic, topic_id=None)],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        MetadataResponse,
    )
    return uuid.UUID(str(answer.topics[0].topic_id))


def _fetch(
    conn: RawConnection,
    version: int,
    topics: list[tuple[str | uuid.UUID, list[tuple[int, int]]]],
    *,
    max_bytes: int = 1 << 30,
    min_bytes: int = 0,
) -> tuple[list[tuple[Any, int, int, int, int, int]], float]:
    """Fetch (topic or topic id, [(partition, offset)]): each partition's (topic, index, error,
    high watermark, last stable offset, log start offset, records' bytes), and the seconds the
    answer took."""
    request_topics = []
    for topic, partitions in topics:
        parts = [
            FetchRequest.FetchTopic.FetchPartition(
                partition=p, fetch_offset=offset, partition_max_bytes=1 << 20
            )
            for p, offset in partitions
        ]
        if isinstance(topic, uuid.UUID):
            request_topics.append(FetchRequest.FetchTopic(topic_id=topic, partitions=parts))
        else:
            request_topics.append(FetchRequest.FetchTopic(topic=topic, partitions=parts))
    started = time.monotonic()
    answer = conn.call(
        FetchRequest[version](
            replica_id=-1,
            max_wait_ms=MAX_WAIT_MS,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=request_topics,
            forgotten_topics_data=[],
            rack_id="",
        ),
        FetchResponse,
    )
    took = time.monotonic() - started
    found = []
    for t in answer.responses:
        name = t.topic_id if version >= 13 else t.topic
        for p in t.partitions:
            found.append(
                (
                    name,
                    p.partition_index,
                    p.error_code,
                    p.high_watermark,
                    p.last_stable_offset,
                    p.log_start_offset,
                    len(p.records or b""),
                )
            )
    return found, took


def test_unknown_partitions_neither_wait_nor_cut_the_wait_short(make_broker: MakeBroker) -> None:
    """A consumer still assigned a deleted topic's partition, or a partition past a topic's
    count, beside one it reads at the log end: the fetch waits max_wait for data as Kafka's
    does, rather than answering at once, again and again, until the consumer learns."""
    broker = make_broker()
    topic = _topic_with_records(broker, 1)
    with RawConnection(broker.bootstrap) as conn:
        found, took = _fetch(
            conn, 12, [(topic, [(0, 1), (5, 0)]), ("no-such-topic", [(0, 0)])], min_bytes=1
        )
        assert [f[:3] for f in found] == [
            (topic, 0, E.NONE),
            (topic, 5, E.UNKNOWN_TOPIC_OR_PARTITION),
            ("no-such-topic", 0, E.UNKNOWN_TOPIC_OR_PARTITION),
        ]
        assert took >= MAX_WAIT_MS / 1000 * 0.9, took
        # only unknown partitions: nothing to wait on, answered at once
        found, took = _fetch(conn, 12, [("no-such-topic", [(0, 0)])], min_bytes=1)
        assert [f[2] for f in found] == [E.UNKNOWN_TOPIC_OR_PARTITION]
        assert took < MAX_WAIT_MS / 1000 / 2, took


def test_a_topic_id_that_names_no_topic_is_unknown_topic_id(make_broker: MakeBroker) -> None:
    broker = make_broker()
    topic = _topic_with_records(broker, 1)
    with RawConnection(broker.bootstrap) as conn:
        topic_id = _topic_id(conn, topic)
        stranger = uuid.uuid4()
        found, _ = _fetch(conn, 13, [(topic_id, [(0, 0), (3, 0)]), (stranger, [(0, 0)])])
    assert [f[:3] for f in found] == [
        (topic_id, 0, E.NONE),
        (topic_id, 3, E.UNKNOWN_TOPIC_OR_PARTITION),
        (stranger, 0, E.UNKNOWN_TOPIC_ID),
    ]


def test_an_offset_out_of_range_carries_no_offsets(make_broker: MakeBroker) -> None:
    """As Kafka's createLogReadResult of a failed read: -1 for the high watermark, the last
    stable offset and the log start offset."""
    broker = make_broker()
    topic = _topic_with_records(broker, 1)
    with RawConnection(broker.bootstrap) as conn:
        found, _ = _fetch(conn, 12, [(topic, [(0, 7), (0, 0)])])
    assert found[0][2:] == (E.OFFSET_OUT_OF_RANGE, -1, -1, -1, 0)
    assert found[1][2:5] == (E.NONE, 1, 1)


def test_max_bytes_holds_within_fetch_max_bytes(make_broker: MakeBroker) -> None:
    """A request's max_bytes of 0 returns the first partition's first batch alone, and one
    above the broker's fetch.max.bytes is cut to it (here 1024: one ~670-byte batch of the
    two partitions' two)."""
    both = [(0, 0), (1, 0)]
    broker = make_broker()
    topic = _topic_with_records(broker, 2)
    with RawConnection(broker.bootstrap) as conn:
        found, _ = _fetch(conn, 12, [(topic, both)], max_bytes=0)
        assert [f[6] > len(RECORD) for f in found] == [True, False], found
        found, _ = _fetch(conn, 12, [(topic, both)], max_bytes=1 << 30)
        assert [f[6] > len(RECORD) for f in found] == [True, True], found
    limited = make_broker(**{"fetch.max.bytes": "1024"})
    topic = _topic_with_records(limited, 2)
    with RawConnection(limited.bootstrap) as conn:
        found, _ = _fetch(conn, 12, [(topic, both)], max_bytes=1 << 30)
        assert [f[6] > len(RECORD) for f in found] == [True, False], found
        assert [f[2] for f in found] == [E.NONE, E.NONE]
