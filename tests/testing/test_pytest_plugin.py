"""The pytest plugin (entry point ``automq_py``) used as another project's suite would use it:
only its fixtures, two client libraries, and an external suite run through ``pytester``."""

from __future__ import annotations

import os
import signal
import socket
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer  # type: ignore[import-untyped]
from kafka.admin import NewTopic as KafkaPythonNewTopic  # type: ignore[import-untyped]

from automq_py.testing import AutoMQError, AutoMQProcess, process
from automq_py.testing.process import free_port, with_test_defaults
from automq_py.testing.pytest_plugin import AutoMQBrokerFactory

pytest_plugins = ("pytester",)

MiB = 1 << 20
# the test WAL (64 MiB ring) plus the file's 8 KiB header area
TEST_WAL_FILE_SIZE = 64 * MiB + 8192


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins.get("automq_py") == "automq_py.testing.pytest_plugin"


def test_an_xdist_worker_takes_ports_from_its_own_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers never get the same port, nor one the kernel gives out for connections."""
    first, size, blocks = process._WORKER_PORTS
    assert first + size * blocks <= 18_300  # below the test S3 servers' ports
    start = first + size * 3
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(process, "_next_port", start + size - 2)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", start + size - 1))
        taken.listen()
        ports = [free_port() for _ in range(4)]
    assert start + size - 1 not in ports and len(set(ports)) == 4
    assert all(start <= port < start + size for port in ports)
    assert ports[1] < ports[0]  # round the block
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{blocks}")  # past the blocks: any free port
    assert not first <= free_port() < first + size * blocks


def test_test_defaults_keep_the_broker_small_and_quiet() -> None:
    defaults = with_test_defaults()
    assert defaults["s3.wal.capacity"] == str(64 * MiB)
    assert defaults["s3.wal.upload.threshold"] == str(16 * MiB)  # at most half the WAL
    assert defaults["s3.maintenance.runner"] == "none"
    assert defaults["s3.wal.init.zero"] == "false"  # a quicker first start
    # a smaller WAL gets a threshold that fits it; an explicit threshold is kept
    assert with_test_defaults({"s3.wal.capacity": str(8 * MiB)})["s3.wal.upload.threshold"] == (
        str(4 * MiB)
    )
    assert with_test_defaults({"s3.wal.upload.threshold": "1000"})["s3.wal.upload.threshold"] == (
        "1000"
    )
    assert with_test_defaults({"s3.maintenance.runner": "local"})["s3.maintenance.runner"] == (
        "local"
    )
    with pytest.raises(ValueError, match="listeners"):
        AutoMQProcess({"listeners": "PLAINTEXT://127.0.0.1:9092"})


@pytest.mark.integration
def test_confluent_kafka_round_trip(kafka_bootstrap: str) -> None:
    topic = "plugin-confluent"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30)

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(200)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": "plugin-confluent",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    received: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 60
    try:
        while len(received) < len(sent) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received[message.key()] = message.value()
    finally:
        consumer.close()
    assert received == sent


@pytest.mark.integration
def test_kafka_python_round_trip(kafka_bootstrap: str) -> None:
    topic = "plugin-kafka-python"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([KafkaPythonNewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = [f"record-{i}".encode() for i in range(100)]
    for i, value in enumerate(sent):
        producer.send(topic, value, partition=i % 2)
    producer.flush(30)
    producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id="plugin-kafka-python",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15_000,
    )
    received = []
    try:
        for message in consumer:  # ends after 15 s without a record
            received.append(message.value)
            if len(received) == len(sent):
                break
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)


def _partitions(bootstrap: str, topic: str) -> int | None:
    """The partition count of ``topic`` as the broker reports it (None: no such topic);
    asks for that one topic only, so the broker does not create it."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    found = metadata.topics.get(topic)
    return None if found is None else len(found.partitions)


@pytest.mark.integration
def test_the_factory_starts_separate_brokers_with_their_own_properties(
    automq_broker_factory: AutoMQBrokerFactory,
) -> None:
    default = automq_broker_factory()
    wide = automq_broker_factory({"num.partitions": 4})
    assert default.bootstrap_servers != wide.bootstrap_servers

    producer = Producer({"bootstrap.servers": wide.bootstrap_servers})
    producer.produce("auto-created", b"first")  # the broker creates the topic on first use
    assert producer.flush(30) == 0

    assert _partitions(wide.bootstrap_servers, "auto-created") == 4
    # each process is a cluster of its own, with its own data
    assert _partitions(default.bootstrap_servers, "auto-created") is None
    for broker in (default, wide):
        assert (broker.data_dir / "wal" / "wal.log").stat().st_size == TEST_WAL_FILE_SIZE


@pytest.mark.integration
def test_stop_ends_the_process_and_removes_its_directory(
    automq_broker_factory: AutoMQBrokerFactory,
) -> None:
    broker = automq_broker_factory()
    pid, directory, port = broker.pid, broker.directory, broker.port
    assert pid is not None and port is not None
    assert "preallocating 67117056 bytes" in broker.log_tail(200)  # serve says what it reserves

    assert broker.stop(check=True) == 0
    assert not directory.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert broker.stop() is None  # the fixture's teardown stops it again: nothing happens


@pytest.mark.integration
def test_a_broker_that_died_is_reported_when_stopped(
    automq_broker_factory: AutoMQBrokerFactory,
) -> None:
    broker = automq_broker_factory()
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGKILL)
    with pytest.raises(AutoMQError, match=f"exited with {-signal.SIGKILL}"):
        broker.stop(check=True)
    assert not broker.directory.exists()


@pytest.mark.integration
def test_a_port_taken_before_the_broker_binds_it_is_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr(process, "free_port", lambda: next(ports, 0) or free_port())
        with AutoMQProcess(directory=tmp_path / "broker") as broker:
            assert broker.port != taken
            assert "address already in use" in broker.log_tail(200).lower()
            producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
            producer.produce("after-retry", b"x")
            assert producer.flush(30) == 0
    assert not (tmp_path / "broker").exists()


EXTERNAL_SUITE = """
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer


def test_round_trip(kafka_bootstrap):
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send("external", b"hello").get(30)
    producer.close()
    consumer = KafkaConsumer(
        "external",
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
    )
    assert next(consumer).value == b"hello"  # StopIteration after 15 s without a record
    consumer.close()


def test_one_broker_per_session_with_the_configured_properties(kafka_bootstrap, automq_broker):
    assert kafka_bootstrap == automq_broker.bootstrap_servers
    topics = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30).topics
    assert len(topics["external"].partitions) == 2  # num.partitions from the ini file
    wal = automq_broker.data_dir / "wal" / "wal.log"
    assert wal.stat().st_size == 32 * 1024 * 1024 + 8192  # s3.wal.capacity from the command line
"""


@pytest.mark.integration
def test_an_external_suite_gets_the_fixtures_from_the_entry_point(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nautomq_properties =\n    num.partitions=2\n")
    pytester.makepyfile(test_external=EXTERNAL_SUITE)
    # a separate interpreter: the plugin comes from the installed entry point, not from here
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--automq-property", f"s3.wal.capacity={32 * MiB}"
    )
    result.assert_outcomes(passed=2)
    assert not list(pytester.path.rglob("wal.log")), "the broker's directory outlived the session"
