"""Real clients authenticating to the real broker: TLS (with and without client certificates)
and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER) over plaintext and TLS, with
confluent-kafka (librdkafka), kafka-python, aiokafka and kcat; wrong credentials and
untrusted certificates refused with Kafka's errors."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import struct
import subprocess
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from tests.automq_py.security.conftest import (
    PLAIN_USERS,
    SCRAM_USERS,
    SecureBroker,
    authenticate,
    check_burst,
    handshake,
    produce,
)
from tests.protocol.kafka_oracle import request_frame
from tests.support.raw_connection import RawConnection
from tests.support.tls import Certificates

pytestmark = pytest.mark.integration

TIMEOUT_S = 30
UNKNOWN_TOPIC_OR_PARTITION, ILLEGAL_SASL_STATE = 3, 34


def admin(secure: SecureBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": secure.address("PLAINTEXT")})


def create_topic(secure: SecureBroker, partitions: int = 2) -> str:
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    client = admin(secure)  # (kept: futures fail once their client is collected)
    for f in client.create_topics([NewTopic(topic, partitions)]).values():
        f.result(TIMEOUT_S)
    return topic


def librdkafka_config(
    secure: SecureBroker, listener: str, mechanism: str | None, user: str, password: str
) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": secure.address(listener)}
    protocol = {"MTLS": "SSL"}.get(listener, listener)
    conf["security.protocol"] = protocol
    if "SSL" in protocol:
        conf["ssl.ca.location"] = str(secure.certs.ca)
    if listener == "MTLS":
        conf["ssl.certificate.location"] = str(secure.certs.client_cert)
        conf["ssl.key.location"] = str(secure.certs.client_key)
    if mechanism == "OAUTHBEARER":
        conf.update(
            {
                "sasl.mechanism": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": f"principal={user}",
            }
        )
    elif mechanism is not None:
        conf.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
    return conf


def round_trip(conf: dict[str, Any], topic: str, n: int = 20) -> None:
    """Produce ``n`` records and read them back with the same security settings."""
    producer = Producer({**conf, "acks": "all"})
    errors: list[Any] = []
    for i in range(n):
        producer.produce(
            topic, f"v{i}".encode(), on_delivery=lambda err, _m: err and errors.append(err)
        )
    assert producer.flush(TIMEOUT_S) == 0 and not errors, errors
    # assigned, not subscribed: no group join (seconds of rebalance delay) per case
    consumer = Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    got = []
    try:
        for _ in range(200):
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
            if len(got) == n:
                break
    finally:
        consumer.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(n))


CASES = [
    ("SSL", None),
    ("MTLS", None),
    *(
        (listener, mechanism)
        for listener in ("SASL_PLAINTEXT", "SASL_SSL")
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    ),
]


@pytest.mark.parametrize(("listener", "mechanism"), CASES, ids=lambda x: str(x))
def test_confluent_kafka_round_trip(
    secure_broker: SecureBroker, scram_users: dict[str, str], listener: str, mechanism: str | None
) -> None:
    user, password = ("alice", PLAIN_USERS["alice"])
    if mechanism is not None and mechanism.startswith("SCRAM"):
        user, password = next(iter(scram_users.items()))
    topic = create_topic(secure_broker)
    round_trip(librdkafka_config(secure_broker, listener, mechanism, user, password), topic)


def _failed_authentication(conf: dict[str, Any]) -> KafkaError:
    """The error a producer's first request meets with ``conf``."""
    seen: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": seen.append, "message.timeout.ms": 5000})
    producer.produce("anything", b"x")
    deadline = time.monotonic() + 8
    while not seen and time.monotonic() < deadline:
        producer.poll(0.1)
    producer.purge()
    assert seen, "no error reported"
    return seen[0]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user", ["alice", "scram-user", "nobody"])
def test_a_wrong_password_is_refused_alike_for_every_user(
    secure_broker: SecureBroker, scram_users: dict[str, str], mechanism: str, user: str
) -> None:
    conf = librdkafka_config(secure_broker, "SASL_PLAINTEXT", mechanism, user, "wrong")
    error = _failed_authentication(conf)
    assert error.code() == KafkaError._AUTHENTICATION, error
    # never a hint whether the user exists: the same message for all three users
    assert "Invalid username or password" in error.str() or "invalid credentials" in error.str()


