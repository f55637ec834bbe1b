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

from collections.abc import Iterator, Mapping

import pytest

from automq_py.testing.cluster import AutoMQCluster
from automq_py.testing.process import AutoMQProcess


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


class AutoMQBrokerFactory:
    """Starts brokers in fresh directories under pytest's temporary root; ``stop_all`` stops
    them, then raises if one did not exit cleanly."""

    def __init__(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        properties: Mapping[str, str],
        keep_data: bool,
    ) -> None:
        self._tmp_path_factory = tmp_path_factory
        self._properties = properties
        self._keep_data = keep_data
        self.brokers: list[AutoMQProcess] = []

    def __call__(self, properties: Mapping[str, str | int] | None = None) -> AutoMQProcess:
        """A started broker with ``properties`` over the session's ``automq_properties``."""
        broker = AutoMQProcess(
            {**self._properties, **(properties or {})},
            directory=self._tmp_path_factory.mktemp("automq"),
            keep_directory=self._keep_data,
        )
        self.brokers.append(broker)
        broker.start()
        return broker

    def stop_all(self) -> None:
        failures = []
        for broker in self.brokers:
            try:
                broker.stop(check=True)
            except Exception as e:
                failures.append(e)
        self.brokers.clear()
        if failures:
            raise failures[0]


@pytest.fixture
def automq_broker_factory(
    tmp_path_factory: pytest.TempPathFactory,
    automq_properties: dict[str, str],
    pytestconfig: pytest.Config,
) -> Iterator[AutoMQBrokerFactory]:
    """Start brokers for this test: ``automq_broker_factory({"num.partitions": 3})``."""
    factory = AutoMQBrokerFactory(
        tmp_path_factory, automq_properties, pytestconfig.getoption("automq_keep_data")
    )
    try:
        yield factory
    finally:
        factory.stop_all()


class AutoMQClusterFactory:
    """Starts clusters in fresh directories under pytest's temporary root; ``stop_all`` stops
    them, then raises if a broker did not exit cleanly."""

    def __init__(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        properties: Mapping[str, str],
        keep_data: bool,
    ) -> None:
        self._tmp_path_factory = tmp_path_factory
        self._properties = properties
        self._keep_data = keep_data
        self.clusters: list[AutoMQCluster] = []

    def __call__(
        self,
        brokers: int = 3,
        properties: Mapping[str, str | int] | None = None,
        **more: str | int,
    ) -> AutoMQCluster:
        """A started cluster of ``brokers`` brokers with ``properties`` (and ``more``, e.g.
        ``**{"num.partitions": 6}``) over the session's ``automq_properties``."""
        cluster = AutoMQCluster(
            brokers,
            {**self._properties, **(properties or {}), **more},
            directory=self._tmp_path_factory.mktemp("automq-cluster"),
            keep_directory=self._keep_data,
        )
        self.clusters.append(cluster)
        cluster.start()
        return cluster

    def stop_all(self) -> None:
        failures = []
        for cluster in self.clusters:
            try:
                cluster.stop(check=True)
            except Exception as e:
                failures.append(e)
        self.clusters.clear()
        if failures:
            raise failures[0]


@pytest.fixture
def automq_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory,
    automq_properties: dict[str, str],
    pytestconfig: pytest.Config,
) -> Iterator[AutoMQClusterFactory]:
    """Start clusters for this test: ``automq_cluster_factory(brokers=3)``."""
    factory = AutoMQClusterFactory(
        tmp_path_factory, automq_properties, pytestconfig.getoption("automq_keep_data")
    )
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def automq_broker(
    tmp_path_factory: pytest.TempPathFactory,
    automq_properties: dict[str, str],
    pytestconfig: pytest.Config,
) -> Iterator[AutoMQProcess]:
    """One broker for the whole session, started when a test first needs it."""
    factory = AutoMQBrokerFactory(
        tmp_path_factory, automq_properties, pytestconfig.getoption("automq_keep_data")
    )
    try:
        yield factory()
    finally:
        factory.stop_all()


@pytest.fixture(scope="session")
def kafka_bootstrap(automq_broker: AutoMQProcess) -> str:
    """``bootstrap.servers`` of the session's broker: ``"127.0.0.1:PORT"``."""
    return automq_broker.bootstrap_servers
