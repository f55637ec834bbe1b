"""The SASL exchange's states, as Kafka's SaslServerAuthenticator keeps them (pure logic: the
authenticator with the real PLAIN mechanism, requests decoded as the server decodes them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import scramp
from kafka.protocol.admin import DescribeClusterRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from automq_py.apis import KafkaApis
from automq_py.network.authenticator import SaslAuthenticator, State
from automq_py.security.sasl_mechanisms import PlainServer, SaslMechanismServer, ScramServer
from protocol import messages
from protocol.errors import ErrorCode
from protocol.messages import Request
from tests.automq_py.security.test_sasl_mechanisms import lookup_of
from tests.protocol.kafka_oracle import request_frame

SUPPORTED = KafkaApis(ctx=None).supported  # type: ignore[arg-type]  # no handler runs
USERS = {"alice": "alice-secret", "bob": "bob-secret"}
DELAY_MS = 50


def request(message: Any) -> Request:
    return messages.decode_request(request_frame(message), SUPPORTED)


def authenticator(mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256")) -> SaslAuthenticator:
    def new_server(mechanism: str) -> SaslMechanismServer:
        if mechanism == "PLAIN":
            return PlainServer(USERS)
        return ScramServer(mechanism, lookup_of(mechanism, USERS))

    return SaslAuthenticator(mechanisms, new_server, max_reauth_ms=60_000, failed_delay_ms=DELAY_MS)


def handshake(mechanism: str) -> Request:
    return request(SaslHandshakeRequest[1](mechanism=mechanism))


def plain(user: str, password: str) -> Request:
    return request(SaslAuthenticateRequest[2](auth_bytes=f"\0{user}\0{password}".encode()))


async def scram(auth: SaslAuthenticator, user: str, password: str) -> Any:
    """A SCRAM-SHA-256 exchange after its handshake: the last SaslAuthenticate response."""
    client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
    token = client.get_client_first().encode()
    first = await auth.handle(request(SaslAuthenticateRequest[2](auth_bytes=token)))
    client.set_server_first(bytes(first.response.auth_bytes).decode())
    token = client.get_client_final().encode()
    return (await auth.handle(request(SaslAuthenticateRequest[2](auth_bytes=token)))).response


async def test_another_request_during_the_exchange_gets_its_own_error_response() -> None:
    """Kafka's handleSaslToken: a request other than SaslAuthenticate once the mechanism is
    chosen (a second SaslHandshake too) is answered with its own error response,
    ILLEGAL_SASL_STATE, after the failure's delay, and the connection closes."""
    for stray in (
        request(DescribeClusterRequest[1](include_cluster_authorized_operations=False)),
        handshake("PLAIN"),
    ):
        auth = authenticator()
        assert (await auth.handle(handshake("PLAIN"))).response.error_code == ErrorCode.NONE
        assert auth.intercepts(stray)
        outcome = await auth.handle(stray)
        name = "DESCRIBE_CLUSTER" if stray.api_key != 17 else "SASL_HANDSHAKE"
        assert outcome.refusal == (
            ErrorCode.ILLEGAL_SASL_STATE,
            f"Unexpected Kafka request of type {name} during SASL authentication.",
        )
        assert (outcome.close, outcome.delay_s) == (True, DELAY_MS / 1000)
        assert auth.state is State.FAILED


async def test_an_unsupported_mechanism_is_refused_after_the_delay() -> None:
    outcome = await authenticator().handle(handshake("GSSAPI"))
    assert outcome.response.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert (outcome.close, outcome.delay_s) == (True, DELAY_MS / 1000)


async def test_re_authentication_keeps_its_mechanism_and_principal_in_kafka_s_words() -> None:
    """KIP-368 as Kafka's ReauthInfo: a re-authentication's handshake naming another enabled
    mechanism is answered, and the exchange after it closes the connection without an
    answer; a failed re-authentication says so; the principal may not change (type.name)."""
    auth = authenticator()
    await auth.handle(handshake("PLAIN"))
    assert (await auth.handle(plain("alice", "alice-secret"))).response.error_code == 0
    assert auth.authenticated and auth.intercepts(handshake("SCRAM-SHA-256"))
    switched = await auth.handle(handshake("SCRAM-SHA-256"))
    assert switched.response.error_code == ErrorCode.NONE and not switched.close
    closed = await auth.handle(plain("alice", "alice-secret"))
    assert (closed.response, closed.refusal, closed.close) == (None, None, True)
    assert closed.delay_s == DELAY_MS / 1000

    for password, user, message in (
        (
            "wrong",
            "alice",
            "Authentication failed during re-authentication due to invalid credentials with "
            "SASL mechanism SCRAM-SHA-256",
        ),
        (
            "bob-secret",
            "bob",
            "Cannot change principals during re-authentication from User.alice: User.bob",
        ),
    ):
        auth = authenticator()
        await auth.handle(handshake("SCRAM-SHA-256"))
        assert (await scram(auth, "alice", "alice-secret")).error_code == ErrorCode.NONE
        await auth.handle(handshake("SCRAM-SHA-256"))
        refused = await scram(auth, user, password)
        assert refused.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert refused.error_message == message


async def test_a_mechanism_s_own_reauthentication_interval_is_the_session_s() -> None:
    """listener.name.<l>.<mechanism>.connections.max.reauth.ms: the session of a client of
    that mechanism lasts so long, the others the broker's."""
    for mechanism, lifetime in (("PLAIN", 5_000), ("SCRAM-SHA-256", 60_000)):
        auth = SaslAuthenticator(
            ("PLAIN", "SCRAM-SHA-256"),
            lambda m: PlainServer(USERS) if m == "PLAIN" else ScramServer(m, lookup_of(m, USERS)),
            max_reauth_ms=60_000,
            failed_delay_ms=DELAY_MS,
            max_reauth_ms_by_mechanism={"PLAIN": 5_000},
        )
        await auth.handle(handshake(mechanism))
        if mechanism == "PLAIN":
            done = (await auth.handle(plain("alice", "alice-secret"))).response
        else:
            done = await scram(auth, "alice", "alice-secret")
        assert done.error_code == ErrorCode.NONE
        assert done.session_lifetime == timedelta(milliseconds=lifetime)