def test_a_wrong_password_gets_kafkas_error_and_a_closed_connection(
    secure_broker: SecureBroker,
) -> None:
    """Raw: SaslHandshake, then SaslAuthenticate with bad PLAIN credentials: the response
    says SASL_AUTHENTICATION_FAILED (58) and the broker closes the connection."""
    conn = RawConnection(secure_broker.address("SASL_PLAINTEXT"))
    try:
        handshake = conn.call(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse)
        assert handshake.error_code == 0
        assert "SCRAM-SHA-256" in handshake.mechanisms
        answer = conn.call(
            SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0wrong"), SaslAuthenticateResponse
        )
        assert answer.error_code == 58
        assert "Invalid username or password" in answer.error_message
        assert conn.sock.recv(1) == b""  # closed
    finally:
        conn.close()


def test_a_burst_with_a_sasl_handshake_on_a_session_that_does_not_expire(
    secure_broker: SecureBroker,
) -> None:
    """Over SASL, Produce requests read together are handled as one append, each answered
    in order. Without ``connections.max.reauth.ms`` a PLAIN session does not expire, so a
    SaslHandshake among them is no re-authentication (KIP-368): as in Kafka, the broker
    answers it, and the SaslAuthenticate after it, ILLEGAL_SASL_STATE and serves on."""
    topic = create_topic(secure_broker)
    check_burst(
        secure_broker.address("SASL_PLAINTEXT"),
        [
            produce(topic, 0, 2),
            produce(topic, 1, 3),
            produce("no-such-topic", 0, 1, UNKNOWN_TOPIC_OR_PARTITION),
            handshake(ILLEGAL_SASL_STATE),
            authenticate(ILLEGAL_SASL_STATE),
            produce(topic, 0, 1),
            produce(topic, 1, 1),
        ],
    )


def test_a_request_before_authentication_closes_the_connection(
    secure_broker: SecureBroker,
) -> None:
    conn = RawConnection(secure_broker.address("SASL_PLAINTEXT"))
    try:
        _, frame = conn.frame(MetadataRequest[12](topics=None))
        conn.send(frame)
        assert conn.sock.recv(1) == b""
    finally:
        conn.close()


def test_a_stray_request_during_the_exchange_gets_illegal_sasl_state_and_a_close(
    secure_broker: SecureBroker,
) -> None:
    """Kafka's SaslServerAuthenticator: once the mechanism is chosen, a request other than
    SaslAuthenticate is answered with its own error response, ILLEGAL_SASL_STATE, and the
    connection closes."""
    with RawConnection(secure_broker.address("SASL_PLAINTEXT")) as conn:
        chosen = conn.call(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse)
        assert chosen.error_code == 0
        stray = conn.call(
            DescribeClusterRequest[1](include_cluster_authorized_operations=False),
            DescribeClusterResponse,
        )
        assert (stray.error_code, stray.error_message) == (
            ILLEGAL_SASL_STATE,
            "Unexpected Kafka request of type DESCRIBE_CLUSTER during SASL authentication.",
        )
        assert conn.sock.recv(1) == b""


def test_an_untrusted_client_certificate_is_refused(secure_broker: SecureBroker) -> None:
    certs: Certificates = secure_broker.certs
    conf = librdkafka_config(secure_broker, "MTLS", None, "", "")
    conf["ssl.certificate.location"] = str(certs.rogue_cert)
    conf["ssl.key.location"] = str(certs.rogue_key)
    error = _failed_authentication(conf)
    assert error.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
    # and with the standard library: the handshake fails
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    ctx.load_cert_chain(str(certs.rogue_cert), str(certs.rogue_key))
    with socket.create_connection(("127.0.0.1", secure_broker.ports["MTLS"]), TIMEOUT_S) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"\0\0\0\0")
                data = tls.recv(1)  # TLS 1.3 reports the refused certificate at the first read
        except (ssl.SSLError, ConnectionError):
            data = b""
    assert data == b""


def test_a_client_without_a_certificate_is_refused_where_one_is_required(
    secure_broker: SecureBroker,
) -> None:
    conf = librdkafka_config(secure_broker, "SSL", None, "", "")
    conf["bootstrap.servers"] = secure_broker.address("MTLS")
    error = _failed_authentication(conf)
    assert error.code() in (KafkaError._SSL, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)


