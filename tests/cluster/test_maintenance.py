"""Maintenance in a cluster: each broker tends the partitions it leads (retention), and only the
controller runs the jobs over every node's objects (SSO/SO compaction, object GC), so two
brokers never compact or collect the same objects."""

from __future__ import annotations

import os
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.cluster.conftest import ClusterFactory


def test_retention_everywhere_compaction_and_gc_on_the_controller(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = cluster_factory(
        brokers=2,
        **{
            "s3.wal.upload.interval.ms": "200",
            "s3.maintenance.runner": "local",
            "s3.stream.set.object.compaction.interval.minutes": "0.02",
            "s3.stream.object.compaction.interval.minutes": "0.05",
            "log.retention.check.interval.ms": "1000",
            "s3.object.delete.retention.minutes": "0",
            "log.retention.ms": "2000",
            "log.roll.ms": "500",
        },
    )
    admin = cluster.admin(0)
    admin.create_topics([NewTopic("aging", 4)])["aging"].result(timeout=30)
    assert set(cluster.leaders("aging").values()) == {0, 1}
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20})
    started = time.monotonic()
    while time.monotonic() - started < 15:
        for i in range(40):
            producer.produce("aging", os.urandom(500), partition=i % 4)
        producer.flush(30)
        time.sleep(0.2)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "wm"})
    try:
        deadline = time.monotonic() + 20
        while True:
            starts = [
                consumer.get_watermark_offsets(TopicPartition("aging", p), timeout=10)[0]
                for p in range(4)
            ]
            if all(s > 0 for s in starts):
                break
            assert time.monotonic() < deadline, f"log start offsets {starts}"
            time.sleep(0.5)
    finally:
        consumer.close()
    controller = cluster.controller()
    logs = {i: b.log_path.read_text() for i, b in enumerate(cluster.brokers)}
    for node, text in logs.items():
        assert "maintenance retention done" in text, node
        cluster_wide = "maintenance compact-sso done" in text or "maintenance gc done" in text
        assert cluster_wide == (node == controller), (node, controller)
