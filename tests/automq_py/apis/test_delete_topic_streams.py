"""DeleteTopics frees a topic's storage, as Kafka deletes a topic's logs: on the real broker
process, the streams of every partition (MetaStream, log, time index) are deleted in the
metadata after the answer, so their objects become garbage for the GC job; a topic deleted
before a restart is finished by the restarted broker; other topics keep their data."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from spark_jobs.controller_client import ControllerClient
from storage.metadata.image import MetadataImage
from tests.automq_py.conftest import MakeBroker
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 200  # per topic


def describe(broker: BrokerProcess) -> MetadataImage:
    async def go() -> MetadataImage:
        async with await ControllerClient.connect(broker.bootstrap) as client:
            return (await client.describe_s3_metadata())[0]

    return asyncio.run(go())


def create_and_fill(broker: BrokerProcess, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for topic in topics:
        for i in range(RECORDS):
            producer.produce(topic, f"{topic}-{i}".encode() * 50, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def delete(broker: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(30)


def wait_for_streams(broker: BrokerProcess, count: int, timeout: float = 30) -> MetadataImage:
    deadline = time.monotonic() + timeout
    while True:
        image = describe(broker)
        if len(image.streams) == count or time.monotonic() > deadline:
            return image
        time.sleep(0.2)


def read_all(broker: BrokerProcess, topic: str) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def test_deleting_a_topic_deletes_its_streams(make_broker: MakeBroker) -> None:
    broker = make_broker(**{"s3.wal.upload.interval.ms": "200"})
    create_and_fill(broker, "keep", "drop")
    before = describe(broker)
    # nothing else has streams yet, and both topics have as many partitions
    assert len(before.streams) % 2 == 0
    per_topic = len(before.streams) // 2
    assert per_topic >= 2 * PARTITIONS  # a MetaStream and a log stream per partition at least
    delete(broker, "drop")
    after = wait_for_streams(broker, len(before.streams) - per_topic)
    assert len(after.streams) == len(before.streams) - per_topic, "the streams were not deleted"
    # the dropped streams' objects are freed: Stream Objects are marked destroyed, and stream
    # set objects keep only ranges of live streams
    live = set(after.streams)
    for node in after.nodes.values():
        for sso in node.stream_set_objects:
            assert {r.stream_id for r in sso.ranges} <= live
    assert all(so.stream_id in live for s in after.streams.values() for so in s.stream_objects)
    assert sorted(read_all(broker, "keep")) == sorted(
        f"keep-{i}".encode() * 50 for i in range(RECORDS)
    )


def test_a_restarted_broker_finishes_deleting_a_topic(make_broker: MakeBroker) -> None:
    broker = make_broker()
    create_and_fill(broker, "keep", "drop")
    before = describe(broker)
    per_topic = len(before.streams) // 2
    delete(broker, "drop")
    broker.kill()  # at once: the deletion after the answer may not have run
    broker.start()
    after = wait_for_streams(broker, len(before.streams) - per_topic)
    assert len(after.streams) == len(before.streams) - per_topic
    assert sorted(read_all(broker, "keep")) == sorted(
        f"keep-{i}".encode() * 50 for i in range(RECORDS)
    )