def test_a_plaintext_client_on_a_tls_port_is_refused_and_the_broker_serves_on(
    secure_broker: SecureBroker,
) -> None:
    with socket.create_connection(("127.0.0.1", secure_broker.ports["SSL"]), TIMEOUT_S) as s:
        s.sendall(b"\0\0\0\x10" + b"\0\x12\0\x03" + b"\0" * 12)  # an ApiVersions, not TLS
        s.settimeout(TIMEOUT_S)
        try:
            data = s.recv(100)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"\0\0\0")  # no Kafka response: a TLS alert or nothing
    topic = create_topic(secure_broker)
    round_trip(librdkafka_config(secure_broker, "SSL", None, "", ""), topic, 3)


def test_kafka_python_over_sasl_and_ssl(
    secure_broker: SecureBroker, scram_users: dict[str, str]
) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = create_topic(secure_broker, 1)
    user, password = next(iter(scram_users.items()))
    settings: list[dict[str, Any]] = [
        {
            "bootstrap_servers": secure_broker.address("SASL_PLAINTEXT"),
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": user,
            "sasl_plain_password": password,
        },
        {
            "bootstrap_servers": secure_broker.address("SASL_SSL"),
            "security_protocol": "SASL_SSL",
            "ssl_cafile": str(secure_broker.certs.ca),
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "alice",
            "sasl_plain_password": PLAIN_USERS["alice"],
        },
        {
            "bootstrap_servers": secure_broker.address("MTLS"),
            "security_protocol": "SSL",
            "ssl_cafile": str(secure_broker.certs.ca),
            "ssl_certfile": str(secure_broker.certs.client_cert),
            "ssl_keyfile": str(secure_broker.certs.client_key),
        },
    ]
    for i, conf in enumerate(settings):
        producer = KafkaProducer(acks="all", **conf)
        producer.send(topic, f"kp-{i}".encode()).get(TIMEOUT_S)
        producer.close()
    for conf in settings:
        consumer = KafkaConsumer(
            topic, auto_offset_reset="earliest", consumer_timeout_ms=10_000, **conf
        )
        got = []
        for m in consumer:  # (stops at the third record, or after 10 s without one)
            got.append(m.value)
            if len(got) == 3:
                break
        got.sort()
        consumer.close()
        assert got == [b"kp-0", b"kp-1", b"kp-2"]


async def test_aiokafka_over_sasl_ssl(
    secure_broker: SecureBroker, scram_users: dict[str, str]
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    topic = create_topic(secure_broker, 1)
    user, password = next(iter(scram_users.items()))
    conf = {
        "bootstrap_servers": secure_broker.address("SASL_SSL"),
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(secure_broker.certs.ca)),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }
    producer = AIOKafkaProducer(acks="all", **conf)
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"aio-{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **conf)
    await consumer.start()
    try:
        batches = await consumer.getmany(timeout_ms=10_000, max_records=5)
        got = [m.value for records in batches.values() for m in records]
    finally:
        await consumer.stop()
    assert got == [f"aio-{i}".encode() for i in range(5)]


