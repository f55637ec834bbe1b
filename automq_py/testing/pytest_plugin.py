"""The pytest plugin (entry point ``automq_py``): Kafka-compatible brokers for a test suite.

Fixtures:

==========================  ========  ===================================================
``kafka_bootstrap``         session   ``"127.0.0.1:PORT"`` of ``automq_broker``
``automq_broker``           session   one :class:`AutoMQProcess` shared by the session
``automq_broker_factory``   function  ``factory(properties) -> AutoMQProcess``; every
                                      broker it started is stopped after the test
``automq_cluster_factory``  function  ``factory(brokers=3, properties) -> AutoMQCluster``
                                      (brokers over a private PostgreSQL); every cluster
                                      it started is stopped after the test
``automq_properties``       session   properties of every broker above (override it in a
                                      ``conftest.py`` to change them)
==========================  ========  ===================================================

Properties also come from the ini option ``automq_properties`` (one ``key=value`` a line)
and ``--automq-property key=value``; the command line wins. Each broker's directory is
removed when it stops, unless ``--automq-keep-data``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

import pytest

from automq_py.testing.cluster import AutoMQCluster
from automq_py.testing.process import AutoMQProcess

_Started = TypeVar("_Started", AutoMQProcess, AutoMQCluster)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("automq", "automq-py broker fixtures")
    group.addoption(
        "--automq-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker property for the automq-py fixtures, e.g. num.partitions=3; repeatable",
    )
    group.addoption(
        "--automq-keep-data",
        action="store_true",
        help="keep each automq-py broker's directory (data and broker.log) after it stops",
    )
    parser.addini(
        "automq_properties",
        type="linelist",
        default=[],
        help="broker properties for the automq-py fixtures, one KEY=VALUE a line",
    )


def _parse(entries: list[str], source: str) -> dict[str, str]:
    properties = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise pytest.UsageError(f"{source}: expected KEY=VALUE, got {entry!r}")
        properties[key.strip()] = value.strip()
    return properties


@pytest.fixture(scope="session")
def automq_properties(pytestconfig: pytest.Config) -> dict[str, str]:
    """Broker properties from the ini file and the command line."""
    return {
        **_parse(pytestconfig.getini("automq_properties"), "automq_properties"),
        **_parse(pytestconfig.getoption("automq_property"), "--automq-property"),
    }


class _Factory(Generic[_Started]):
    """Starts brokers or clusters in fresh directories under pytest's temporary root;
    ``stop_all`` stops every one it started, then raises if one did not exit cleanly."""

    def __init__(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        properties: Mapping[str, str],
        keep_data: bool,
    ) -> None:
        self._tmp_path_factory = tmp_path_factory
        self._properties = properties
        self._keep_data = keep_data
        self._started: list[_Started] = []

    def _start(self, started: _Started) -> _Started:
        self._started.append(started)
        started.start()
        return started

    def stop_all(self) -> None:
        failures = []
        for started in self._started:
            try:
                started.stop(check=True)
            except Exception as e:
                failures.append(e)
        self._started.clear()
        if failures:
            raise failures[0]


class AutoMQBrokerFactory(_Factory[AutoMQProcess]):
    """Starts brokers; ``brokers`` lists those still running."""

    @property
    def brokers(self) -> list[AutoMQProcess]:
        return self._started

    def __call__(self, properties: Mapping[str, str | int] | None = None) -> AutoMQProcess:
        """A started broker with ``properties`` over the session's ``automq_properties``."""
        return self._start(
            AutoMQProcess(
                {**self._properties, **(properties or {})},
                directory=self._tmp_path_factory.mktemp("automq"),
                keep_directory=self._keep_data,
            )
        )


class AutoMQClusterFactory(_Factory[AutoMQCluster]):
    """Starts clusters; ``clusters`` lists those still running."""

    @property
    def clusters(self) -> list[AutoMQCluster]:
        return self._started

    def __call__(
        self,
        brokers: int = 3,
        properties: Mapping[str, str | int] | None = None,
        **more: str | int,
    ) -> AutoMQCluster:
        """A started cluster of ``brokers`` brokers with ``properties`` (and ``more``, e.g.
        ``**{"num.partitions": 6}``) over the session's ``automq_properties``."""
        return self._start(
            AutoMQCluster(
                brokers,
                {**self._properties, **(properties or {}), **more},
                directory=self._tmp_path_factory.mktemp("automq-cluster"),
                keep_directory=self._keep_data,
            )
        )


_AnyFactory = TypeVar("_AnyFactory", AutoMQBrokerFactory, AutoMQClusterFactory)


@contextlib.contextmanager
def _stopping(factory: _AnyFactory) -> Iterator[_AnyFactory]:
    try:
        yield factory
    finally:
        factory.stop_all()


def _keep_data(pytestconfig: pytest.Config) -> bool:
    return bool(pytestconfig.getoption("automq_keep_data"))


@pytest.fixture
def automq_broker_factory(
    tmp_path_factory: pytest.TempPathFactory,
    automq_properties: dict[str, str],
    pytestconfig: pytest.Config,
) -> Iterator[AutoMQBrokerFactory]:
    """Start brokers for this test: ``automq_broker_factory({"num.partitions": 3})``."""
    keep = _keep_data(pytestconfig)
    with _stopping(AutoMQBrokerFactory(tmp_path_factory, automq_properties, keep)) as factory:
        yield factory


@pytest.fixture
def automq_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory,
    automq_properties: dict[str, str],
    pytestconfig: pytest.Config,
) -> Iterator[AutoMQClusterFactory]:
    """Start clusters for this test: ``automq_cluster_factory(brokers=3)``."""
    keep = _keep_data(pytestconfig)
    with _stopping(AutoMQClusterFactory(tmp_path_factory, automq_properties, keep)) as factory:
        yield factory


@pytest.fixture(scope="session")
def automq_broker(
    tmp_path_factory: pytest.TempPathFactory,
    automq_properties: dict[str, str],
    pytestconfig: pytest.Config,
) -> Iterator[AutoMQProcess]:
    """One broker for the whole session, started when a test first needs it."""
    keep = _keep_data(pytestconfig)
    with _stopping(AutoMQBrokerFactory(tmp_path_factory, automq_properties, keep)) as factory:
        yield factory()


@pytest.fixture(scope="session")
def kafka_bootstrap(automq_broker: AutoMQProcess) -> str:
    """``bootstrap.servers`` of the session's broker: ``"127.0.0.1:PORT"``."""
    return automq_broker.bootstrap_servers
