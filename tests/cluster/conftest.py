"""Cluster fixtures: several real broker processes sharing PostgreSQL metadata and S3 storage."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.broker import BrokerProcess
from tests.support.postgres import PostgresServer
from tests.support.seaweedfs import SeaweedFS

# fast enough for tests, with Kafka's ratio between the two
HEARTBEAT_MS = 1000
SESSION_MS = 6000


class Cluster:
    """Brokers ``first_node_id``.. of one cluster (0..n-1 unless told): one PostgreSQL database,
    one S3 namespace."""

    def __init__(
        self,
        root: Path,
        s3: SeaweedFS,
        metadata_url: str,
        first_node_id: int = 0,
        **overrides: str,
    ) -> None:
        self.root = root
        self.first_node_id = first_node_id
        self.common = {
            "s3.data.buckets": s3.url(),
            "cluster.id": f"c{time.monotonic_ns()}",
            "metadata.store.url": metadata_url,
            "broker.heartbeat.interval.ms": str(HEARTBEAT_MS),
            "broker.session.timeout.ms": str(SESSION_MS),
            "group.initial.rebalance.delay.ms": "200",
            **overrides,
        }
        self.brokers: list[BrokerProcess] = []

    def add(self, **overrides: str) -> BrokerProcess:
        return self.add_many(1, **overrides)[0]

    def add_many(self, count: int, **overrides: str) -> list[BrokerProcess]:
        """Start ``count`` more brokers at once (each start waits for its listener)."""
        first = self.first_node_id + len(self.brokers)
        new = [
            BrokerProcess(
                self.root / f"broker{node_id}",
                {**self.common, "node.id": str(node_id), **overrides},
            )
            for node_id in range(first, first + count)
        ]
        self.brokers += new
        with ThreadPoolExecutor(count) as pool:
            for started in [pool.submit(b.start) for b in new]:
                started.result()
        return new

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.pid is not None)

    def admin(self, broker: int = 0) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.brokers[broker].bootstrap})

    def controller(self, timeout: float = 30) -> int:
        """The elected controller's node id, once every running broker tells the same one (a
        broker that knows of no live controller tells itself)."""
        deadline = time.monotonic() + timeout
        while True:
            told = {
                int(self.admin(i).list_topics(timeout=10).controller_id)
                for i, b in enumerate(self.brokers)
                if b.pid is not None
            }
            if len(told) == 1:
                return told.pop()
            assert time.monotonic() < deadline, f"brokers tell controllers {sorted(told)}"
            time.sleep(0.2)

    def wait_for_brokers(self, count: int, via: int = 0, timeout: float = 30) -> None:
        """Until broker ``via`` lists ``count`` live brokers."""
        admin = self.admin(via)
        deadline = time.monotonic() + timeout
        while True:
            listed = admin.list_topics(timeout=5).brokers
            if len(listed) == count:
                return
            assert time.monotonic() < deadline, f"brokers listed: {sorted(listed)}"
            time.sleep(0.1)

    def leaders(self, topic: str, via: int = 0) -> dict[int, int]:
        """partition -> leader, as broker ``via`` tells it."""
        md = self.admin(via).list_topics(topic, timeout=5)
        return {p.id: p.leader for p in md.topics[topic].partitions.values()}

    def stop(self) -> list[int]:
        return [b.stop() for b in self.brokers]


ClusterFactory = Callable[..., Cluster]


@pytest.fixture
def cluster_factory(
    tmp_path: Path, s3_server: SeaweedFS, postgres_server: PostgresServer
) -> Iterator[ClusterFactory]:
    """``cluster_factory(brokers=3, first_node_id=0, **properties)``: a started cluster (none
    started with ``brokers=0``: add them); every broker must stop cleanly at the end of the
    test."""
    made: list[Cluster] = []

    def make(brokers: int = 3, first_node_id: int = 0, **overrides: str) -> Cluster:
        database = postgres_server.create_database()
        cluster = Cluster(tmp_path, s3_server, database, first_node_id, **overrides)
        made.append(cluster)
        if brokers:
            cluster.add_many(brokers)
            cluster.wait_for_brokers(brokers)
        return cluster

    yield make
    for cluster in made:
        # shown with a failing test's output only
        for i, broker in enumerate(cluster.brokers):
            print(f"--- broker {cluster.first_node_id + i} ---\n{broker.log_tail(60)}")
        codes = cluster.stop()
        assert codes == [0] * len(codes), "\n\n".join(b.log_tail() for b in cluster.brokers)
