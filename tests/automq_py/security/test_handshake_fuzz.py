"""Fuzzing the live broker's SASL and TLS handshakes over raw sockets: nothing a client sends
before it has authenticated may crash the broker, wedge it, or authenticate.

SASL: hypothesis mutates the frames of a real exchange (SaslHandshake, then SaslAuthenticate
with PLAIN or SCRAM tokens: bit flips, truncation, random tokens, random frames, frames out of
turn, sizes above ``sasl.server.max.receive.size``). After each example the connection must
not have been let through (a Metadata request on it gets no answer), and a fresh client must
still authenticate. TLS: bytes that are not TLS, truncated ClientHellos and random records on
the SSL port; the broker then still completes a real TLS handshake.

Re-authentication (KIP-368) is here too: with ``connections.max.reauth.ms`` a session lasts
that long, the client re-authenticates on the same connection, and a request on an expired
session closes it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from tests.automq_py.conftest import module_broker
from tests.automq_py.security.conftest import (
    PLAIN_USERS,
    SecureBroker,
    authenticate,
    check_burst,
    handshake,
    produce,
)
from tests.protocol.kafka_oracle import request_frame
from tests.support.broker import BrokerProcess, free_port
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 0.3
HEALTH_TIMEOUT_S = 10.0
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def frame(message: object, correlation_id: int) -> bytes:
    body = request_frame(message, correlation_id)
    return struct.pack(">i", len(body)) + body


def exchange(mechanism: str, token: bytes) -> list[bytes]:
    return [
        frame(SaslHandshakeRequest[1](mechanism=mechanism), 1),
        frame(SaslAuthenticateRequest[2](auth_bytes=token), 2),
    ]


PLAIN_TOKEN = b"\0alice\0" + PLAIN_USERS["alice"].encode()


@st.composite
def mutated_exchange(draw: st.DrawFn) -> list[bytes]:
    mechanism = draw(st.sampled_from(["PLAIN", "SCRAM-SHA-256", "OAUTHBEARER", "GSSAPI", "x"]))
    token = draw(
        st.one_of(
            st.binary(max_size=300),
            st.just(b"\0alice\0wrong"),
            st.just(b"n,,n=alice,r=abc"),
            st.just(b"n,,\x01auth=Bearer e30.e30.\x01\x01"),
        )
    )
    frames = exchange(mechanism, token)
    how = draw(st.sampled_from(["as is", "flip", "truncate", "random", "reorder", "huge"]))
    i = draw(st.integers(0, len(frames) - 1))
    raw = bytearray(frames[i])
    if how == "flip" and len(raw) > 4:
        pos = draw(st.integers(4, len(raw) - 1))
        raw[pos] ^= 1 << draw(st.integers(0, 7))
    elif how == "truncate":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif how == "random":
        raw = bytearray(draw(st.binary(max_size=200)))
    elif how == "huge":
        # above sasl.server.max.receive.size: refused before any of it is read
        raw = bytearray(struct.pack(">i", draw(st.integers(524_289, 2**31 - 1))))
    frames[i] = bytes(raw)
    if how == "reorder":
        frames.reverse()
    return frames


def let_through(sock: socket.socket) -> bool:
    """Whether a Metadata request on ``sock`` gets an answer (it must not, unauthenticated)."""
    try:
        sock.sendall(frame(MetadataRequest[12](topics=None), 99))
        sock.settimeout(READ_TIMEOUT_S * 3)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            data += chunk
            # skip the answers to the exchange's own requests; look for correlation id 99
            pos = 0
            while len(data) - pos >= 8:
                (size,) = struct.unpack_from(">i", data, pos)
                (correlation_id,) = struct.unpack_from(">i", data, pos + 4)
                if correlation_id == 99:
                    return True
                pos += 4 + size
    except (TimeoutError, OSError):
        return False


def healthy(secure: SecureBroker) -> None:
    assert secure.broker.running, secure.broker.log_tail()
    producer = Producer(
        {
            "bootstrap.servers": secure.address("SASL_PLAINTEXT"),
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": PLAIN_USERS["alice"],
        }
    )
    metadata = producer.list_topics(timeout=HEALTH_TIMEOUT_S)
    assert metadata.brokers


@FUZZ
@given(frames=mutated_exchange())
def test_mutated_sasl_exchanges_never_authenticate_nor_crash(
    secure_broker: SecureBroker, frames: list[bytes]
) -> None:
    note(repr(frames))
    genuine = frames == exchange("PLAIN", PLAIN_TOKEN)
    with socket.create_connection(("127.0.0.1", secure_broker.ports["SASL_PLAINTEXT"]), 5) as s:
        try:
            for f in frames:
                s.sendall(f)
        except OSError:
            pass
        assert not let_through(s) or genuine
    assert secure_broker.broker.running, secure_broker.broker.log_tail()


def test_the_broker_serves_after_the_sasl_fuzzing(secure_broker: SecureBroker) -> None:
    healthy(secure_broker)


@st.composite
def not_tls(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["kafka", "random", "client hello", "record"]))
    if kind == "kafka":
        return frame(MetadataRequest[12](topics=None), 1)
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=600))
    hello = _client_hello()
    if kind == "client hello":
        return hello[: draw(st.integers(1, len(hello)))]
    # a TLS record header with a random type, version and length, then random bytes
    header = struct.pack(
        ">BHH",
        draw(st.integers(0, 255)),
        draw(st.integers(0, 0xFFFF)),
        draw(st.integers(0, 0xFFFF)),
    )
    return header + draw(st.binary(max_size=200))


def _client_hello() -> bytes:
    """The first flight of a real TLS client, as bytes."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ctx = ssl.create_default_context()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@FUZZ
