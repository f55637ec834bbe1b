"""Cold reads through the real broker: after a restart every byte comes from object storage
(SeaweedFS), across many objects, byte-identical, in far fewer GETs than blocks."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from storage.block_cache import BlockCache
from storage.object_format import namespace_for_cluster, object_id_from_key
from storage.object_reader import ObjectReader
from storage.operator import open_object_store
from tests.automq_py.conftest import MakeBroker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

PARTITIONS = 4
RECORDS = 6000  # of 1000 bytes: 1.5 MB a partition
# small objects and blocks, so a few MB make dozens of objects of several blocks each
SMALL_OBJECTS = {
    "s3.wal.upload.threshold": str(1 << 20),
    "s3.stream.object.split.size": str(128 << 10),
    "s3.object.block.size": str(32 << 10),
}


def produce(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(15)
    # Java's batch.size (librdkafka's is 1 MB): several batches, so several blocks, an object
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384}
    )
    rng = random.Random(11)
    sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for i in range(RECORDS):
        value = rng.randbytes(1000)
        producer.produce(topic, value, partition=i % PARTITIONS)
        sent[i % PARTITIONS].append(value)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return sent


def consume(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"cold-{time.monotonic_ns()}",
            "enable.auto.commit": False,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                got[msg.partition()].append(msg.value() or b"")
    finally:
        consumer.close()
    return got


def gets_logged_at_stop(broker: BrokerProcess) -> int:
    line = [x for x in broker.log_tail(80).splitlines() if "object store requests:" in x][-1]
    words = line.split("object store requests: ", 1)[1].split()
    return int(words[words.index("get") + 1])


async def objects_and_blocks(s3: SeaweedFS, cluster_id: str) -> tuple[int, int]:
    """Objects of the cluster in the bucket, and data blocks in them (from their indexes)."""
    namespace = namespace_for_cluster(cluster_id)
    store = open_object_store(s3.url())
    try:
        reader = ObjectReader(store, namespace, BlockCache(0))
        objects = blocks = 0
        async for info in store.list():
            if f"/{namespace}/" in info.key:
                objects += 1
                blocks += len(await reader.index(object_id_from_key(info.key), info.size))
        return objects, blocks
    finally:
        await store.close()


def test_a_restarted_broker_serves_a_catch_up_read_of_many_objects(
    make_broker: MakeBroker, s3_server: SeaweedFS
) -> None:
    broker = make_broker(**SMALL_OBJECTS)
    sent = produce(broker.bootstrap, "cold")
    assert broker.stop() == 0  # uploads what the WAL holds
    broker.start()  # empty caches: every read goes to object storage
    assert consume(broker.bootstrap, "cold") == sent
    assert broker.stop() == 0
    gets = gets_logged_at_stop(broker)
    objects, blocks = asyncio.run(objects_and_blocks(s3_server, broker.overrides["cluster.id"]))
    assert objects >= 20 and blocks >= 2 * objects, (objects, blocks)
    # an index GET per object read (a small object's tail GET is the whole object), the data in
    # merged GETs read ahead across objects: reading block by block would take three times more
    assert gets > 0 and 3 * gets < blocks, (gets, objects, blocks)
