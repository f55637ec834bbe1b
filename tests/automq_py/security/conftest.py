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

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess, free_port
from tests.support.seaweedfs import SeaweedFS
from tests.support.tls import KEY_PASSWORD, Certificates, make_certificates

PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
SCRAM_USERS = {"scram-user": "scram-secret"}
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER"


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
