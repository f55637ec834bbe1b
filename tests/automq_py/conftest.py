"""Broker fixtures: the real broker process, storing in the session's real S3 server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

MakeBroker = Callable[..., BrokerProcess]


def start_broker(data_dir: Path, s3_server: SeaweedFS, **overrides: str) -> BrokerProcess:
    """A started broker storing in the session's S3 server, with its own data directory and
    cluster id, and extra properties."""
    b = BrokerProcess(
        data_dir,
        {"s3.data.buckets": s3_server.url(), "cluster.id": f"t{time.monotonic_ns()}", **overrides},
    )
    b.start()
    return b


@contextmanager
def module_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS, **overrides: str
) -> Iterator[BrokerProcess]:
    """One broker for the tests of a module that each name their own topics and groups (a
    broker start is ~1.5 s of a test that takes less); it must stop cleanly at the end."""
    b = start_broker(tmp_path_factory.mktemp("module") / "broker", s3_server, **overrides)
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_tail()


@pytest.fixture
def make_broker(tmp_path: Path, s3_server: SeaweedFS) -> Iterator[MakeBroker]:
    """Start fresh brokers (each with its own data directory and cluster id) with extra
    properties: ``make_broker(**{"group.initial.rebalance.delay.ms": "0"})``. Every broker
    must stop cleanly at the end of the test."""
    started: list[BrokerProcess] = []

    def make(**overrides: str) -> BrokerProcess:
        b = start_broker(tmp_path / f"broker{len(started) or ''}", s3_server, **overrides)
        started.append(b)
        return b

    yield make
    for b in started:
        code = b.stop()
        assert code == 0, b.log_tail()


@pytest.fixture
def broker(make_broker: MakeBroker) -> BrokerProcess:
    """A fresh broker with the default settings."""
    return make_broker()


# groups that react fast, for tests not about the timings: new groups wait 500 ms (not 3 s) for
# more members, KIP-848 members heartbeat every second and are gone after 6 s
FAST_GROUPS = {
    "group.initial.rebalance.delay.ms": "500",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
}


@pytest.fixture
def group_broker(make_broker: MakeBroker) -> BrokerProcess:
    """A fresh broker whose groups react fast (``FAST_GROUPS``)."""
    return make_broker(**FAST_GROUPS)
