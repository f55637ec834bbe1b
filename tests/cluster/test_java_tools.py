"""Kafka's own tools against a three-broker cluster: kafka-topics describes where partitions
are led, kafka-reassign-partitions moves them, and the records stay whole."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.cluster.conftest import ClusterFactory
from tests.support.java import run_tool


def _leaders(describe: str) -> dict[int, int]:
    """partition -> leader from ``kafka-topics --describe`` output."""
    found = re.findall(r"Partition: (\d+)\s+Leader: (-?\d+)", describe)
    return {int(p): int(leader) for p, leader in found}


def test_topics_describe_and_reassign_partitions(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = cluster_factory(brokers=3)
    bootstrap = cluster.brokers[1].bootstrap
    run_tool(
        "kafka-topics",
        "--bootstrap-server",
        bootstrap,
        "--create",
        "--topic",
        "routes",
        "--partitions",
        "3",
        "--replication-factor",
        "3",
    )
    described = run_tool(
        "kafka-topics", "--bootstrap-server", bootstrap, "--describe", "--topic", "routes"
    )
    leaders = _leaders(described.stdout)
    assert sorted(leaders.values()) == [0, 1, 2], described.stdout
    assert "ReplicationFactor: 1" in described.stdout

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    for i in range(300):
        producer.produce("routes", value=f"a{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0

    # every partition onto the broker leading partition 0
    target = leaders[0]
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": "routes", "partition": p, "replicas": [target]} for p in range(3)
                ],
            }
        )
    )
    run_tool(
        "kafka-reassign-partitions",
        "--bootstrap-server",
        bootstrap,
        "--execute",
        "--reassignment-json-file",
        str(plan),
    )
    deadline = time.monotonic() + 30
    while set(cluster.leaders("routes", via=2).values()) != {target}:
        assert time.monotonic() < deadline, cluster.leaders("routes", via=2)
        time.sleep(0.1)
    verified = run_tool(
        "kafka-reassign-partitions",
        "--bootstrap-server",
        bootstrap,
        "--verify",
        "--reassignment-json-file",
        str(plan),
    )
    assert "Reassignment of partition routes-1 is completed." in verified.stdout, verified.stdout

    for i in range(300):
        producer.produce("routes", value=f"b{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "check"})
    consumer.assign([TopicPartition("routes", p, 0) for p in range(3)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < 600 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    assert sorted(got) == sorted(
        [f"a{i}".encode() for i in range(300)] + [f"b{i}".encode() for i in range(300)]
    )


def test_java_clients_produce_and_consume_through_any_broker(
    cluster_factory: ClusterFactory,
) -> None:
    """Kafka's Java producer and consumer (the console tools) bootstrapped from each broker in
    turn: the records of every producer, spread over partitions led by all three brokers, are
    read back whole through another broker."""
    cluster = cluster_factory(brokers=3)
    run_tool(
        "kafka-topics",
        "--bootstrap-server",
        cluster.brokers[0].bootstrap,
        "--create",
        "--topic",
        "java-any",
        "--partitions",
        "6",
    )
    described = run_tool(
        "kafka-topics",
        "--bootstrap-server",
        cluster.brokers[2].bootstrap,
        "--describe",
        "--topic",
        "java-any",
    )
    assert set(_leaders(described.stdout).values()) == {0, 1, 2}, described.stdout
    expected: list[str] = []
    for n, broker in enumerate(cluster.brokers):
        lines = [f"via{n}-{i}" for i in range(30)]
        expected += lines
        run_tool(
            "kafka-console-producer",
            "--bootstrap-server",
            broker.bootstrap,
            "--topic",
            "java-any",
            "--producer-property",
            "acks=all",
            "--producer-property",
            "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
            stdin="\n".join(lines) + "\n",
        )
    for n, broker in enumerate(cluster.brokers):
        read = run_tool(
            "kafka-console-consumer",
            "--bootstrap-server",
            broker.bootstrap,
            "--topic",
            "java-any",
            "--from-beginning",
            "--max-messages",
            str(len(expected)),
            "--timeout-ms",
            "30000",
            "--group",
            f"java-any-{n}",
        )
        assert sorted(read.lines()) == sorted(expected), (n, read.stderr[-2000:])
