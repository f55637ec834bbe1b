"""Client-side assignors through the classic protocol: librdkafka's range, roundrobin and
cooperative-sticky (incremental rebalances: several JoinGroup/SyncGroup rounds, partitions move
without a stop-the-world revoke) all split a topic exactly among the members, one group and
topic each on one broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.automq_py.conftest import FAST_GROUPS, module_broker
from tests.support.broker import BrokerProcess
from tests.support.seaweedfs import SeaweedFS

pytestmark = pytest.mark.integration

PARTITIONS = 6


class Member:
    """A consumer polling on its own thread; ``owned`` follows its rebalance callbacks."""

    def __init__(self, bootstrap: str, group: str, topic: str, strategy: str) -> None:
        self.owned: set[int] = set()
        self.events: list[tuple[str, list[int]]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "partition.assignment.strategy": strategy,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                "auto.offset.reset": "earliest",
            }
        )
        self.incremental = strategy == "cooperative-sticky"
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _assign(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        with self.lock:
            got = [p.partition for p in parts]
            self.events.append(("assign", got))
            if not self.incremental:
                self.owned = set()
            self.owned |= set(got)

    def _revoke(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        with self.lock:
            lost = [p.partition for p in parts]
            self.events.append(("revoke", lost))
            self.owned -= set(lost)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.2)
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def snapshot(self) -> set[int]:
        with self.lock:
            return set(self.owned)


def _settled(members: list[Member], timeout: float = 45) -> list[set[int]]:
    """Wait until the members' partitions are disjoint and cover the topic, stably for 2 s."""
    deadline = time.monotonic() + timeout
    stable_since: float | None = None
    while time.monotonic() < deadline:
        owned = [m.snapshot() for m in members]
        union = set().union(*owned)
        exact = sum(len(o) for o in owned) == PARTITIONS and union == set(range(PARTITIONS))
        if exact and all(owned):
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since >= 2:
                return owned
        else:
            stable_since = None
        time.sleep(0.1)
    raise AssertionError(f"members never split the partitions: {[m.events for m in members]}")


@pytest.fixture(scope="module")
def group_broker(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedFS
) -> Iterator[BrokerProcess]:
    """The module's broker, with groups that react fast (``FAST_GROUPS``)."""
    with module_broker(tmp_path_factory, s3_server, **FAST_GROUPS) as b:
        yield b


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_client_side_assignors_split_the_topic(group_broker: BrokerProcess, strategy: str) -> None:
    topic, group = f"assign-{strategy}", f"g-{strategy}"
    admin = AdminClient({"bootstrap.servers": group_broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result(30)
    members = [Member(group_broker.bootstrap, group, topic, strategy)]
    try:
        assert _settled(members) == [set(range(PARTITIONS))]
        members += [Member(group_broker.bootstrap, group, topic, strategy) for _ in range(2)]
        owned = _settled(members)
        assert sorted(len(o) for o in owned) == [2, 2, 2], owned
        if strategy == "cooperative-sticky":
            # incremental: the first member gave up only what moved, never everything at once
            first = members[0].events
            revoked = [p for kind, parts in first if kind == "revoke" for p in parts]
            assert len(revoked) == PARTITIONS - len(owned[0]), first
        members.pop().close()
        owned = _settled(members)
        assert sorted(len(o) for o in owned) == [3, 3], owned
    finally:
        for m in members:
            m.close()
