"""ElectLeaders, AlterPartitionReassignments and ListPartitionReassignments against the real
broker, through kafka-python's and confluent-kafka's admin clients and raw requests. The broker
is the whole cluster, so as a Kafka 3.9 controller answers for such partitions: no election is
ever needed (ELECTION_NOT_NEEDED, preferred or unclean), a reassignment to this broker is a
no-op, one to any other broker is INVALID_REPLICA_ASSIGNMENT, a cancellation is
NO_REASSIGNMENT_IN_PROGRESS, nothing is listed as being reassigned."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import ElectionType as ConfluentElection
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import (
    InvalidReplicationAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)
from kafka.protocol.admin import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
)

from protocol.errors import ErrorCode
from tests.automq_py.clients.test_clients import create_topic
from tests.support.broker import BrokerProcess
from tests.support.raw_connection import RawConnection
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
NOT_NEEDED = "Leader election not needed for topic partition."
PREFERRED, UNCLEAN = 0, 1


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """A broker with topics "lead" (2 partitions) and "move" (4)."""
    broker = BrokerProcess(
        tmp_path_factory.mktemp("replication"),
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"repl{time.monotonic_ns()}"},
    )
    broker.start()
    try:
        create_topic(broker.bootstrap, "lead", 2)
        create_topic(broker.bootstrap, "move", 4)
        yield broker
    finally:
        assert broker.stop() == 0, broker.log_tail()


@pytest.fixture
def admin(cluster: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=TIMEOUT_MS)
    yield client
    client.close()


def call(bootstrap: str, request: Any, response_class: Any) -> Any:
    conn = RawConnection(bootstrap)
    try:
        return conn.call(request, response_class)
    finally:
        conn.close()


def node_id(broker: BrokerProcess) -> int:
    """The broker's id (it is also the controller)."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT_MS)
    try:
        return int(admin.describe_cluster()["controller_id"])
    finally:
        admin.close()


def election_results(response: Any) -> dict[tuple[str, int], tuple[int, str | None]]:
    return {
        (r.topic, p.partition_id): (p.error_code, p.error_message)
        for r in response.replica_election_results
        for p in r.partition_result
    }


@pytest.mark.parametrize("election_type", [PREFERRED, UNCLEAN])
def test_no_election_is_ever_needed(admin: KafkaAdminClient, election_type: int) -> None:
    response = admin.elect_leaders(
        election_type, {"lead": [0, 1, 5], "missing": [0]}, raise_errors=False
    )
    assert response.API_VERSION == 2
    assert response.error_code == ErrorCode.NONE
    assert election_results(response) == {
        ("lead", 0): (ErrorCode.ELECTION_NOT_NEEDED, NOT_NEEDED),
        ("lead", 1): (ErrorCode.ELECTION_NOT_NEEDED, NOT_NEEDED),
        ("lead", 5): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such partition as lead-5"),
        ("missing", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such topic as missing"),
    }
    # the client takes "not needed" as done
    admin.elect_leaders(election_type, {"lead": [0, 1]})


def test_confluent_elect_leaders(cluster: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    asked = [ConfluentPartition("lead", 0), ConfluentPartition("lead", 1)]
    for election in (ConfluentElection.PREFERRED, ConfluentElection.UNCLEAN):
        result = admin.elect_leaders(election, asked).result(TIMEOUT_MS / 1000)
        assert sorted((tp.topic, tp.partition) for tp in result) == [("lead", 0), ("lead", 1)]
        for error in result.values():
            assert error is not None
            assert error.code() == KafkaError.ELECTION_NOT_NEEDED
    # every partition: only those that needed an election are listed, so none
    assert admin.elect_leaders(ConfluentElection.PREFERRED, None).result(TIMEOUT_MS / 1000) == {}


@pytest.mark.parametrize("version", [0, 1, 2])
def test_an_election_for_every_partition_lists_none(cluster: BrokerProcess, version: int) -> None:
    request = ElectLeadersRequest[version](
        election_type=PREFERRED, topic_partitions=None, timeout_ms=TIMEOUT_MS
    )
    response = call(cluster.bootstrap, request, ElectLeadersResponse)
    topics = {r.topic: r.partition_result for r in response.replica_election_results}
    # each topic comes back, with no partition (none needed an election)
    assert {"lead", "move"} <= set(topics)
    assert all(results == [] for results in topics.values())


def test_an_unknown_election_type_fails_the_request(cluster: BrokerProcess) -> None:
    t = ElectLeadersRequest.TopicPartitions
    request = ElectLeadersRequest[1](
        election_type=5, topic_partitions=[t(topic="lead", partitions=[0])], timeout_ms=TIMEOUT_MS
    )
    response = call(cluster.bootstrap, request, ElectLeadersResponse)
    assert response.error_code == ErrorCode.INVALID_REQUEST
    assert election_results(response) == {
        ("lead", 0): (ErrorCode.INVALID_REQUEST, "Unknown election type 5")
    }


def test_reassignments_other_than_this_broker_fail(admin: KafkaAdminClient) -> None:
    node = admin.describe_cluster()["controller_id"]  # the only broker
    results = admin.alter_partition_reassignments(
        {
            TopicPartition("move", 0): [node],  # where it is: nothing to do
            TopicPartition("move", 1): [node + 1],
            TopicPartition("move", 2): [node, node + 1],
            TopicPartition("move", 3): None,  # cancel: nothing in progress
            TopicPartition("move", 9): [node],
            TopicPartition("missing", 0): [node],
        }
    )
    assert results == {
        TopicPartition("move", 0): None,
        TopicPartition("move", 1): InvalidReplicationAssignmentError,
        TopicPartition("move", 2): InvalidReplicationAssignmentError,
        TopicPartition("move", 3): NoReassignmentInProgressError,
        TopicPartition("move", 9): UnknownTopicOrPartitionError,
        TopicPartition("missing", 0): UnknownTopicOrPartitionError,
    }
    assert admin.list_partition_reassignments() == {}
    assert admin.list_partition_reassignments({"move": [0, 1], "missing": [0]}) == {}


def test_reassignment_messages_are_kafkas(cluster: BrokerProcess) -> None:
    t = AlterPartitionReassignmentsRequest.ReassignableTopic
    p = t.ReassignablePartition
    node = node_id(cluster)
    request = AlterPartitionReassignmentsRequest[0](
        timeout_ms=TIMEOUT_MS,
        topics=[
            t(
                name="move",
                partitions=[
                    p(partition_index=0, replicas=[]),
                    p(partition_index=1, replicas=[node, node]),
                    p(partition_index=2, replicas=[node + 7, node]),
                    p(partition_index=3, replicas=None),
                    p(partition_index=8, replicas=[node]),
                ],
            ),
            t(name="missing", partitions=[p(partition_index=0, replicas=[node])]),
        ],
    )
    response = call(cluster.bootstrap, request, AlterPartitionReassignmentsResponse)
    assert (response.error_code, response.error_message) == (ErrorCode.NONE, None)
    got = {
        (r.name, q.partition_index): (q.error_code, q.error_message)
        for r in response.responses
        for q in r.partitions
    }
    prefix = "The manual partition assignment includes"
    assert got == {
        ("move", 0): (ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{prefix} an empty replica list."),
        ("move", 1): (
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{prefix} the broker {node} more than once.",
        ),
        ("move", 2): (
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{prefix} broker {node + 7}, but no such broker is registered.",
        ),
        ("move", 3): (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None),
        ("move", 8): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition move:8."),
        ("missing", 0): (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "Unable to find a topic named missing.",
        ),
    }
