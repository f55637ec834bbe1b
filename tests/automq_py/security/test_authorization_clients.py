"""Kafka's ACLs enforced on real clients: a broker with ``StandardAuthorizer``, the super user
``admin`` and the user ``alice`` (SASL/PLAIN), and confluent-kafka, kafka-python and Kafka's own
``kafka-acls`` tool as the clients.

Without ACLs alice is refused everywhere, each API family with Kafka's error code as the client
reports it; admin may do everything. ACLs that admin grants (prefixed, literal, DENY over ALLOW)
take effect at once. The tests share one broker, each with topics, groups and transactional ids
of its own.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaConsumer, OffsetAndMetadata
from kafka import TopicPartition as KafkaPythonPartition
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KafkaPythonResourceType
from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from kafka.protocol.admin import (
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    UpdateFeaturesRequest,
    UpdateFeaturesResponse,
)
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer import ProduceResponse, WriteTxnMarkersRequest, WriteTxnMarkersResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol import extensions
from protocol.api_keys import ApiKey
from protocol.records import RecordInput, build_batch
from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess, free_port
from tests.support.java import run_tool
from tests.support.raw_connection import RawConnection, fetch_request, partition_produce_request
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

USERS = {"admin": "admin-secret", "alice": "alice-secret"}
TIMEOUT_S = 20


@dataclass(frozen=True)
class AclBroker:
    broker: BrokerProcess
    sasl_port: int
    # one admin client per user for the module (a future outlives no client of its own)
    admins: dict[str, AdminClient] = field(default_factory=dict)

    @property
    def sasl_address(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"


@pytest.fixture(scope="module")
def acl_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[AclBroker]:
    plaintext, sasl = free_port(), free_port()
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
        + ";"
    )
    props = {
        "listeners": f"PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "group.initial.rebalance.delay.ms": "0",
    }
    with module_broker(tmp_path_factory, s3_server, **props) as b:
        yield AclBroker(b, sasl)


@pytest.fixture(autouse=True)
def no_acls(acl_broker: AclBroker) -> Iterator[None]:
    """Each test starts with no ACLs: those it granted are gone after it."""
    yield
    everything = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    for f in admin(acl_broker).delete_acls([everything]).values():
        f.result(TIMEOUT_S)


def conf(b: AclBroker, user: str, **extra: Any) -> dict[str, Any]:
    """librdkafka settings of ``user`` on the SASL listener."""
    return {
        "bootstrap.servers": b.sasl_address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": USERS[user],
        **extra,
    }


def kafka_python(b: AclBroker, user: str) -> dict[str, Any]:
    """kafka-python settings of ``user`` on the SASL listener."""
    return {
        "bootstrap_servers": b.sasl_address,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": user,
        "sasl_plain_password": USERS[user],
    }


def admin(b: AclBroker, user: str = "admin") -> AdminClient:
    client = b.admins.get(user)
    if client is None:
        client = b.admins[user] = AdminClient(conf(b, user))
    return client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(b: AclBroker, name: str | None = None, partitions: int = 1) -> str:
    topic = name or unique("authz")
    for f in admin(b).create_topics([NewTopic(topic, partitions)]).values():
        f.result(TIMEOUT_S)
    return topic


def produce(b: AclBroker, user: str, topic: str, n: int = 3, **extra: Any) -> list[KafkaError]:
    """Produce ``n`` records as ``user``: the delivery errors (none when all were written)."""
    producer = Producer(conf(b, user, **{"message.timeout.ms": 5000, **extra}))
    errors: list[KafkaError] = []
    for i in range(n):
        producer.produce(topic, f"v{i}".encode(), on_delivery=lambda e, _m: e and errors.append(e))
    producer.flush(TIMEOUT_S)
    return errors


def grant(
    b: AclBroker,
    resource: ResourceType,
    name: str,
    *operations: AclOperation,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> None:
    """admin gives (or, with DENY, refuses) alice ``operations`` on the resource."""
    bindings = [
        AclBinding(resource, name, pattern, "User:alice", "*", op, permission) for op in operations
    ]
    for f in admin(b).create_acls(bindings).values():
        f.result(TIMEOUT_S)


def error_of(future: Any) -> int:
    """The Kafka error code a confluent-kafka admin future failed with."""
    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT_S)
    return int(raised.value.args[0].code())


def consume(
    b: AclBroker, user: str, topic: str, n: int, group: str, protocol: str = "classic"
) -> list[Any]:
    """Subscribe as ``user`` in ``group`` and read ``n`` records; raises on a consumer error."""
    settings = {"group.id": group, "group.protocol": protocol, "auto.offset.reset": "earliest"}
    consumer = Consumer(conf(b, user, **settings))
    consumer.subscribe([topic])
    got: list[Any] = []
    try:
        for _ in range(60):
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                raise KafkaException(m.error())
            got.append(m.value())
            if len(got) == n:
                break
    finally:
        consumer.close()
    return got


@contextmanager
def raw_session(b: AclBroker, user: str) -> Iterator[RawConnection]:
    """A connection authenticated as ``user`` (SASL/PLAIN), for requests sent by hand."""
    conn = RawConnection(b.sasl_address)
    try:
        assert conn.call(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse)
        token = f"\0{user}\0{USERS[user]}".encode()
        answer = conn.call(SaslAuthenticateRequest[2](auth_bytes=token), SaslAuthenticateResponse)
        assert answer.error_code == 0, answer
        yield conn
    finally:
        conn.close()


def fetch_error(b: AclBroker, user: str, topic: str, replica_id: int = -1) -> int:
    """The error of partition 0 of ``topic`` in a Fetch sent as ``user`` (by hand: a client
    reaches no Fetch of a topic whose Metadata it was refused)."""
    request = fetch_request(topic, {0: 0}, max_wait_ms=0)
    if replica_id >= 0:
        request.replica_id = replica_id
    with raw_session(b, user) as conn:
        response = conn.call(request, FetchResponse)
    return int(response.responses[0].partitions[0].error_code)


# -- alice, no ACLs ------------------------------------------------------------------------------


def test_alice_cannot_produce(acl_broker: AclBroker) -> None:
    topic = create_topic(acl_broker)
    errors = produce(acl_broker, "alice", topic)
    assert errors and {e.code() for e in errors} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}
    # seeing the topic (DESCRIBE) is not writing it: now the Produce itself is refused
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    errors = produce(acl_broker, "alice", topic)
    assert errors and {e.code() for e in errors} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}
    # an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic:
    # librdkafka's InitProducerId is refused, a fatal error
    producer = Producer(conf(acl_broker, "alice", **{"enable.idempotence": True}))
    with pytest.raises(KafkaException) as raised:
        for _ in range(50):
            producer.produce(topic, b"v")
            producer.flush(0.2)
    assert raised.value.args[0].fatal()
    assert raised.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_a_transactional_id_is_checked_for_transactional_records_only(
    acl_broker: AclBroker,
) -> None:
    """As Kafka's handleProduceRequest: WRITE on the transactional id is asked only of a
    Produce that holds transactional records; an acks=0 one refused has its connection closed
    (there is no answer to refuse it with)."""
    topic = create_topic(acl_broker)
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.WRITE)

    def sent(transactional: bool, acks: int = -1) -> Any:
        batch = build_batch(
            [RecordInput(b"v", None, [], 1_700_000_000_000)],
            producer_id=7 if transactional else -1,
            producer_epoch=0 if transactional else -1,
            base_sequence=0 if transactional else -1,
            is_transactional=transactional,
        )
        return partition_produce_request(topic, 0, batch, acks=acks, transactional_id="x")

    with raw_session(acl_broker, "alice") as conn:
        answer = conn.call(sent(transactional=False), ProduceResponse)
        assert answer.responses[0].partition_responses[0].error_code == KafkaError.NO_ERROR
        answer = conn.call(sent(transactional=True), ProduceResponse)
        refused = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert answer.responses[0].partition_responses[0].error_code == refused
        conn.send(conn.frame(sent(transactional=True, acks=0))[1])
        conn.sock.settimeout(10)
        assert conn.sock.recv(1) == b""  # closed


def test_alice_cannot_fetch(acl_broker: AclBroker) -> None:
    topic = create_topic(acl_broker)
    assert produce(acl_broker, "admin", topic) == []
    assert fetch_error(acl_broker, "alice", topic) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # a follower's fetch needs CLUSTER_ACTION, which only admin has
    assert fetch_error(acl_broker, "alice", topic, 0) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert fetch_error(acl_broker, "admin", topic, 0) == KafkaError.NO_ERROR
    # seeing the topic (DESCRIBE) is not reading it: a consumer finds the leader and is refused
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    consumer = KafkaConsumer(
        group_id=None, enable_auto_commit=False, **kafka_python(acl_broker, "alice")
    )
    partition = KafkaPythonPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            for _ in range(20):
                consumer.poll(timeout_ms=500)
    finally:
        consumer.close()


def test_alice_describes_nothing(acl_broker: AclBroker) -> None:
    topic = create_topic(acl_broker)
    alice = admin(acl_broker, "alice")
    assert alice.list_topics(timeout=TIMEOUT_S).topics == {}
    named = alice.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
    assert named.error is not None
    assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    (described,) = alice.describe_configs([ConfigResource("topic", topic)]).values()
    assert error_of(described) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    (broker,) = alice.describe_configs([ConfigResource("broker", "0")]).values()
    assert error_of(broker) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    described_cluster = alice.describe_cluster(include_authorized_operations=True).result(TIMEOUT_S)
    assert not described_cluster.authorized_operations  # no DESCRIBE on the cluster
    # groups: none listed, each refused
    group = unique("g")
    offsets = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 1)])]
    admin(acl_broker).alter_consumer_group_offsets(offsets)[group].result(TIMEOUT_S)
    listed = admin(acl_broker).list_consumer_groups().result(TIMEOUT_S).valid
    assert group in {g.group_id for g in listed}
    assert alice.list_consumer_groups().result(TIMEOUT_S).valid == []
    (described_group,) = alice.describe_consumer_groups([group]).values()
    assert error_of(described_group) == KafkaError.GROUP_AUTHORIZATION_FAILED
    (fetched,) = alice.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
    ).values()
    assert error_of(fetched) == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_alice_cannot_commit_offsets(acl_broker: AclBroker) -> None:
    topic, group = create_topic(acl_broker), unique("g")
    offsets = {KafkaPythonPartition(topic, 0): OffsetAndMetadata(1, "", -1)}
    consumer = KafkaConsumer(
        group_id=group, enable_auto_commit=False, **kafka_python(acl_broker, "alice")
    )
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            consumer.commit(offsets)
        # the group, but not the topic
        grant(acl_broker, ResourceType.GROUP, group, AclOperation.READ)
        with pytest.raises(TopicAuthorizationFailedError):
            consumer.commit(offsets)
    finally:
        consumer.close()
    assert (
        admin(acl_broker)
        .list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
        )[group]
        .result(TIMEOUT_S)
        .topic_partitions[0]
        .offset
        == OFFSET_INVALID
    )


def test_alice_cannot_begin_transactions(acl_broker: AclBroker) -> None:
    producer = Producer(conf(acl_broker, "alice", **{"transactional.id": unique("txn")}))
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(TIMEOUT_S)
    assert raised.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_alice_writes_no_topic_in_her_transaction(acl_broker: AclBroker) -> None:
    topic, txn_id = create_topic(acl_broker), unique("txn")
    grant(acl_broker, ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE)
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    producer = Producer(conf(acl_broker, "alice", **{"transactional.id": txn_id}))
    producer.init_transactions(TIMEOUT_S)  # her transactional id is hers to use
    producer.begin_transaction()
    producer.produce(topic, b"v")
    with pytest.raises(KafkaException) as raised:  # AddPartitionsToTxn is refused
        producer.commit_transaction(TIMEOUT_S)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert raised.value.args[0].txn_requires_abort()


def test_alice_deletes_nothing(acl_broker: AclBroker) -> None:
    topic, group = create_topic(acl_broker), unique("g")
    assert produce(acl_broker, "admin", topic) == []
    assert consume(acl_broker, "admin", topic, 3, group)  # the group exists, with offsets
    alice = admin(acl_broker, "alice")
    assert error_of(alice.delete_topics([topic])[topic]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # seeing the topic (librdkafka looks its leader up first) is not deleting from it
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)
    assert error_of(alice.delete_topics([topic])[topic]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    (records,) = alice.delete_records([TopicPartition(topic, 0, 1)]).values()
    assert error_of(records) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    (groups,) = alice.delete_consumer_groups([group]).values()
    assert error_of(groups) == KafkaError.GROUP_AUTHORIZATION_FAILED
    (created,) = alice.create_topics([NewTopic(unique("new"), 1)]).values()
    assert error_of(created) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # nothing happened
    assert topic in admin(acl_broker).list_topics(timeout=TIMEOUT_S).topics


def test_alice_is_refused_the_brokers_own_apis(acl_broker: AclBroker) -> None:
    """By hand (no client library sends them all): the cluster's admin and inter-broker APIs
    need the cluster's ALTER, DESCRIBE or CLUSTER_ACTION, the others the topic's or the
    transactional id's, each refused with Kafka's error where Kafka puts it."""
    topic = create_topic(acl_broker)
    refused_cluster = KafkaError.CLUSTER_AUTHORIZATION_FAILED
    refused_topic = KafkaError.TOPIC_AUTHORIZATION_FAILED
    with raw_session(acl_broker, "alice") as conn:
        dirs = conn.call(DescribeLogDirsRequest[4](topics=None), DescribeLogDirsResponse)
        assert (dirs.error_code, dirs.results) == (refused_cluster, [])
        d = AlterReplicaLogDirsRequest.AlterReplicaLogDir
        move = d(path="/any", topics=[d.AlterReplicaLogDirTopic(name=topic, partitions=[0])])
        moved = conn.call(AlterReplicaLogDirsRequest[2](dirs=[move]), AlterReplicaLogDirsResponse)
        assert moved.results[0].partitions[0].error_code == refused_cluster
        election = ElectLeadersRequest[2](
            election_type=0,
            topic_partitions=[ElectLeadersRequest.TopicPartitions(topic=topic, partitions=[0])],
            timeout_ms=5000,
        )
        elected = conn.call(election, ElectLeadersResponse)
        assert elected.error_code == refused_cluster
        assert elected.replica_election_results[0].partition_result[0].error_code == (
            refused_cluster
        )
        listed = conn.call(
            ListPartitionReassignmentsRequest[0](timeout_ms=5000, topics=None),
            ListPartitionReassignmentsResponse,
        )
        assert listed.error_code == refused_cluster
        f = UpdateFeaturesRequest.FeatureUpdateKey
        update = UpdateFeaturesRequest[1](
            timeout_ms=5000,
            feature_updates=[f(feature="group.version", max_version_level=1, upgrade_type=1)],
            validate_only=False,
        )
        updated = conn.call(update, UpdateFeaturesResponse)
        assert (updated.error_code, updated.results) == (refused_cluster, [])
        markers = abort_marker(topic)
        written = conn.call(markers, WriteTxnMarkersResponse)
        assert written.markers[0].topics[0].partitions[0].error_code == refused_cluster
        described = conn.call(
            DescribeTopicPartitionsRequest[0](
                topics=[DescribeTopicPartitionsRequest.TopicRequest(name=topic)],
                response_partition_limit=100,
                cursor=None,
            ),
            DescribeTopicPartitionsResponse,
        )
        assert [(d.name, d.error_code) for d in described.topics] == [(topic, refused_topic)]
        producers = conn.call(
            DescribeProducersRequest[0](
                topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])]
            ),
            DescribeProducersResponse,
        )
        assert producers.topics[0].partitions[0].error_code == refused_topic
        txns = conn.call(
            DescribeTransactionsRequest[0](transactional_ids=["someone-elses"]),
            DescribeTransactionsResponse,
        )
        refused_txn = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        [refused] = txns.transaction_states
        assert refused.error_code == refused_txn
        # the rest at the schema's zeros, as Kafka leaves them
        assert (refused.producer_id, refused.producer_epoch) == (0, 0)
        assert refused.transaction_start_time_ms == 0
        # an AutoMQ controller extension (what maintenance jobs send)
        conn.send(extensions.encode_request(ApiKey.GET_KVS, 0, 99, {"get_key_requests": []}))
        (size,) = struct.unpack(">i", conn.sock.recv(4, socket.MSG_WAITALL))
        frame = conn.sock.recv(size, socket.MSG_WAITALL)
        _, body = extensions.decode_response(ApiKey.GET_KVS, 0, frame)
        assert body["error_code"] == refused_cluster


def abort_marker(topic: str) -> Any:
    """WriteTxnMarkers: an abort marker of producer 1 in partition 0 of ``topic``."""
    t = WriteTxnMarkersRequest.WritableTxnMarker
    return WriteTxnMarkersRequest[1](
        markers=[
            t(
                producer_id=1,
                producer_epoch=0,
                transaction_result=False,
                topics=[t.WritableTxnMarkerTopic(name=topic, partition_indexes=[0])],
                coordinator_epoch=0,
            )
        ]
    )


def test_writing_txn_markers_takes_the_clusters_alter_too(acl_broker: AclBroker) -> None:
    """KIP-1037: an operator's ``kafka-transactions.sh abort`` (WriteTxnMarkers) needs ALTER
    or CLUSTER_ACTION on the cluster, not only the brokers' CLUSTER_ACTION."""
    topic = create_topic(acl_broker)
    markers = abort_marker(topic)

    def written() -> int:
        with raw_session(acl_broker, "alice") as conn:
            answer = conn.call(markers, WriteTxnMarkersResponse)
        return int(answer.markers[0].topics[0].partitions[0].error_code)

    assert written() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    grant(acl_broker, ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER)
    assert written() != KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_the_metadata_quorum_takes_the_clusters_describe(acl_broker: AclBroker) -> None:
    """DescribeQuorum (kafka-metadata-quorum) needs DESCRIBE on the cluster, as Kafka's
    KafkaApis authorizes it; refused, the answer is the error alone."""
    t = DescribeQuorumRequest.TopicData

    def asking(index: int) -> Any:
        partitions = [t.PartitionData(partition_index=index)]
        return DescribeQuorumRequest[2](
            topics=[t(topic_name="__cluster_metadata", partitions=partitions)]
        )

    request = asking(0)

    def described() -> Any:
        with raw_session(acl_broker, "alice") as conn:
            return conn.call(request, DescribeQuorumResponse)

    refused = described()
    assert (refused.error_code, refused.topics) == (KafkaError.CLUSTER_AUTHORIZATION_FAILED, [])
    grant(acl_broker, ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)
    answer = described()
    assert answer.error_code == 0
    (partition,) = answer.topics[0].partitions
    assert (partition.error_code, partition.leader_id) == (0, 0)
    assert [v.replica_id for v in partition.current_voters] == [0]
    # the metadata log has one partition
    with raw_session(acl_broker, "alice") as conn:
        other = conn.call(asking(1), DescribeQuorumResponse)
    assert other.topics[0].partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_broker_log_levels_need_the_clusters_configs_acls(acl_broker: AclBroker) -> None:
    """The broker logger resource is the cluster's: DESCRIBE_CONFIGS to see the levels,
    ALTER_CONFIGS to change one, refused with Kafka's error and message."""
    described = DescribeConfigsRequest[4](
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=8, resource_name="0", configuration_keys=["root"]
            )
        ],
        include_synonyms=False,
        include_documentation=False,
    )
    a = IncrementalAlterConfigsRequest.AlterConfigsResource
    altered = IncrementalAlterConfigsRequest[1](
        resources=[
            a(
                resource_type=8,
                resource_name="0",
                configs=[a.AlterableConfig(name="root", config_operation=0, value="INFO")],
            )
        ],
        validate_only=True,
    )
    refused = (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    with raw_session(acl_broker, "alice") as conn:
        (d,) = conn.call(described, DescribeConfigsResponse).results
        assert (d.error_code, d.error_message, d.configs) == (*refused, [])
        (r,) = conn.call(altered, IncrementalAlterConfigsResponse).responses
        assert (r.error_code, r.error_message) == refused
    with raw_session(acl_broker, "admin") as conn:
        (d,) = conn.call(described, DescribeConfigsResponse).results
        assert (d.error_code, [c.name for c in d.configs]) == (0, ["root"])
        (r,) = conn.call(altered, IncrementalAlterConfigsResponse).responses
        assert r.error_code == 0


# -- admin, the super user -----------------------------------------------------------------------


def test_admin_may_do_everything(acl_broker: AclBroker) -> None:
    topic, group = create_topic(acl_broker, partitions=2), unique("g")
    root = admin(acl_broker)
    assert topic in root.list_topics(timeout=TIMEOUT_S).topics
    assert produce(acl_broker, "admin", topic, 4, **{"enable.idempotence": True}) == []
    assert len(consume(acl_broker, "admin", topic, 4, group)) == 4
    (described,) = root.describe_configs([ConfigResource("topic", topic)]).values()
    assert described.result(TIMEOUT_S)["cleanup.policy"].value == "delete"
    producer = Producer(conf(acl_broker, "admin", **{"transactional.id": unique("txn")}))
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"in-txn", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    # partition 0: the transaction's record and its marker are there whichever partition the
    # sticky partitioner gave the four records above
    (records,) = root.delete_records([TopicPartition(topic, 0, 1)]).values()
    assert records.result(TIMEOUT_S).low_watermark == 1
    root.delete_consumer_groups([group])[group].result(TIMEOUT_S)
    root.delete_topics([topic])[topic].result(TIMEOUT_S)


# -- ACLs granted --------------------------------------------------------------------------------


def test_prefixed_read_lets_alice_read_orders_but_not_payments(acl_broker: AclBroker) -> None:
    orders, payments, group = (
        create_topic(acl_broker, "orders-1"),
        create_topic(acl_broker, "payments"),
        unique("alice-g"),
    )
    assert produce(acl_broker, "admin", orders) == []
    assert produce(acl_broker, "admin", payments) == []
    for operation in (AclOperation.READ, AclOperation.DESCRIBE):
        grant(
            acl_broker,
            ResourceType.TOPIC,
            "orders-",
            operation,
            pattern=ResourcePatternType.PREFIXED,
        )
    grant(acl_broker, ResourceType.GROUP, group, AclOperation.READ)
    assert sorted(consume(acl_broker, "alice", orders, 3, group)) == [b"v0", b"v1", b"v2"]
    with pytest.raises(KafkaException) as raised:
        consume(acl_broker, "alice", payments, 3, group)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # alice sees the topics she may DESCRIBE, and only those
    assert set(admin(acl_broker, "alice").list_topics(timeout=TIMEOUT_S).topics) == {orders}


def test_consumer_protocol_group_read_and_topic_describe(acl_broker: AclBroker) -> None:
    """KIP-848: a member needs READ on the group and DESCRIBE on the topics it subscribes to."""
    topic, group = create_topic(acl_broker), unique("g848")
    assert produce(acl_broker, "admin", topic) == []
    with pytest.raises(KafkaException) as raised:
        consume(acl_broker, "alice", topic, 3, group, protocol="consumer")
    assert raised.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    grant(acl_broker, ResourceType.GROUP, group, AclOperation.READ)
    with pytest.raises(KafkaException) as raised:
        consume(acl_broker, "alice", topic, 3, group, protocol="consumer")
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.READ)
    assert len(consume(acl_broker, "alice", topic, 3, group, protocol="consumer")) == 3