def test_kcat_over_sasl_ssl_with_scram(
    secure_broker: SecureBroker, scram_users: dict[str, str]
) -> None:
    topic = create_topic(secure_broker, 1)
    user, password = next(iter(scram_users.items()))
    common = [
        "-b",
        secure_broker.address("SASL_SSL"),
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        f"ssl.ca.location={secure_broker.certs.ca}",
        "-X",
        "sasl.mechanisms=SCRAM-SHA-256",
        "-X",
        f"sasl.username={user}",
        "-X",
        f"sasl.password={password}",
        "-t",
        topic,
    ]
    produced = subprocess.run(
        ["kcat", "-P", *common], input=b"one\ntwo\n", capture_output=True, timeout=TIMEOUT_S
    )
    assert produced.returncode == 0, produced.stderr.decode()
    out = subprocess.run(
        ["kcat", "-C", "-e", "-o", "beginning", *common],
        capture_output=True,
        check=True,
        timeout=TIMEOUT_S,
    )
    assert out.stdout.decode().split() == ["one", "two"]
    bad = subprocess.run(
        ["kcat", "-L", *common[:-2], "-X", "sasl.password=wrong"],
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    assert bad.returncode != 0
    assert b"Authentication failed" in bad.stderr or b"SASL authentication error" in bad.stderr


def test_describe_user_scram_credentials(
    secure_broker: SecureBroker, scram_users: dict[str, str]
) -> None:
    client = admin(secure_broker)
    described = client.describe_user_scram_credentials(list(scram_users))
    for user, future in described.items():
        infos = future.result(TIMEOUT_S).scram_credential_infos
        assert sorted((i.mechanism, i.iterations) for i in infos) == [
            (ScramMechanism.SCRAM_SHA_256, 4096),
            (ScramMechanism.SCRAM_SHA_512, 4096),
        ], user
    missing = client.describe_user_scram_credentials(["nobody"])["nobody"]
    with pytest.raises(KafkaException) as info:
        missing.result(TIMEOUT_S)
    assert info.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    assert "Attempt to describe a user credential that does not exist: nobody" in str(
        info.value.args[0].str()
    )
    # no user named, by null or by the empty list the Java AdminClient sends: every user
    with RawConnection(secure_broker.address("PLAINTEXT")) as conn:
        for users in (None, []):
            answer = conn.call(
                DescribeUserScramCredentialsRequest[0](users=users),
                DescribeUserScramCredentialsResponse,
            )
            assert answer.error_code == 0
            assert {r.user for r in answer.results} >= set(scram_users), users


def test_secrets_are_sensitive_and_never_logged(secure_broker: SecureBroker) -> None:
    from confluent_kafka.admin import ConfigResource, ResourceType

    client = admin(secure_broker)
    resource = ConfigResource(ResourceType.BROKER, "0")
    configs = client.describe_configs([resource])[resource].result(TIMEOUT_S)
    for name in (
        "ssl.key.password",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config",
        "listener.name.sasl_ssl.plain.sasl.jaas.config",
    ):
        assert configs[name].is_sensitive, name
        assert configs[name].value is None, name
    assert not configs["ssl.keystore.location"].is_sensitive
    log = secure_broker.broker.log_path.read_text()
    for password in [*PLAIN_USERS.values(), *SCRAM_USERS.values(), "key-secret"]:
        assert password not in log


def _unsecured_token(subject: str, expires_s: float) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'exp': expires_s})}."


def test_an_oauthbearer_session_ends_with_its_token(secure_broker: SecureBroker) -> None:
    """As Kafka's SaslServerAuthenticator: without connections.max.reauth.ms an OAUTHBEARER
    session lasts as long as its token, which SaslAuthenticate tells the client (it
    re-authenticates before); a request after the token expired closes the connection."""
    token = _unsecured_token("alice", time.time() + 2.0)
    with RawConnection(secure_broker.address("SASL_PLAINTEXT")) as conn:
        handshake = conn.call(
            SaslHandshakeRequest[1](mechanism="OAUTHBEARER"), SaslHandshakeResponse
        )
        assert handshake.error_code == 0
        answer = conn.call(
            SaslAuthenticateRequest[2](auth_bytes=f"n,,\x01auth=Bearer {token}\x01\x01".encode()),
            SaslAuthenticateResponse,
        )
        assert answer.error_code == 0
        assert 0 < answer.session_lifetime_ms <= 2000
        time.sleep(answer.session_lifetime_ms / 1000 + 0.3)
        body = request_frame(MetadataRequest[12](topics=None), 9)
        try:
            conn.sock.sendall(struct.pack(">i", len(body)) + body)
            answered = conn.sock.recv(1)
        except ConnectionResetError:
            answered = b""
        assert answered == b""  # closed


def test_a_user_is_altered_once_a_request(secure_broker: SecureBroker) -> None:
    """As Kafka's ScramControlManager: two alterations of one user in one request, even of
    two mechanisms (``kafka-configs --add-config 'SCRAM-SHA-256=[..],SCRAM-SHA-512=[..]'``),
    are DUPLICATE_RESOURCE and neither is made."""
    user = f"twice-{uuid.uuid4().hex[:6]}"
    upserts = [
        UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), b"secret")
        for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
    ]
    client = admin(secure_broker)
    (future,) = client.alter_user_scram_credentials(upserts).values()
    with pytest.raises(KafkaException) as info:
        future.result(TIMEOUT_S)
    assert info.value.args[0].code() == KafkaError.DUPLICATE_RESOURCE
    (missing,) = client.describe_user_scram_credentials([user]).values()
    with pytest.raises(KafkaException):
        missing.result(TIMEOUT_S)
