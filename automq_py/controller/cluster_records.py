"""The cluster's state in the metadata KV: broker registrations, partition leaders, the controller.

Every broker replays the same metadata log, so these entries are what each broker knows of the
cluster; they change only through the metadata manager (checked, persisted, applied), like
topics (``topic/<name>``). Values are JSON, small and readable in a database dump.

=========================  ========================================================================
key                        value
=========================  ========================================================================
``broker/<node id>``       :class:`BrokerRegistration`: the incarnation (the node epoch its last
                           start registered), listener host/port, rack, fenced, shutting down
``leaders/<topic>``        :class:`TopicLeaders`: per partition, its leader's node id (-1: none,
                           offline) and leader epoch (bumped at every change of leader)
``controller``             :class:`ControllerRecord`: the broker acting as controller and the
                           lease epoch it holds; a new controller writes it first, so a former
                           one's changes, checked against the caught-up image, are refused
=========================  ========================================================================

A single broker (SQLite metadata) writes none of these: it is the cluster, and it leads every
partition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

BROKER_PREFIX = "broker/"
LEADERS_PREFIX = "leaders/"
CONTROLLER_KEY = "controller"
NO_LEADER = -1


def broker_key(node_id: int) -> str:
    return f"{BROKER_PREFIX}{node_id}"


def leaders_key(topic: str) -> str:
    return f"{LEADERS_PREFIX}{topic}"


@dataclass(slots=True, frozen=True)
class BrokerRegistration:
    """A broker as it registered: where clients reach it, and whether it may lead partitions."""

    node_id: int
    incarnation: int
    host: str
    port: int
    rack: str | None = None
    fenced: bool = False
    shutting_down: bool = False
    # (listener, host, port) of each advertised listener; ``host``/``port`` are the one other
    # brokers connect to. Empty in registrations from before listeners were told apart.
    endpoints: tuple[tuple[str, str, int], ...] = ()

    @property
    def live(self) -> bool:
        """Whether partitions may be placed on it."""
        return not self.fenced and not self.shutting_down

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Where clients of ``listener`` reach this broker (None: it has no such listener)."""
        if not self.endpoints or not listener:
            return self.host, self.port
        for name, host, port in self.endpoints:
            if name == listener:
                return host, port
        return None

    def encode(self) -> bytes:
        return _json(
            {
                "incarnation": self.incarnation,
                "host": self.host,
                "port": self.port,
                "rack": self.rack,
                "fenced": self.fenced,
                "shutting_down": self.shutting_down,
                "endpoints": [list(e) for e in self.endpoints],
            }
        )

    @classmethod
    def decode(cls, node_id: int, raw: bytes) -> BrokerRegistration:
        d = json.loads(raw)
        return cls(
            node_id,
            int(d["incarnation"]),
            str(d["host"]),
            int(d["port"]),
            d.get("rack"),
            bool(d.get("fenced", False)),
            bool(d.get("shutting_down", False)),
            tuple((str(n), str(h), int(p)) for n, h, p in d.get("endpoints", ())),
        )


@dataclass(slots=True, frozen=True)
class TopicLeaders:
    """Each partition's leader and leader epoch, in partition order, and the broker a pending
    reassignment moves it to (``targets``, NO_LEADER for none; empty when none is pending)."""

    leaders: tuple[int, ...]
    epochs: tuple[int, ...]
    targets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.leaders) != len(self.epochs):
            raise ValueError("one leader epoch per partition")
        if self.targets and len(self.targets) != len(self.leaders):
            raise ValueError("one reassignment target per partition")

    def leader(self, index: int) -> int:
        return self.leaders[index] if 0 <= index < len(self.leaders) else NO_LEADER

    def epoch(self, index: int) -> int:
        return self.epochs[index] if 0 <= index < len(self.epochs) else -1

    def target(self, index: int) -> int:
        """Where a pending reassignment moves the partition, NO_LEADER if none is pending."""
        return self.targets[index] if 0 <= index < len(self.targets) else NO_LEADER

    def pending(self) -> dict[int, int]:
        """index -> target of the partitions with a reassignment pending."""
        return {i: t for i, t in enumerate(self.targets) if t != NO_LEADER}

    def moved(self, changes: Mapping[int, int]) -> TopicLeaders:
        """These partitions (index -> new leader) led elsewhere, each with its epoch bumped; a
        reassignment whose target they reach is done."""
        leaders = list(self.leaders)
        epochs = list(self.epochs)
        targets = list(self.targets)
        for index, node in changes.items():
            if leaders[index] != node:
                leaders[index] = node
                epochs[index] += 1
            if targets and targets[index] == node:
                targets[index] = NO_LEADER
        return replace(self, leaders=tuple(leaders), epochs=tuple(epochs), targets=_packed(targets))

    def retargeted(self, changes: Mapping[int, int]) -> TopicLeaders:
        """Reassignments of these partitions (index -> target, NO_LEADER to cancel) pending."""
        targets = list(self.targets) or [NO_LEADER] * len(self.leaders)
        for index, node in changes.items():
            targets[index] = NO_LEADER if node == self.leaders[index] else node
        return replace(self, targets=_packed(targets))

    def grown(self, new_leaders: Sequence[int]) -> TopicLeaders:
        """Partitions added at the end (CreatePartitions), at leader epoch 0."""
        return TopicLeaders(
            (*self.leaders, *new_leaders),
            (*self.epochs, *(0 for _ in new_leaders)),
            (*self.targets, *(NO_LEADER for _ in new_leaders)) if self.targets else (),
        )

    @classmethod
    def new(cls, leaders: Sequence[int]) -> TopicLeaders:
        return cls(tuple(leaders), tuple(0 for _ in leaders))

    def encode(self) -> bytes:
        fields: dict[str, object] = {"leaders": list(self.leaders), "epochs": list(self.epochs)}
        if self.targets:
            fields["targets"] = list(self.targets)
        return _json(fields)

    @classmethod
    def decode(cls, raw: bytes) -> TopicLeaders:
        d = json.loads(raw)
        return cls(
            tuple(int(x) for x in d["leaders"]),
            tuple(int(x) for x in d["epochs"]),
            tuple(int(x) for x in d.get("targets", ())),
        )


def _packed(targets: Sequence[int]) -> tuple[int, ...]:
    """No targets at all when none is pending (the record stays as it was before any)."""
    return tuple(targets) if any(t != NO_LEADER for t in targets) else ()


@dataclass(slots=True, frozen=True)
class ControllerRecord:
    """Which broker is the controller, under which lease epoch."""

    node_id: int
    epoch: int

    def encode(self) -> bytes:
        return _json({"node": self.node_id, "epoch": self.epoch})

    @classmethod
    def decode(cls, raw: bytes) -> ControllerRecord:
        d = json.loads(raw)
        return cls(int(d["node"]), int(d["epoch"]))


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
