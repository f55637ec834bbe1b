"""Replication factors and manual replica assignments through confluent-kafka's and kafka-python's
admin clients, against the real broker on real S3, started with ``default.replication.factor=3``
(Schema Registry's and Kafka Connect's default). A topic asked for with 3 replicas is created with
one (object storage keeps the data durable; every broker can serve any partition), and Metadata
and DescribeTopicPartitions show that one replica, which leads and is the ISR; factors 0 and -2
are refused, as Kafka refuses them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic
from kafka.errors import InvalidReplicationAssignmentError, InvalidReplicationFactorError

from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TIMEOUT = 15
ONE_REPLICA_LOG = "recorded as one replica per partition"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """A broker whose default replication factor is 3."""
    broker = BrokerProcess(
        tmp_path_factory.mktemp("replication-factor"),
        {
            "s3.data.buckets": s3_server.url(),
            "cluster.id": f"rf{time.monotonic_ns()}",
            "default.replication.factor": "3",
        },
    )
    broker.start()
    try:
        yield broker
    finally:
        assert broker.stop() == 0, broker.log_tail()


@pytest.fixture
def admin(cluster: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


@pytest.fixture
def kafka_python_admin(cluster: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=15_000)
    yield client
    client.close()


def create(admin: AdminClient, topic: NewTopic) -> None:
    admin.create_topics([topic])[topic.topic].result(TIMEOUT)


def refusal(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT)
    error = raised.value.args[0]
    assert isinstance(error, KafkaError)
    return error


def metadata_replicas(
    admin: AdminClient, topic: str
) -> list[tuple[int, int, list[int], list[int]]]:
    """Each partition as Metadata shows it: (index, leader, replicas, ISR)."""
    partitions = admin.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
    return sorted((p.id, p.leader, list(p.replicas), list(p.isrs)) for p in partitions.values())


def described_replicas(
    admin: AdminClient, topic: str
) -> list[tuple[int, int, list[int], list[int]]]:
    """Each partition as DescribeTopicPartitions shows it: (index, leader, replicas, ISR)."""
    (future,) = admin.describe_topics(TopicCollection([topic])).values()
    description = future.result(TIMEOUT)
    return sorted(
        (p.id, p.leader.id, [r.id for r in p.replicas], [r.id for r in p.isr])
        for p in description.partitions
    )


def one_replica_logs(cluster: BrokerProcess, topic: str) -> list[str]:
    return [
        line
        for line in cluster.log_path.read_text(errors="replace").splitlines()
        if f"topic {topic}: " in line and ONE_REPLICA_LOG in line
    ]


def test_confluent_replication_factor_3_gives_one_replica(
    cluster: BrokerProcess, admin: AdminClient
) -> None:
    create(admin, NewTopic("rf3", num_partitions=3, replication_factor=3))

    one_each = [(p, 0, [0], [0]) for p in range(3)]
    assert metadata_replicas(admin, "rf3") == one_each
    assert described_replicas(admin, "rf3") == one_each
    (line,) = one_replica_logs(cluster, "rf3")
    assert "INFO" in line and "replication factor 3 recorded as one replica" in line
    assert "object storage keeps the data durable" in line

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    producer.produce("rf3", b"kept once, durably", partition=2)
    assert producer.flush(TIMEOUT) == 0


def test_the_default_factor_3_gives_one_replica(cluster: BrokerProcess, admin: AdminClient) -> None:
    create(admin, NewTopic("defaulted", num_partitions=2))  # replication_factor -1

    assert metadata_replicas(admin, "defaulted") == [(0, 0, [0], [0]), (1, 0, [0], [0])]
    (line,) = one_replica_logs(cluster, "defaulted")
    assert "replication factor 3 (default.replication.factor) recorded as one" in line


def test_confluent_factor_0_is_refused(admin: AdminClient) -> None:
    # librdkafka itself refuses -2 before sending it
    (future,) = admin.create_topics([NewTopic("rf0", 1, 0)]).values()
    error = refusal(future)
    assert error.code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "Replication factor must be larger than 0, or -1 to use the default value." in (
        error.str()
    )
    assert "rf0" not in admin.list_topics(timeout=TIMEOUT).topics


def test_confluent_manual_assignments(admin: AdminClient) -> None:
    # librdkafka wants the partition count given too (it sends -1 with the assignment)
    create(admin, NewTopic("placed", 2, replica_assignment=[[0], [0]]))
    assert metadata_replicas(admin, "placed") == [(0, 0, [0], [0]), (1, 0, [0], [0])]

    (future,) = admin.create_topics(
        [NewTopic("elsewhere", 2, replica_assignment=[[0], [1]])]
    ).values()
    error = refusal(future)
    assert error.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert "includes broker 1, but no such broker is registered." in error.str()

    admin.create_partitions([NewPartitions("placed", 3, replica_assignment=[[0]])])[
        "placed"
    ].result(TIMEOUT)
    assert metadata_replicas(admin, "placed") == [(p, 0, [0], [0]) for p in range(3)]
    error = refusal(
        admin.create_partitions([NewPartitions("placed", 4, replica_assignment=[[2]])])["placed"]
    )
    assert error.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_kafka_python_replication_factor_3_gives_one_replica(
    kafka_python_admin: KafkaAdminClient,
) -> None:
    kafka_python_admin.create_topics([KafkaPythonNewTopic("kp-rf3", 2, 3)])
    kafka_python_admin.create_topics(
        [KafkaPythonNewTopic("kp-placed", replica_assignments={0: [0], 1: [0]})]
    )

    for name in ("kp-rf3", "kp-placed"):
        (topic,) = kafka_python_admin.describe_topics([name])
        assert topic["error_code"] == 0
        assert sorted(
            (p["partition_index"], p["leader_id"], p["replica_nodes"], p["isr_nodes"])
            for p in topic["partitions"]
        ) == [(0, 0, [0], [0]), (1, 0, [0], [0])]


@pytest.mark.parametrize("factor", [0, -2])
def test_kafka_python_factor_0_or_minus_2_is_refused(
    kafka_python_admin: KafkaAdminClient, factor: int
) -> None:
    with pytest.raises(InvalidReplicationFactorError):
        kafka_python_admin.create_topics([KafkaPythonNewTopic(f"kp-rf{factor}", 1, factor)])


def test_kafka_python_assignment_to_an_unknown_broker_is_refused(
    kafka_python_admin: KafkaAdminClient,
) -> None:
    with pytest.raises(InvalidReplicationAssignmentError):
        kafka_python_admin.create_topics(
            [KafkaPythonNewTopic("kp-elsewhere", replica_assignments={0: [0, 4]})]
        )
