"""TopicRegistry: topics, their ids, partition counts and configs, kept in the metadata KV.

Each topic is one KV entry ``topic/<name>`` holding JSON ``{"id", "partitions", "configs"}``,
so topics survive restarts with the rest of the stream metadata and need no local state.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from protocol.errors import ErrorCode
from storage.metadata.manager import MetadataManager

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
    """Kafka's rules: 1-249 chars of [a-zA-Z0-9._-], not "." or ".."."""
    if not name or name in (".", "..") or len(name) > MAX_NAME_LENGTH or not _LEGAL.match(name):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} is illegal: use 1-{MAX_NAME_LENGTH} characters of "
            "ASCII letters, digits, '.', '_' and '-'",
        )


def check_partition_count(partitions: int) -> None:
    if not 0 < partitions <= MAX_PARTITIONS:
        raise TopicError(
            ErrorCode.INVALID_PARTITIONS,
            f"number of partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}",
        )


class TopicRegistry:
    def __init__(self, metadata: MetadataManager) -> None:
        self.metadata = metadata
        self._by_name: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        for key, raw in metadata.image.kv.items():
            if key.startswith(PREFIX):
                self._index(TopicInfo.decode(key[len(PREFIX) :], raw))

    def _index(self, info: TopicInfo) -> None:
        self._by_name[info.name] = info
        self._by_id[info.topic_id] = info

    def get(self, name: str) -> TopicInfo | None:
        return self._by_name.get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[TopicInfo]:
        return sorted(self._by_name.values(), key=lambda t: t.name)

    async def create(
        self, name: str, partitions: int, configs: Mapping[str, str] | None = None
    ) -> TopicInfo:
        validate_name(name)
        if name in self._by_name:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        check_partition_count(partitions)
        internal = name in INTERNAL_TOPICS
        info = TopicInfo(name, uuid.uuid4(), partitions, dict(configs or {}), internal)
        await self.metadata.put_kv(PREFIX + name, info.encode())
        self._index(info)
        return info

    async def delete(self, name: str) -> TopicInfo:
        info = self._by_name.get(name)
        if info is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        await self.metadata.delete_kv(PREFIX + name)
        del self._by_name[name]
        del self._by_id[info.topic_id]
        return info

    async def update(self, info: TopicInfo, **changes: object) -> TopicInfo:
        updated = replace(info, **changes)  # type: ignore[arg-type]
        await self.metadata.put_kv(PREFIX + info.name, updated.encode())
        self._index(updated)
        return updated
