"""What this broker knows of the cluster: its brokers, each partition's leader, the controller.

Kafka's ``MetadataCache``. The API handlers ask it who leads a partition and which brokers to
list; the replica manager asks it whether this broker may serve a partition, at which epoch.

* :class:`SingleBrokerCache`: one broker (SQLite metadata) is the whole cluster and leads every
  partition, at its node epoch (which grows with every start, as a new leadership would).
* :class:`ClusterMetadataCache`: brokers sharing PostgreSQL metadata. Kept current by the
  metadata manager's listener from the ``broker/``, ``leaders/`` and ``controller`` entries
  (:mod:`automq_py.controller.cluster_records`), decoded once per change, not per request.
  Listeners hear which topics' leaders changed, so the broker can hand partitions over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from automq_py.controller import membership
from automq_py.controller.cluster_records import (
    BROKER_PREFIX,
    CONTROLLER_KEY,
    LEADERS_PREFIX,
    NO_LEADER,
    BrokerRegistration,
    ControllerRecord,
    TopicLeaders,
)
from storage.metadata import records as rec
from storage.metadata.manager import MetadataManager

log = logging.getLogger("automq.metadata_cache")

LeadersListener = Callable[[set[str]], None]


@dataclass(slots=True, frozen=True)
class Leadership:
    """Who leads one partition, at which leader epoch (leader ``NO_LEADER``: offline)."""

    leader: int
    epoch: int


class SingleBrokerCache:
    """One broker: it leads every partition."""

    def __init__(self, node_id: int, host: str, port: int, rack: str | None, epoch: int) -> None:
        self.node_id = node_id
        self._me = BrokerRegistration(node_id, epoch, host, port, rack)
        self._epoch = epoch
        self.generation = 0  # nothing here changes

    def live_brokers(self) -> list[BrokerRegistration]:
        return [self._me]

    def broker(self, node_id: int) -> BrokerRegistration | None:
        return self._me if node_id == self.node_id else None

    def leadership(self, topic: str, index: int) -> Leadership:
        return Leadership(self.node_id, self._epoch)

    def controller_id(self) -> int:
        return self.node_id

    def add_leaders_listener(self, listener: LeadersListener) -> None:
        return None  # leadership never changes


class ClusterMetadataCache:
    """Several brokers over one metadata log."""

    def __init__(self, node_id: int, metadata: MetadataManager) -> None:
        self.node_id = node_id
        self._metadata = metadata
        self._brokers: dict[int, BrokerRegistration] = {}
        self._leaders: dict[str, TopicLeaders] = {}
        self._controller: ControllerRecord | None = None
        self._listeners: list[LeadersListener] = []
        self._broker_listeners: list[Callable[[], None]] = []
        # grows with every change of the brokers, the leaders or the controller: what is built
        # from them (a Metadata response) is reused while it stays the same
        self.generation = 0
        self._reload()
        metadata.add_listener(self._on_records)

    # -- reads -----------------------------------------------------------------------------------

    def live_brokers(self) -> list[BrokerRegistration]:
        """Brokers clients may be sent to: registered, not fenced (a broker shutting down still
        serves until its partitions are moved)."""
        return [b for b in self._brokers.values() if not b.fenced]

    def brokers(self) -> dict[int, BrokerRegistration]:
        return dict(self._brokers)

    def broker(self, node_id: int) -> BrokerRegistration | None:
        return self._brokers.get(node_id)

    def leadership(self, topic: str, index: int) -> Leadership:
        leaders = self._leaders.get(topic)
        if leaders is None:
            return Leadership(NO_LEADER, -1)
        return Leadership(leaders.leader(index), leaders.epoch(index))

    def topic_leaders(self, topic: str) -> TopicLeaders | None:
        return self._leaders.get(topic)

    def all_leaders(self) -> dict[str, TopicLeaders]:
        return dict(self._leaders)

    def controller(self) -> ControllerRecord | None:
        return self._controller

    def controller_id(self) -> int:
        return -1 if self._controller is None else self._controller.node_id

    def led_by(self, node_id: int) -> list[tuple[str, int]]:
        """The partitions ``node_id`` leads, by topic and index."""
        return [
            (topic, index)
            for topic, leaders in sorted(self._leaders.items())
            for index, leader in enumerate(leaders.leaders)
            if leader == node_id
        ]

    def add_leaders_listener(self, listener: LeadersListener) -> None:
        """Call ``listener(topics)`` with the topics whose leaders changed (all of them after
        the image was reloaded)."""
        self._listeners.append(listener)

    def add_brokers_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when a broker registers, is fenced or starts shutting down."""
        self._broker_listeners.append(listener)

    # -- upkeep ----------------------------------------------------------------------------------

    def _reload(self) -> None:
        image = self._metadata.image
        self._brokers = membership.brokers(image)
        self._leaders = membership.all_leaders(image)
        self._controller = membership.controller(image)

    def _on_records(self, records: Sequence[rec.Record]) -> None:
        changed: set[str] = set()
        brokers_changed = not records
        controller = self._controller
        if not records:  # the image was reloaded whole
            before = set(self._leaders)
            self._reload()
            changed = before | set(self._leaders)
        for r in records:
            match r:
                case rec.KVRecord(key, value):
                    if key.startswith(LEADERS_PREFIX):
                        topic = key[len(LEADERS_PREFIX) :]
                        self._leaders[topic] = TopicLeaders.decode(value)
                        changed.add(topic)
                    elif key.startswith(BROKER_PREFIX):
                        node_id = int(key[len(BROKER_PREFIX) :])
                        self._brokers[node_id] = BrokerRegistration.decode(node_id, value)
                        brokers_changed = True
                    elif key == CONTROLLER_KEY:
                        self._controller = ControllerRecord.decode(value)
                case rec.RemoveKV(key):
                    if key.startswith(LEADERS_PREFIX):
                        topic = key[len(LEADERS_PREFIX) :]
                        self._leaders.pop(topic, None)
                        changed.add(topic)
                    elif key.startswith(BROKER_PREFIX):
                        self._brokers.pop(int(key[len(BROKER_PREFIX) :]), None)
                        brokers_changed = True
        if brokers_changed or changed or controller is not self._controller:
            self.generation += 1
        if brokers_changed:
            for wake in self._broker_listeners:
                wake()
        if changed:
            for listener in self._listeners:
                try:
                    listener(changed)
                except Exception:
                    log.exception("leadership listener failed")


MetadataCache = SingleBrokerCache | ClusterMetadataCache