def test_deny_beats_allow(acl_broker: AclBroker) -> None:
    topic = create_topic(acl_broker, unique("denied"))
    grant(acl_broker, ResourceType.TOPIC, topic, AclOperation.WRITE, AclOperation.DESCRIBE)
    assert produce(acl_broker, "alice", topic) == []
    grant(
        acl_broker,
        ResourceType.TOPIC,
        "denied-",
        AclOperation.WRITE,
        pattern=ResourcePatternType.PREFIXED,
        permission=AclPermissionType.DENY,
    )
    errors = produce(acl_broker, "alice", topic)
    assert errors and {e.code() for e in errors} == {KafkaError.TOPIC_AUTHORIZATION_FAILED}


# -- the ACL APIs through other clients ----------------------------------------------------------


def test_kafka_python_acl_round_trip(acl_broker: AclBroker) -> None:
    client = KafkaAdminClient(
        bootstrap_servers=acl_broker.sasl_address,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="admin",
        sasl_plain_password=USERS["admin"],
    )
    name = unique("kp")
    acl = ACL(
        principal="User:alice",
        host="*",
        operation=ACLOperation.READ,
        permission_type=ACLPermissionType.ALLOW,
        resource_pattern=ResourcePattern(
            KafkaPythonResourceType.TOPIC, name, ACLResourcePatternType.PREFIXED
        ),
    )
    wanted = ACLFilter(
        principal="User:alice",
        host="*",
        operation=ACLOperation.ANY,
        permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(
            KafkaPythonResourceType.TOPIC, name, ACLResourcePatternType.ANY
        ),
    )
    try:
        created = client.create_acls([acl])
        assert created["failed"] == [] and len(created["succeeded"]) == 1
        found, error = client.describe_acls(wanted)
        assert error.errno == 0 and [(a.principal, a.operation) for a in found] == [
            ("User:alice", ACLOperation.READ)
        ]
        ((_, deleted, error),) = client.delete_acls([wanted])
        assert error.errno == 0 and len(deleted) == 1
        assert client.describe_acls(wanted)[0] == []
    finally:
        client.close()


def test_kafka_acls_tool(acl_broker: AclBroker, tmp_path: Path) -> None:
    command_config = tmp_path / "admin.properties"
    command_config.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="admin" password="{USERS["admin"]}";\n'
    )
    common = (
        "--bootstrap-server",
        acl_broker.sasl_address,
        "--command-config",
        str(command_config),
    )
    topic_args = ("--topic", "tool-", "--resource-pattern-type", "prefixed")
    run_tool(
        "kafka-acls",
        *common,
        "--add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        *topic_args,
    )
    listed = run_tool("kafka-acls", *common, "--list", *topic_args).stdout
    assert "name=tool-, patternType=PREFIXED" in listed
    assert "principal=User:alice, host=*, operation=READ, permissionType=ALLOW" in listed
    run_tool("kafka-acls", *common, "--remove", "--force", *topic_args)
    found = admin(acl_broker).describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            "tool-",
            ResourcePatternType.PREFIXED,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    )
    assert found.result(TIMEOUT_S) == []
