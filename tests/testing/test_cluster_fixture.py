"""``automq_cluster_factory`` and ``AutoMQCluster``: brokers over a private PostgreSQL, used as
another project's suite would use them, and nothing of them left once they stop."""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from automq_py.testing import AutoMQCluster, AutoMQError, postgres
from automq_py.testing.cluster import listed_brokers
from automq_py.testing.pytest_plugin import AutoMQClusterFactory

pytest_plugins = ("pytester",)


def test_the_cluster_owns_node_ids_the_metadata_url_listeners_and_directories() -> None:
    for name in ("node.id", "metadata.store.url", "listeners", "log.dirs"):
        with pytest.raises(ValueError, match=name):
            AutoMQCluster(3, {name: "x"})
    with pytest.raises(ValueError, match="at least 1"):
        AutoMQCluster(0)


def test_missing_postgresql_is_named_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(postgres, "_DEBIAN_BIN_DIRS", str(tmp_path / "none" / "*" / "bin"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AutoMQError, match=r"initdb.*apt-get install postgresql"):
        AutoMQCluster(3, directory=tmp_path / "cluster")
    assert not (tmp_path / "cluster").exists()


def _produce(bootstrap: str, topic: str, count: int) -> dict[bytes, bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed: list[object] = []
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(count)}
    for key, value in sent.items():
        producer.produce(
            topic,
            key=key,
            value=value,
            on_delivery=lambda err, _msg: failed.append(err) if err else None,
        )
    assert producer.flush(60) == 0
    assert failed == []
    return sent


def _consume(bootstrap: str, topic: str, count: int) -> dict[bytes, bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "readback", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    received: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 60
    try:
        while len(received) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received[message.key()] = message.value()
    finally:
        consumer.close()
    return received


@pytest.mark.integration
def test_three_brokers_serve_a_six_partition_topic_through_any_of_them(
    automq_cluster_factory: AutoMQClusterFactory,
) -> None:
    cluster = automq_cluster_factory(brokers=3)
    bootstrap = cluster.bootstrap_servers
    assert bootstrap == ",".join(b.bootstrap_servers for b in cluster.brokers)
    assert len(set(bootstrap.split(","))) == 3
    assert cluster.metadata_store_url is not None
    assert cluster.metadata_store_url.startswith("postgresql://")

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("orders", 6, replication_factor=3)])["orders"].result(30)
    metadata = admin.list_topics(timeout=30)
    assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == {
        i: broker.bootstrap_servers for i, broker in enumerate(cluster.brokers)
    }
    leaders = Counter(p.leader for p in metadata.topics["orders"].partitions.values())
    assert leaders == {0: 2, 1: 2, 2: 2}  # each broker leads two of the six

    sent = _produce(bootstrap, "orders", 600)
    assert _consume(bootstrap, "orders", len(sent)) == sent
    # every broker tells the same: three brokers
    for broker in cluster.brokers:
        assert sorted(listed_brokers(broker.bootstrap_servers)) == [0, 1, 2]


def _exited(pid: int) -> bool:
    """No such process, or one that has exited and waits to be reaped: PostgreSQL's server
    runs detached, so once it exits it is the init process's to reap, which some containers'
    first process does only now and then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


EXTERNAL_SUITE = """
import json
import os

from automq_py.testing.cluster import listed_brokers


def test_a_broker_killed_and_restarted(automq_cluster_factory):
    cluster = automq_cluster_factory(brokers=3, **{"num.partitions": 6})
    broker = cluster.brokers[1]
    port = broker.port
    broker.kill()
    cluster.wait_for_brokers()  # until the others have fenced it
    assert sorted(listed_brokers(cluster.brokers[0].bootstrap_servers)) == [0, 2]
    assert cluster.bootstrap_servers.count(",") == 1
    broker.start()  # on its data and its port
    assert broker.port == port
    cluster.wait_for_brokers()
    assert sorted(listed_brokers(cluster.brokers[0].bootstrap_servers)) == [0, 1, 2]
    with open(os.environ["CLUSTER_REPORT"], "w") as report:
        json.dump(
            {
                "pids": [b.pid for b in cluster.brokers],
                "ports": [b.port for b in cluster.brokers] + [cluster.postgres.port],
                "directories": [str(cluster.directory), str(cluster.postgres.directory)],
                "postmaster": (cluster.postgres.data_dir / "postmaster.pid").read_text().split()[0],
                "properties": cluster.brokers[2].properties,
            },
            report,
        )
"""


@pytest.mark.integration
def test_an_external_suite_gets_a_cluster_and_nothing_outlives_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    report_path = pytester.path / "cluster.json"
    monkeypatch.setenv("CLUSTER_REPORT", str(report_path))
    pytester.makeini("[pytest]\nautomq_properties =\n    log.retention.ms=600000\n")
    pytester.makepyfile(test_external=EXTERNAL_SUITE)
    # a separate interpreter: the plugin comes from the installed entry point, not from here
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)

    report = json.loads(report_path.read_text())
    properties = report["properties"]
    assert properties["node.id"] == "2"
    assert properties["num.partitions"] == "6"  # from the call
    assert properties["log.retention.ms"] == "600000"  # from the ini file
    assert properties["s3.data.buckets"].startswith("0@file:///")
    assert properties["metadata.store.url"].startswith("postgresql://")
    for pid in [*report["pids"], int(report["postmaster"])]:
        assert _exited(pid), pid
    for port in report["ports"]:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    for directory in report["directories"]:
        assert not Path(directory).exists()