@given(data=not_tls())
def test_bytes_that_are_not_tls_on_an_ssl_port(secure_broker: SecureBroker, data: bytes) -> None:
    note(repr(data))
    with socket.create_connection(("127.0.0.1", secure_broker.ports["SASL_SSL"]), 5) as s:
        try:
            s.sendall(data)
            s.settimeout(READ_TIMEOUT_S)
            answer = s.recv(100)
        except OSError:
            answer = b""
    # never a Kafka answer: a TLS alert (record type 21), a server hello (22) or nothing
    assert answer[:1] in (b"", b"\x15", b"\x16"), answer
    assert secure_broker.broker.running, secure_broker.broker.log_tail()


def test_the_broker_serves_tls_after_the_fuzzing(secure_broker: SecureBroker) -> None:
    ctx = ssl.create_default_context(cafile=str(secure_broker.certs.ca))
    with (
        socket.create_connection(("127.0.0.1", secure_broker.ports["SSL"]), 5) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(frame(MetadataRequest[12](topics=None), 5))
        tls.settimeout(HEALTH_TIMEOUT_S)
        (size,) = struct.unpack(">i", tls.recv(4))
        assert size > 0


# --- re-authentication -------------------------------------------------------------------------

REAUTH_MS = 1500
ILLEGAL_SASL_STATE = 34


@pytest.fixture(scope="module")
def reauth_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[tuple[BrokerProcess, int]]:
    sasl_port = free_port()
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_alice="{PLAIN_USERS["alice"]}";'
    )
    plaintext = free_port()
    with module_broker(
        tmp_path_factory,
        s3_server,
        **{
            "listeners": f"PLAINTEXT://127.0.0.1:{plaintext},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
            "connections.max.reauth.ms": str(REAUTH_MS),
        },
    ) as b:
        yield b, sasl_port


def test_clients_re_authenticate_on_the_same_connection(
    reauth_broker: tuple[BrokerProcess, int],
) -> None:
    _broker, port = reauth_broker
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": PLAIN_USERS["alice"],
            "acks": "all",
        }
    )
    errors: list[object] = []
    deadline = time.monotonic() + 3 * REAUTH_MS / 1000
    sent = 0
    while time.monotonic() < deadline:
        producer.produce("reauth", b"x", on_delivery=lambda e, _m: e and errors.append(e))
        producer.poll(0.1)
        sent += 1
    assert producer.flush(30) == 0 and not errors, errors
    assert sent > 20


def test_a_request_on_an_expired_session_closes_the_connection(
    reauth_broker: tuple[BrokerProcess, int],
) -> None:
    _, port = reauth_broker
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        for f in exchange("PLAIN", PLAIN_TOKEN):
            s.sendall(f)
        s.settimeout(5)
        for _ in range(2):
            (size,) = struct.unpack(">i", _read(s, 4))
            answer = _read(s, size)
        # SaslAuthenticate v2: error 0 and the session's lifetime
        (error,) = struct.unpack_from(">h", answer, 5)
        assert error == 0
        assert struct.pack(">q", REAUTH_MS) in answer
        time.sleep(REAUTH_MS / 1000 + 0.3)
        s.sendall(frame(MetadataRequest[12](topics=None), 7))
        assert s.recv(1) == b""


def test_a_burst_with_re_authentications_inside_it(
    reauth_broker: tuple[BrokerProcess, int],
) -> None:
    """Produce requests read together are handled as one append up to a re-authentication
    read among them, which is answered in its turn. A connection re-authenticates at most
    once a second (Kafka's KafkaChannel): a second SaslHandshake within it is answered
    ILLEGAL_SASL_STATE by the broker, and so is the SaslAuthenticate after it, while the
    session goes on."""
    broker, port = reauth_broker
    topic = f"burst-{uuid.uuid4().hex[:8]}"
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in client.create_topics([NewTopic(topic, 2)]).values():
        f.result(30)
    check_burst(
        f"127.0.0.1:{port}",
        [
            produce(topic, 0, 2),
            produce(topic, 1, 3),
            handshake(0),
            authenticate(0),
            produce(topic, 0, 1),
            handshake(ILLEGAL_SASL_STATE),
            authenticate(ILLEGAL_SASL_STATE),
            produce(topic, 1, 1),
        ],
    )


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out
