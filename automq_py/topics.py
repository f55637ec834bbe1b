"""TopicRegistry: topics, their ids, partition counts and configs, kept in the metadata KV.

Each topic is one KV entry ``topic/<name>`` holding JSON ``{"id", "partitions", "configs"}``,
so topics survive restarts with the rest of the stream metadata and need no local state.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from protocol.errors import ErrorCode
from storage.metadata.image import MetadataImage
from storage.metadata.manager import MetadataManager
from storage.metadata.records import KVRecord, Record, RemoveKV

PREFIX = "topic/"
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249
# Kafka's controller refuses operations of more than 10,000 records; a larger topic would also
# make every Metadata answer huge (a client listing all topics could exhaust the broker)
MAX_PARTITIONS = 10_000
# Kafka's Topic.isInternal: the coordinators' topics, which clients may read but not write
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


class TopicError(Exception):
    """A topic operation refused; ``code`` is the Kafka error code to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True, frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    internal: bool = False

    def encode(self) -> bytes:
        return json.dumps(
            {
                "id": str(self.topic_id),
                "partitions": self.partitions,
                "configs": dict(self.configs),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, name: str, raw: bytes) -> TopicInfo:
        data = json.loads(raw)
        return cls(
            name,
            uuid.UUID(data["id"]),
            int(data["partitions"]),
            dict(data.get("configs", {})),
            internal=name in INTERNAL_TOPICS,
        )


def validate_name(name: str) -> None:
    """Kafka's rules (Topic.validate), with its messages: 1-249 chars of [a-zA-Z0-9._-], not
    "." or ".."."""
    if not name:
        problem = "Topic name is illegal, it can't be empty"
    elif name in (".", ".."):
        problem = 'Topic name cannot be "." or ".."'
    elif len(name) > MAX_NAME_LENGTH:
        problem = (
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, "
            f"Topic name: {name}"
        )
    elif not _LEGAL.match(name):
        problem = (
            f'Topic name "{name}" is illegal, it contains a character other than ASCII '
            "alphanumerics, '.', '_' and '-'"
        )
    else:
        return
    raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)


def check_collision(name: str, existing: Iterable[str]) -> None:
    """Kafka refuses a new topic whose name differs from an existing one's only by '.' against
    '_': their metric names would be the same."""
    if "." not in name and "_" not in name:
        return
    unified = name.replace(".", "_")
    for other in existing:
        if other != name and other.replace(".", "_") == unified:
            raise TopicError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"Topic '{name}' collides with existing topic: {other}",
            )


def check_partition_count(partitions: int) -> None:
    if partitions <= 0:
        raise TopicError(
            ErrorCode.INVALID_PARTITIONS,
            "Number of partitions was set to an invalid non-positive value.",
        )
    if partitions > MAX_PARTITIONS:
        raise TopicError(
            ErrorCode.INVALID_PARTITIONS,
            f"number of partitions must be at most {MAX_PARTITIONS}, got {partitions}",
        )


def check_partitions_added(name: str, current: int, requested: int) -> None:
    """CreatePartitions' check, in the words of Kafka's controller: a topic's partitions can
    be added, never removed."""
    if requested < current:
        raise TopicError(
            ErrorCode.INVALID_PARTITIONS,
            f"The topic {name} currently has {current} partition(s); {requested} would not be "
            "an increase.",
        )
    if requested == current:
        raise TopicError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")


