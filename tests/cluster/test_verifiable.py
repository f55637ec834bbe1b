"""Kafka's own system-test workload against a cluster whose brokers are bounced.

Kafka's replication system test (``tests/kafkatest/tests/core/replication_test.py``) runs its
``VerifiableProducer`` (the Java producer, idempotent, ``acks=all``: each record a number, each
acknowledgement printed) and ``VerifiableConsumer`` (a Java consumer in a group, each record
printed) while it bounces the leader of a partition, cleanly or with ``kill -9``, then checks
that every acknowledged number was consumed and, the producer being idempotent, that none was
stored twice. Here the same two tools of Kafka 4.4 run against three broker processes whose
WAL is a file: a broker killed comes back on its data (its partitions wait for it), a broker
stopped hands its partitions over first.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from tests.cluster.conftest import Cluster, ClusterFactory
from tests.support.java import JavaProgram, java_command

PARTITIONS = 3
THROUGHPUT = 1000  # records a second, as the system test's producer
BOUNCES = 2  # one after the other


def verifiable(tool: str, *args: str) -> list[str]:
    return java_command(f"org.apache.kafka.tools.{tool}", *args)


def _events(program: JavaProgram, name: str) -> list[dict[str, object]]:
    found = []
    for line in list(program.lines):
        if line.startswith("{") and f'"name":"{name}"' in line:
            found.append(json.loads(line))
    return found


def _acked(producer: JavaProgram) -> list[dict[str, object]]:
    return _events(producer, "producer_send_success")


def _wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.2)


def _victim(cluster: Cluster, topic: str, group: str, role: str) -> int:
    """The broker leading partition 0 of ``topic``, or the coordinator of ``group``."""
    admin = cluster.admin()
    if role == "leader":
        leader = cluster.leaders(topic, via=0).get(0)
        assert leader is not None and leader >= 0, f"partition 0 has no leader: {leader}"
        return leader
    described = admin.describe_consumer_groups([group])[group].result(30)
    return int(described.coordinator.id)


def _bounce(cluster: Cluster, node: int, hard: bool) -> None:
    """Broker ``node`` killed (or stopped) and started again on its data."""
    victim = cluster.brokers[node]
    if hard:
        victim.kill()
    else:
        victim.stop()
    victim.start()
    cluster.wait_for_brokers(len(cluster.brokers), via=(node + 1) % len(cluster.brokers))


@pytest.mark.parametrize(
    ("role", "hard", "protocol"),
    [("leader", True, "classic"), ("coordinator", False, "consumer")],
    ids=["leader-hard-classic", "coordinator-clean-848"],
)
def test_acknowledged_records_survive_bounces_exactly_once(
    cluster_factory: ClusterFactory, tmp_path: Path, role: str, hard: bool, protocol: str
) -> None:
    """The leader of partition 0 killed twice under a classic group; the group's coordinator
    stopped twice under a KIP-848 group, whose members keep their epochs and partitions where
    the group loads next (a member the next coordinator did not know would be refused its
    committed offsets, UNKNOWN_MEMBER_ID, which ends the Java consumer's application)."""
    cluster = cluster_factory(brokers=3)
    topic = "verifiable"
    admin = cluster.admin()  # held until the result: a dropped client cancels its requests
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)

    consumer = JavaProgram(
        verifiable(
            "VerifiableConsumer",
            "--bootstrap-server",
            cluster.bootstrap,
            "--topic",
            topic,
            "--group-id",
            "verifiable-group",
            "--group-protocol",
            protocol,
            "--reset-policy",
            "earliest",
            "--verbose",
        ),
        tmp_path / "consumer.log",
    ).start()
    # the system test's idempotent producer: the tool sets retries=0 unless told otherwise
    producer_config = tmp_path / "producer.properties"
    producer_config.write_text("enable.idempotence=true\nretries=2147483647\n")
    producer = JavaProgram(
        verifiable(
            "VerifiableProducer",
            "--command-config",
            str(producer_config),
            "--bootstrap-server",
            cluster.bootstrap,
            "--topic",
            topic,
            "--throughput",
            str(THROUGHPUT),
            "--acks",
            "-1",
        ),
        tmp_path / "producer.log",
    ).start()
    try:
        _wait_for(lambda: len(_acked(producer)) >= THROUGHPUT, 60, "the first acknowledgements")
        for _ in range(BOUNCES):
            _bounce(cluster, _victim(cluster, topic, "verifiable-group", role), hard)
            before = len(_acked(producer))
            _wait_for(
                lambda before=before: len(_acked(producer)) >= before + THROUGHPUT // 2,
                60,
                "acknowledgements after the bounce",
            )
        assert producer.stop(60) in (0, 143)  # it flushes and prints its last acks
        acked = {str(e["value"]): (int(e["partition"]), int(e["offset"])) for e in _acked(producer)}  # type: ignore[call-overload]

        def consumed_all() -> bool:
            values = {str(e["value"]) for e in _events(consumer, "record_data")}
            return set(acked) <= values

        _wait_for(consumed_all, 60, "every acknowledged record consumed")
    finally:
        producer.stop()
        consumer.stop()

    errors = _events(producer, "producer_send_error")
    stored: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for e in _events(consumer, "record_data"):
        stored[str(e["value"])].add((int(e["partition"]), int(e["offset"])))  # type: ignore[call-overload]
    twice = {v: sorted(at) for v, at in stored.items() if len(at) > 1}
    assert not twice, f"stored twice: {list(twice.items())[:5]}"
    moved = {v: (at, stored[v]) for v, at in acked.items() if at not in stored[v]}
    assert not moved, f"consumed elsewhere than acknowledged: {list(moved.items())[:5]}"
    assert len(acked) >= THROUGHPUT * 2, len(acked)
    # retried until acknowledged: a bounce fails no send
    assert not errors, errors[:5]
