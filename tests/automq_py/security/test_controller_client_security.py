"""The broker's own client (``spark_jobs.controller_client``, which brokers and the maintenance
jobs talk to brokers with) over the secured listeners: TLS with the CA, a client certificate,
SASL PLAIN and SCRAM; a wrong password refused with SASL_AUTHENTICATION_FAILED."""

from __future__ import annotations

import ssl

import pytest

from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from spark_jobs.controller_client import ClientSecurity, ControllerClient, ControllerError
from tests.automq_py.security.conftest import PLAIN_USERS, SecureBroker

pytestmark = pytest.mark.integration


def tls(secure: SecureBroker, certificate: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(secure.certs.ca))
    if certificate:
        ctx.load_cert_chain(str(secure.certs.client_cert), str(secure.certs.client_key))
    return ctx


async def topics_listed(secure: SecureBroker, listener: str, security: ClientSecurity) -> int:
    client = await ControllerClient.connect(
        secure.address(listener), timeout_s=10, security=security
    )
    async with client:
        answer = await client.call(ApiKey.METADATA, 12, {"topics": None})
    return len(answer.brokers)


async def test_tls_and_sasl(secure_broker: SecureBroker, scram_users: dict[str, str]) -> None:
    user, password = next(iter(scram_users.items()))
    cases = [
        ("SSL", ClientSecurity(tls(secure_broker))),
        ("MTLS", ClientSecurity(tls(secure_broker, certificate=True))),
        ("SASL_PLAINTEXT", ClientSecurity(None, "PLAIN", "alice", PLAIN_USERS["alice"])),
        ("SASL_SSL", ClientSecurity(tls(secure_broker), "SCRAM-SHA-512", user, password)),
        ("SASL_PLAINTEXT", ClientSecurity(None, "SCRAM-SHA-256", user, password)),
    ]
    for listener, security in cases:
        assert await topics_listed(secure_broker, listener, security) == 1, (listener, security)


async def test_a_wrong_password_is_refused(secure_broker: SecureBroker) -> None:
    security = ClientSecurity(None, "PLAIN", "alice", "wrong")
    with pytest.raises(ControllerError) as info:
        await topics_listed(secure_broker, "SASL_PLAINTEXT", security)
    assert info.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "wrong" not in repr(security)