class LeaderPlacement(Protocol):
    """Where a cluster's new partitions are led (a single broker has none: it leads them all)."""

    def new_partitions(
        self,
        image: MetadataImage,
        topic: str,
        count: int,
        first_index: int,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> list[Record]: ...

    def dropped(self, image: MetadataImage, topic: str) -> list[Record]: ...


class TopicRegistry:
    """The topics, as the metadata holds them; kept current with every broker's changes."""

    def __init__(self, metadata: MetadataManager, placement: LeaderPlacement | None = None) -> None:
        self.metadata = metadata
        self._placement = placement
        self._by_name: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        # grows with every change of a topic: what is built from them is reused until then
        self.generation = 0
        self._config_listeners: list[Callable[[TopicInfo], object]] = []
        for key, raw in metadata.image.kv.items():
            if key.startswith(PREFIX):
                self._index(TopicInfo.decode(key[len(PREFIX) :], raw))
        metadata.add_listener(self._on_records)

    def add_config_listener(self, listener: Callable[[TopicInfo], object]) -> None:
        """Call ``listener(topic)`` after a topic's configs changed, through any broker."""
        self._config_listeners.append(listener)

    def _index(self, info: TopicInfo) -> None:
        self.generation += 1
        old = self._by_name.get(info.name)
        if old is not None and old.topic_id != info.topic_id:
            self._by_id.pop(old.topic_id, None)
        self._by_name[info.name] = info
        self._by_id[info.topic_id] = info
        self._compare_configs(old, info)

    def _compare_configs(self, old: TopicInfo | None, new: TopicInfo) -> None:
        """Tell the config listeners if ``new`` changed the configs of topic ``old``."""
        if old is not None and old.topic_id == new.topic_id and old.configs != new.configs:
            for listener in self._config_listeners:
                listener(new)

    def _unindex(self, name: str) -> None:
        self.generation += 1
        info = self._by_name.pop(name, None)
        if info is not None:
            self._by_id.pop(info.topic_id, None)

    def _on_records(self, records: Sequence[Record]) -> None:
        """Follow the topics the metadata's changes (any broker's) create, alter and delete."""
        if not records:  # the image was reloaded whole
            self.generation += 1
            before = self._by_name.copy()
            self._by_name.clear()
            self._by_id.clear()
            for key, raw in self.metadata.image.kv.items():
                if key.startswith(PREFIX):
                    info = TopicInfo.decode(key[len(PREFIX) :], raw)
                    self._index(info)
                    self._compare_configs(before.get(info.name), info)
            return
        for r in records:
            if isinstance(r, KVRecord) and r.key.startswith(PREFIX):
                self._index(TopicInfo.decode(r.key[len(PREFIX) :], r.value))
            elif isinstance(r, RemoveKV) and r.key.startswith(PREFIX):
                self._unindex(r.key[len(PREFIX) :])

    def get(self, name: str) -> TopicInfo | None:
        return self._by_name.get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[TopicInfo]:
        return sorted(self._by_name.values(), key=lambda t: t.name)

    async def create(
        self,
        name: str,
        partitions: int,
        configs: Mapping[str, str] | None = None,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> TopicInfo:
        """Create topic ``name``; ``assignments``: a manual assignment's replica lists, one a
        partition in order, whose first live broker leads it (in a cluster)."""
        validate_name(name)
        check_partition_count(partitions)
        internal = name in INTERNAL_TOPICS
        info = TopicInfo(name, uuid.uuid4(), partitions, dict(configs or {}), internal)

        def plan(image: MetadataImage) -> tuple[list[Record], TopicInfo]:
            # checked against the image: another broker may have created it a moment ago
            if PREFIX + name in image.kv:
                raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
            records: list[Record] = [KVRecord(PREFIX + name, info.encode())]
            if self._placement is not None:
                records += self._placement.new_partitions(image, name, partitions, 0, assignments)
            return records, info

        # (indexed by ``_on_records`` as the change is applied: indexed again after it, it
        # could undo another broker's change the follower applied meanwhile)
        await self.metadata.change(plan)
        return info

    async def delete(self, name: str) -> TopicInfo:
        def plan(image: MetadataImage) -> tuple[list[Record], TopicInfo]:
            raw = image.kv.get(PREFIX + name)
            if raw is None:
                raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            records: list[Record] = [RemoveKV(PREFIX + name)]
            if self._placement is not None:
                records += self._placement.dropped(image, name)
            return records, TopicInfo.decode(name, raw)

        return await self.metadata.change(plan)

    async def update(
        self,
        info: TopicInfo,
        *,
        partitions: int | None = None,
        configs: Mapping[str, str] | None = None,
        assignments: Sequence[Sequence[int]] | None = None,
    ) -> TopicInfo:
        """Give topic ``info`` (as the caller read it) ``partitions`` or the configs
        ``configs`` (the whole set the caller made from ``info.configs``), checked against the
        topic as the metadata holds it when the change is made: another broker may have changed
        it meanwhile, and what it changed is kept (the partitions it added, the configs this
        caller did not touch). ``assignments``: the added partitions' replica lists, as in
        :meth:`create`."""

        def plan(image: MetadataImage) -> tuple[list[Record], TopicInfo]:
            raw = image.kv.get(PREFIX + info.name)
            current = None if raw is None else TopicInfo.decode(info.name, raw)
            if current is None or current.topic_id != info.topic_id:
                raise TopicError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {info.name!r}"
                )
            updated = current
            if partitions is not None:
                check_partitions_added(info.name, current.partitions, partitions)
                updated = replace(updated, partitions=partitions)
            if configs is not None:
                merged = {
                    k: v
                    for k, v in current.configs.items()
                    if k not in info.configs or k in configs
                }
                merged.update((k, v) for k, v in configs.items() if info.configs.get(k) != v)
                updated = replace(updated, configs=merged)
            records: list[Record] = [KVRecord(PREFIX + info.name, updated.encode())]
            added = updated.partitions - current.partitions
            if self._placement is not None and added > 0:
                if assignments is not None and len(assignments) != added:
                    raise TopicError(  # (another broker added partitions meanwhile)
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"Attempted to add {added} additional partition(s), but only "
                        f"{len(assignments)} assignment(s) were specified.",
                    )
                records += self._placement.new_partitions(
                    image, info.name, added, current.partitions, assignments
                )
            return records, updated

        return await self.metadata.change(plan)
