"""Security across a cluster: two brokers, each with a PLAINTEXT inter-broker listener and a
SASL_PLAINTEXT client listener, the authorizer on. ACLs and SCRAM credentials created through
one broker are enforced and accepted by the other (both live in the shared metadata store), and
a client on the SASL listener is told the brokers' SASL addresses."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.cluster.conftest import Cluster
from tests.support.broker import free_port
from tests.support.postgres import PostgresServer
from tests.support.seaweedfs import SeaweedFS
from tests.support.tls import KEY_PASSWORD, make_certificates

pytestmark = pytest.mark.integration

TIMEOUT_S = 30
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'user_admin="admin-secret" user_alice="alice-secret";'
)


@pytest.fixture
def secure_cluster(
    tmp_path: Path, s3_server: SeaweedFS, postgres_server: PostgresServer
) -> Iterator[tuple[Cluster, list[int]]]:
    cluster = Cluster(
        tmp_path,
        s3_server,
        postgres_server.create_database(),
        **{
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,CLIENTS:SASL_PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "listener.name.clients.plain.sasl.jaas.config": JAAS,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # the inter-broker listener's clients (the other brokers) act as ANONYMOUS
            "super.users": "User:admin;User:ANONYMOUS",
        },
    )
    sasl_ports = []
    try:
        for _ in range(2):
            internal, clients = free_port(), free_port()
            sasl_ports.append(clients)
            cluster.add(listeners=f"INTERNAL://127.0.0.1:{internal},CLIENTS://127.0.0.1:{clients}")
        cluster.wait_for_brokers(2)
        yield cluster, sasl_ports
    finally:
        for node_id, broker in enumerate(cluster.brokers):
            print(f"--- broker {node_id} ---\n{broker.log_tail(60)}")
        codes = cluster.stop()
        assert codes == [0] * len(codes)


def sasl(port: int, user: str, password: str, mechanism: str = "PLAIN") -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def test_acls_and_credentials_made_through_one_broker_hold_on_the_other(
    secure_cluster: tuple[Cluster, list[int]],
) -> None:
    _, ports = secure_cluster
    admin0 = AdminClient(sasl(ports[0], "admin", "admin-secret"))
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    for f in admin0.create_topics([NewTopic(topic, 4)]).values():
        f.result(TIMEOUT_S)

    # told the brokers on its own listener: both SASL ports
    metadata = AdminClient(sasl(ports[1], "admin", "admin-secret")).list_topics(timeout=10)
    assert sorted(b.port for b in metadata.brokers.values()) == sorted(ports)

    def alice_produces(port: int) -> KafkaError | None:
        errors: list[KafkaError] = []
        producer = Producer(
            {**sasl(port, "alice", "alice-secret"), "acks": "all", "message.timeout.ms": 10_000}
        )
        producer.produce(topic, b"x", on_delivery=lambda e, _m: e and errors.append(e))
        producer.flush(15)
        return errors[0] if errors else None

    refused = alice_produces(ports[1])
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant = [
        AclBinding(
            ResourceType.TOPIC,
            "orders-",
            ResourcePatternType.PREFIXED,
            "User:alice",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in (AclOperation.WRITE, AclOperation.DESCRIBE)
    ]
    for f in admin0.create_acls(grant).values():
        f.result(TIMEOUT_S)
    deadline = time.monotonic() + 10  # broker 1 follows the metadata log
    while (error := alice_produces(ports[1])) is not None:
        assert time.monotonic() < deadline, error
        time.sleep(0.5)

    # a SCRAM user made through broker 0 logs in on broker 1
    upsert = UserScramCredentialUpsertion(
        "admin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"scram-secret"
    )
    for f in admin0.alter_user_scram_credentials([upsert]).values():
        f.result(TIMEOUT_S)
    deadline = time.monotonic() + 10
    while True:
        scram_admin = AdminClient(sasl(ports[1], "admin", "scram-secret", "SCRAM-SHA-256"))
        try:
            scram_admin.list_topics(timeout=5)
            break
        except KafkaException:
            assert time.monotonic() < deadline
            time.sleep(0.5)


def test_brokers_talk_to_each_other_over_sasl_ssl(
    tmp_path: Path, s3_server: SeaweedFS, postgres_server: PostgresServer
) -> None:
    """One SASL_SSL listener per broker, for clients and brokers alike: the transaction
    markers one broker sends the leaders on the other go over TLS, authenticated as the
    broker's own user (a super user), as Kafka's brokers do."""
    certs = make_certificates(tmp_path / "certs")
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="broker" password="broker-secret" '
        'user_broker="broker-secret" user_admin="admin-secret";'
    )
    cluster = Cluster(
        tmp_path,
        s3_server,
        postgres_server.create_database(),
        **{
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server),
            "ssl.key.password": KEY_PASSWORD,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:broker;User:admin",
        },
    )
    ports = [free_port(), free_port()]
    try:
        for port in ports:
            cluster.add(listeners=f"SASL_SSL://127.0.0.1:{port}")
        admin_conf = {
            "bootstrap.servers": ",".join(f"127.0.0.1:{p}" for p in ports),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(certs.ca),
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": "admin-secret",
        }
        admin = AdminClient(admin_conf)
        deadline = time.monotonic() + 30
        while len(admin.list_topics(timeout=10).brokers) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for f in admin.create_topics([NewTopic("ledger", 4)]).values():
            f.result(TIMEOUT_S)
        # the broker asked may learn of the topic a moment after the other one created it
        while True:
            listed = admin.list_topics("ledger", timeout=10).topics["ledger"].partitions
            if len(listed) == 4 or time.monotonic() >= deadline + TIMEOUT_S:
                break
            time.sleep(0.2)
        leaders = {p.leader for p in listed.values()}
        assert leaders == {0, 1}
        producer = Producer({**admin_conf, "transactional.id": "over-tls"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for i in range(40):
            producer.produce("ledger", value=f"v{i}".encode(), partition=i % 4)
        producer.commit_transaction(30)
        consumer = Consumer(
            {**admin_conf, "group.id": "reader", "isolation.level": "read_committed"}
        )
        consumer.assign([TopicPartition("ledger", p, 0) for p in range(4)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 40 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value() or b"")
        consumer.close()
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(40))
    finally:
        for node_id, broker in enumerate(cluster.brokers):
            print(f"--- broker {node_id} ---\n{broker.log_tail(60)}")
        codes = cluster.stop()
        assert codes == [0] * len(codes)
