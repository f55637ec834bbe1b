"""The metrics port under bad input: random bytes, truncated and oversized requests, unknown
paths and methods. Each gets an HTTP error or a closed connection, and the port (and the
broker) go on serving."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.automq_py.conftest import module_broker
from tests.support.broker import BrokerProcess, free_port
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    with module_broker(tmp_path_factory, s3_server, **{"metrics.port": str(METRICS_PORT)}) as b:
        yield b


def send(data: bytes) -> bytes:
    """What the port answers ``data`` with, until it closes or 2 s pass."""
    with socket.create_connection(("127.0.0.1", METRICS_PORT), timeout=2) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


def serving() -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/readyz", timeout=5) as r:
        return r.status == 200


requests = st.one_of(
    st.binary(max_size=2048),
    st.sampled_from(
        [
            b"GET /metrics",  # truncated: no version, no end of headers
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nabc",
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",  # past http.server's line limit
            b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",  # past its header limit
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
            b"GET /nowhere HTTP/1.0\r\n\r\n",
        ]
    ),
    st.builds(lambda path: b"GET " + path + b" HTTP/1.0\r\n\r\n", st.binary(max_size=200)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=requests)
def test_bad_requests_get_an_error_or_a_closed_connection(
    broker: BrokerProcess, data: bytes
) -> None:
    answer = send(data)
    if answer.startswith(b"HTTP/"):
        status = answer.split(b"\r\n", 1)[0]
        # only a request that names a real path with GET may succeed
        if b" 200 " in status:
            assert data.startswith(b"GET /")
    elif answer:
        # no status line: http.server's bare error page for what it could not parse, or
        # HTTP/0.9's answer to a GET with no version
        assert b"Error code: 400" in answer or data.startswith(b"GET"), answer[:200]
    assert serving()


def test_a_good_scrape_after_the_bad_ones(broker: BrokerProcess) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as r:
        assert r.status == 200
        assert b"kafka_network_requestmetrics_requests_total" in r.read()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/nowhere", timeout=5)
    assert refused.value.code == 404
