"""OAUTHBEARER with signed tokens: librdkafka's OIDC client (``sasl.oauthbearer.method=oidc``)
gets an RS256 token from a token endpoint, and the broker checks it against the keys at
``sasl.oauthbearer.jwks.endpoint.url``, its issuer and its audience. A token signed by a key
the JWKS does not hold is refused. The identity provider is a small HTTP server in the test."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from confluent_kafka import KafkaError, Producer
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess, free_port
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

ISSUER = "https://idp.test"
AUDIENCE = "automq-py"


class IdentityProvider:
    """``/jwks``: the trusted key; ``/token``: a token for the client id signed with it;
    ``/rogue-token``: one signed with a key nobody trusts."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rogue = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                jwk = json.loads(RSAAlgorithm.to_jwk(provider.key.public_key()))
                self._send({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                key = provider.rogue if self.path == "/rogue-token" else provider.key
                now = int(time.time())
                claims = {
                    "sub": "svc-orders",
                    "iss": ISSUER,
                    "aud": AUDIENCE,
                    "iat": now,
                    "exp": now + 3600,
                    "scope": "kafka",
                }
                token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})
                self._send({"access_token": token, "token_type": "bearer", "expires_in": 3600})

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture(scope="module")
def idp() -> Iterator[IdentityProvider]:
    provider = IdentityProvider()
    try:
        yield provider
    finally:
        provider.close()


@pytest.fixture(scope="module")
def oauth_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS, idp: IdentityProvider
) -> Iterator[tuple[BrokerProcess, int]]:
    plaintext, sasl = free_port(), free_port()
    with module_broker(
        tmp_path_factory,
        s3_server,
        **{
            "listeners": f"PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl}",
            "sasl.enabled.mechanisms": "OAUTHBEARER",
            "sasl.oauthbearer.jwks.endpoint.url": f"{idp.url}/jwks",
            "sasl.oauthbearer.expected.issuer": ISSUER,
            "sasl.oauthbearer.expected.audience": AUDIENCE,
        },
    ) as b:
        yield b, sasl


def produce(port: int, token_url: str) -> KafkaError | None:
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "orders-service",
            "sasl.oauthbearer.client.secret": "s3cret",
            "sasl.oauthbearer.token.endpoint.url": token_url,
            "error_cb": errors.append,
            "message.timeout.ms": 8000,
            "acks": "all",
        }
    )
    delivered: list[KafkaError | None] = []
    producer.produce(
        f"oauth-{uuid.uuid4().hex[:6]}", b"x", on_delivery=lambda e, _m: delivered.append(e)
    )
    producer.flush(12)
    if delivered and delivered[0] is None:
        return None
    return errors[0] if errors else (delivered[0] if delivered else None)


def test_a_token_signed_by_the_jwks_key_is_accepted(
    oauth_broker: tuple[BrokerProcess, int], idp: IdentityProvider
) -> None:
    _, port = oauth_broker
    assert produce(port, f"{idp.url}/token") is None


def test_a_token_signed_by_another_key_is_refused(
    oauth_broker: tuple[BrokerProcess, int], idp: IdentityProvider
) -> None:
    _, port = oauth_broker
    error = produce(port, f"{idp.url}/rogue-token")
    assert error is not None and error.code() == KafkaError._AUTHENTICATION, error
