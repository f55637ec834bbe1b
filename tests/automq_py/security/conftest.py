"""A broker with every kind of listener, and certificates for its TLS ones.

Listeners: PLAINTEXT (the tests' admin door), SSL (no client certificate), MTLS (SSL with
``ssl.client.auth=required``), SASL_PLAINTEXT and SASL_SSL with PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512 and OAUTHBEARER (unsecured tokens) enabled. PLAIN's users are in the listener's
JAAS config; SCRAM's are created through AlterUserScramCredentials by the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.producer import ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from protocol.records import RecordInput, build_batch
from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess, free_port
from tests.support.raw_connection import RawConnection, partition_produce_request
from tests.support.seaweedfs import SeaweedFS
from tests.support.tls import KEY_PASSWORD, Certificates, make_certificates

PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
SCRAM_USERS = {"scram-user": "scram-secret"}
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER"
PLAIN_ALICE = b"\0alice\0" + PLAIN_USERS["alice"].encode()
# one request of a burst: (request, response class, the error it must be answered with,
# partition, records)
BurstRequest = tuple[Any, Any, int, int, int]


def produce(topic: str, partition: int, count: int, error: int = 0) -> BurstRequest:
    records = bytes(build_batch([RecordInput(f"r{k}".encode()) for k in range(count)]))
    request = partition_produce_request(topic, partition, records)
    return (request, ProduceResponse, error, partition, count if error == 0 else 0)


def handshake(error: int) -> BurstRequest:
    return (SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse, error, -1, 0)


def authenticate(error: int) -> BurstRequest:
    return (SaslAuthenticateRequest[2](PLAIN_ALICE), SaslAuthenticateResponse, error, -1, 0)


def check_burst(address: str, burst: list[BurstRequest]) -> None:
    """Authenticate as alice with PLAIN on ``address``, send ``burst`` in one write (the
    broker reads it together) and check each request's answer, in order: Produce's base
    offsets count from 0 in each partition (of a new topic)."""
    with RawConnection(address) as conn:
        assert conn.call(SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse)
        answer = conn.call(SaslAuthenticateRequest[2](PLAIN_ALICE), SaslAuthenticateResponse)
        assert answer.error_code == 0, answer
        ids = conn.send_together([request for request, *_ in burst])
        offsets: dict[int, int] = {}
        for (request, response_class, error, partition, count), expected_id in zip(
            burst, ids, strict=True
        ):
            correlation_id, response = conn.receive(request, response_class)
            assert correlation_id == expected_id
            if response_class is not ProduceResponse:
                assert response.error_code == error, (request, response)
                continue
            [part] = response.responses[0].partition_responses
            assert (part.index, part.error_code) == (partition, error), (request, part)
            if error == 0:
                assert part.base_offset == offsets.get(partition, 0), part
                offsets[partition] = offsets.get(partition, 0) + count


@dataclass(frozen=True)
class SecureBroker:
    broker: BrokerProcess
    certs: Certificates
    ports: dict[str, int]

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"


def listener_properties(certs: Certificates, ports: dict[str, int]) -> dict[str, str]:
    plain_jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join(f'user_{u}="{p}"' for u, p in PLAIN_USERS.items())
        + ";"
    )
    props = {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.server),
        "ssl.key.password": KEY_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca),
        "listener.name.mtls.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": MECHANISMS,
        "connection.failed.authentication.delay.ms": "50",
    }
    for listener in ("sasl_plaintext", "sasl_ssl"):
        props[f"listener.name.{listener}.plain.sasl.jaas.config"] = plain_jaas
        props[f"listener.name.{listener}.oauthbearer.sasl.jaas.config"] = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        )
    return props


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def secure_ports() -> dict[str, int]:
    return {
        name: free_port() for name in ("PLAINTEXT", "SSL", "MTLS", "SASL_PLAINTEXT", "SASL_SSL")
    }


@pytest.fixture(scope="module")
def secure_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS, certificates: Certificates
) -> Iterator[SecureBroker]:
    ports = secure_ports()
    props = listener_properties(certificates, ports)
    with module_broker(tmp_path_factory, s3_server, **props) as b:
        yield SecureBroker(b, certificates, ports)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def scram_users(secure_broker: SecureBroker) -> dict[str, str]:
    """SCRAM credentials for both mechanisms, created as kafka-configs would: a request per
    mechanism (Kafka alters a user once per request)."""
    client = AdminClient({"bootstrap.servers": secure_broker.address("PLAINTEXT")})
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        upserts = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(mechanism, 4096), password.encode()
            )
            for user, password in SCRAM_USERS.items()
        ]
        for f in client.alter_user_scram_credentials(upserts).values():
            f.result(30)
    return SCRAM_USERS
