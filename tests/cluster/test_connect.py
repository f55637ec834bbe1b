"""Kafka Connect and MirrorMaker 2 (4.3.1) against clusters of broker processes.

Connect keeps all of its state in Kafka: its workers form a group of their own protocol
(``connect``, incremental cooperative), and its connectors' configurations, source offsets and
statuses live in three compacted topics that each worker reads to their end. With
``exactly.once.source.support=enabled`` the group's leader writes the configuration topic in
transactions and fences the producers of a task before it moves, and each source task writes
its records and offsets in one transaction. MirrorMaker 2 runs Connect's herders between two
clusters: it copies topics, emits offset syncs and checkpoints, and writes a group's offsets,
translated, into the other cluster.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from automq_py.coordinator.runtime import partition_for
from tests.cluster.conftest import Cluster, ClusterFactory
from tests.support.broker import free_port
from tests.support.java import JavaProgram, java_command

CONNECT_JVM = ("-Xmx384m", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xss1m")


def _wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.25)


def _log_config(path: Path) -> Path:
    """Connect's INFO lines to stderr (the program's log): what a failed test shows."""
    path.write_text(
        "status = warn\n"
        "appender.err.type = Console\n"
        "appender.err.name = err\n"
        "appender.err.target = SYSTEM_ERR\n"
        "appender.err.layout.type = PatternLayout\n"
        "appender.err.layout.pattern = [%d] %p %m (%c{1})%n\n"
        "rootLogger.level = warn\n"
        "rootLogger.appenderRef.err.ref = err\n"
        "logger.connect.name = org.apache.kafka.connect\n"
        "logger.connect.level = info\n"
    )
    return path


def _properties(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


class Worker:
    """One distributed Connect worker and its REST API."""

    def __init__(self, root: Path, name: str, bootstrap: str) -> None:
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        config = _properties(
            root / f"{name}.properties",
            {
                "bootstrap.servers": bootstrap,
                "group.id": "connect-cluster",
                "key.converter": "org.apache.kafka.connect.storage.StringConverter",
                "value.converter": "org.apache.kafka.connect.storage.StringConverter",
                "config.storage.topic": "connect-configs",
                "offset.storage.topic": "connect-offsets",
                "status.storage.topic": "connect-status",
                # the broker's default.replication.factor
                "config.storage.replication.factor": "-1",
                "offset.storage.replication.factor": "-1",
                "status.storage.replication.factor": "-1",
                "offset.flush.interval.ms": "1000",
                "exactly.once.source.support": "enabled",
                "listeners": f"http://127.0.0.1:{self.port}",
                "rest.advertised.host.name": "127.0.0.1",
                "scheduled.rebalance.max.delay.ms": "5000",
            },
        )
        self.program = JavaProgram(
            java_command(
                "org.apache.kafka.connect.cli.ConnectDistributed",
                str(config),
                kafka="connect",
                jvm=(
                    *CONNECT_JVM,
                    f"-Dlog4j2.configurationFile={_log_config(root / 'log4j2.properties')}",
                ),
            ),
            root / f"{name}.log",
        )

    def start(self) -> Worker:
        self.program.start()
        _wait_for(lambda: self.get("/connectors") is not None, 90, "the worker's REST API")
        return self

    def request(self, method: str, path: str, body: object = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def get(self, path: str) -> object:
        try:
            return self.request("GET", path)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def running(self, connector: str) -> bool:
        status = self.get(f"/connectors/{connector}/status")
        if not isinstance(status, dict):
            return False
        tasks = status.get("tasks", [])
        return (
            status["connector"]["state"] == "RUNNING"
            and bool(tasks)
            and all(t["state"] == "RUNNING" for t in tasks)
        )

    def stop(self) -> None:
        self.program.stop(60)


def _consume_committed(bootstrap: str, topic: str, count: int, timeout: float = 60) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            values.append(message.value().decode())
        # anything past the count: read a little longer
        end = time.monotonic() + 2
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value().decode())
    finally:
        consumer.close()
    return values


def _victim(cluster: Cluster, role: str) -> int:
    """The broker leading the topic's partition, or the transaction coordinator of the source
    task's transactional id (``<group.id>-<connector>-<task>``)."""
    if role == "leader":
        node = cluster.leaders("lines").get(0)
    else:
        leaders = cluster.leaders("__transaction_state")
        node = leaders.get(partition_for("connect-cluster-lines-in-0", len(leaders)))
    assert node is not None and node >= 0, f"{role}: {node}"
    return node


@pytest.mark.parametrize("role", ["leader", "transaction-coordinator"])
def test_connect_moves_a_file_through_a_topic_exactly_once_while_a_broker_is_killed(
    cluster_factory: ClusterFactory, tmp_path: Path, role: str
) -> None:
    """Two distributed workers run a file source (exactly once, in transactions) and a file
    sink over three brokers. The leader of the topic's partition, or the source task's
    transaction coordinator, is killed with ``kill -9`` while lines are written and started
    again on its data; then the worker running the source task is killed: every line is in
    the topic once, in order, and reaches the sink's file."""
    cluster = cluster_factory(brokers=3)
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("")
    workers = [Worker(tmp_path / "connect", f"worker{i}", cluster.bootstrap) for i in range(2)]
    try:
        for worker in workers:
            worker.start()
        first = workers[0]
        first.request(
            "PUT",
            "/connectors/lines-in/config",
            {
                "connector.class": "org.apache.kafka.connect.file.FileStreamSourceConnector",
                "file": str(source),
                "topic": "lines",
                "tasks.max": "1",
                "topic.creation.default.replication.factor": "-1",
                "topic.creation.default.partitions": "1",
            },
        )
        first.request(
            "PUT",
            "/connectors/lines-out/config",
            {
                "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
                "file": str(sink),
                "topics": "lines",
                "tasks.max": "1",
            },
        )
        for name in ("lines-in", "lines-out"):
            _wait_for(lambda name=name: first.running(name), 90, f"{name} running")

        def write(lines: range) -> None:
            with source.open("a") as f:
                f.writelines(f"line-{i}\n" for i in lines)

        def sunk() -> set[str]:
            return set(sink.read_text().split()) if sink.exists() else set()

        write(range(0, 500))
        _wait_for(lambda: len(sunk()) >= 500, 60, "the first lines sunk")
        victim = cluster.brokers[_victim(cluster, role)]
        victim.kill()
        write(range(500, 1000))
        victim.start()
        write(range(1000, 1500))
        _wait_for(lambda: sunk() >= {f"line-{i}" for i in range(1500)}, 120, "the lines sunk")

        # the worker running the source task killed: the task moves to the other worker, whose
        # leader fences the dead task's transactional producer first, and resumes from the
        # offsets committed with its last transaction
        status = first.get("/connectors/lines-in/status")
        assert isinstance(status, dict)
        port = int(status["tasks"][0]["worker_id"].rsplit(":", 1)[1])
        dead = next(w for w in workers if w.port == port)
        alive = next(w for w in workers if w is not dead)
        dead.program.kill()
        write(range(1500, 2000))
        _wait_for(lambda: sunk() >= {f"line-{i}" for i in range(2000)}, 120, "every line sunk")
        for name in ("lines-in", "lines-out"):
            _wait_for(lambda name=name: alive.running(name), 60, f"{name} running at the end")
        status = alive.get("/connectors/lines-in/status")
        assert isinstance(status, dict)
        assert status["tasks"][0]["worker_id"] == f"127.0.0.1:{alive.port}", status
    finally:
        for worker in workers:
            worker.stop()

    stored = _consume_committed(cluster.bootstrap, "lines", 2000)
    assert stored == [f"line-{i}" for i in range(2000)], (
        f"{len(stored)} stored; first differences: "
        f"{[(i, v) for i, v in enumerate(stored) if v != f'line-{i}'][:5]}"
    )


def test_mirror_maker_copies_a_topic_and_translates_a_groups_offsets(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    """MirrorMaker 2, dedicated, from cluster A to cluster B: A's topic appears in B as
    ``A.orders`` with the same records at the same offsets, and a group's offsets committed in
    A are written into B for ``A.orders``, so the group resumes there where it left off."""
    upstream = cluster_factory(brokers=1)
    downstream = cluster_factory(brokers=2, first_node_id=10)
    admin = upstream.admin()
    admin.create_topics([NewTopic("orders", 3, 1)])["orders"].result(30)
    producer = Producer({"bootstrap.servers": upstream.bootstrap, "linger.ms": 5})
    for i in range(300):
        producer.produce("orders", f"order-{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0

    # the group reads everything and commits where it stands in each partition
    group = "billing"
    consumer = Consumer(
        {
            "bootstrap.servers": upstream.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["orders"])
    read = 0
    deadline = time.monotonic() + 60
    while read < 300:
        assert time.monotonic() < deadline, f"{read} of 300 read"
        message = consumer.poll(1)
        if message is not None and not message.error():
            read += 1
    consumer.commit(asynchronous=False)
    committed = {
        tp.partition: tp.offset
        for tp in consumer.committed([TopicPartition("orders", p) for p in range(3)], 10)
    }
    consumer.close()
    assert committed == {0: 100, 1: 100, 2: 100}

    config = _properties(
        tmp_path / "mm2.properties",
        {
            "clusters": "A, B",
            "A.bootstrap.servers": upstream.bootstrap,
            "B.bootstrap.servers": downstream.bootstrap,
            "A->B.enabled": "true",
            "A->B.topics": "orders",
            "A->B.groups": group,
            "B->A.enabled": "false",
            "replication.factor": "1",
            "checkpoints.topic.replication.factor": "1",
            "heartbeats.topic.replication.factor": "1",
            "offset-syncs.topic.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "config.storage.replication.factor": "1",
            "sync.group.offsets.enabled": "true",
            "sync.group.offsets.interval.seconds": "1",
            "emit.checkpoints.interval.seconds": "1",
            "emit.heartbeats.interval.seconds": "1",
            "refresh.topics.interval.seconds": "2",
            "refresh.groups.interval.seconds": "2",
            "offset.lag.max": "0",
        },
    )
    mirror = JavaProgram(
        java_command(
            "org.apache.kafka.connect.mirror.MirrorMaker",
            str(config),
            kafka="connect",
            jvm=(
                *CONNECT_JVM,
                f"-Dlog4j2.configurationFile={_log_config(tmp_path / 'log4j2.properties')}",
            ),
        ),
        tmp_path / "mm2.log",
    ).start()
    try:
        down_admin = downstream.admin()

        def translated() -> dict[int, int] | None:
            try:
                offsets = down_admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group)]
                )[group].result(10)
            except Exception:
                return None
            found = {
                tp.partition: tp.offset
                for tp in offsets.topic_partitions
                if tp.topic == "A.orders" and tp.offset >= 0
            }
            return found if found == committed else None

        # the group caught up in A: its offsets are translated exactly (the last offset sync
        # of each partition is that of its last record)
        _wait_for(translated, 120, "the group's offsets translated into B")
        for i in range(300, 330):
            producer.produce("orders", f"order-{i}".encode(), partition=i % 3)
        assert producer.flush(30) == 0
        # the group, moved to B, reads only what came after
        resumed = _consume_by_partition(downstream.bootstrap, "A.orders", 30, group=group)
        copied = _consume_by_partition(downstream.bootstrap, "A.orders", 330)
    finally:
        assert mirror.stop(60) in (0, 130, 143), mirror.log_tail()

    assert resumed == {
        p: [(100 + k, f"order-{300 + 3 * k + p}") for k in range(10)] for p in range(3)
    }
    assert copied == _consume_by_partition(upstream.bootstrap, "orders", 330)


def _consume_by_partition(
    bootstrap: str, topic: str, count: int, group: str | None = None
) -> dict[int, list[tuple[int, str]]]:
    """``count`` records of ``topic`` from the start (or from ``group``'s offsets), by partition;
    fails if more follow within a second."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group or f"check-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    found: dict[int, list[tuple[int, str]]] = {}
    read = 0
    deadline = time.monotonic() + 60
    try:
        while read < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            found.setdefault(message.partition(), []).append(
                (message.offset(), message.value().decode())
            )
            read += 1
        extra = consumer.poll(1)
        assert extra is None or extra.error(), f"more than {count} in {topic}: {extra.offset()}"
    finally:
        consumer.close()
    assert read == count, f"{read} of {count} read from {topic}"
    for records in found.values():
        records.sort()
    return found
