"""The classic consumer protocol's embedded messages, which the coordinator reads and writes
where a group's members speak the classic protocol but the broker assigns (KIP-848's online
migration) or where it checks what a group subscribes to.

A consumer's JoinGroup protocol metadata is a ``ConsumerProtocolSubscription`` and its
SyncGroup assignment a ``ConsumerProtocolAssignment`` (Kafka's ``ConsumerProtocol``; not
flexible: int16 versions, int32 array counts, int16-length strings, int32-length bytes, -1 for
null)::

    subscription: version int16, topics [string], user_data bytes|null,
        [v1+] owned_partitions [topic string, partitions [int32]],
        [v2+] generation_id int32, [v3+] rack_id string|null
    assignment: version int16, assigned_partitions [topic string, partitions [int32]],
        user_data bytes|null

Later fields are optional to a reader: a newer version's extra fields are ignored, as Kafka's
deserializer does, and a missing one takes its default.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.wire import Cursor

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# the newest ConsumerProtocolAssignment version (every version has the same fields)
ASSIGNMENT_VERSION = 3

# topic name -> partitions
NamedPartitions = dict[str, frozenset[int]]


class ConsumerProtocolError(ValueError):
    """An embedded message that does not parse."""


@dataclass(slots=True, frozen=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned: NamedPartitions | None = None
    generation_id: int = -1
    rack_id: str | None = None


@dataclass(slots=True, frozen=True)
class Assignment:
    version: int
    partitions: NamedPartitions
    user_data: bytes | None = None


class _Reader(Cursor):
    __slots__ = ()
    error = ConsumerProtocolError

    def partitions(self) -> NamedPartitions:
        out: dict[str, set[int]] = {}
        for _ in range(self.count(6)):
            topic = self.text()
            out.setdefault(topic, set()).update(self.i32() for _ in range(self.count(4)))
        return {t: frozenset(p) for t, p in out.items()}


def parse_subscription(metadata: bytes) -> Subscription:
    """A ``ConsumerProtocolSubscription``; ConsumerProtocolError if it does not parse."""
    r = _Reader(metadata)
    version = r.i16()
    if version < 0:
        raise ConsumerProtocolError(f"subscription version {version}")
    topics = tuple(r.text() for _ in range(r.count(2)))
    user_data = r.nullable_bytes()
    owned: NamedPartitions | None = None
    generation_id, rack_id = -1, None
    if version >= 1 and not r.at_end:
        owned = r.partitions()
    if version >= 2 and not r.at_end:
        generation_id = r.i32()
    if version >= 3 and not r.at_end:
        rack_id = r.string()
    return Subscription(version, topics, user_data, owned, generation_id, rack_id)


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The topic names of a ``ConsumerProtocolSubscription``; None if it does not parse."""
    try:
        return set(parse_subscription(metadata).topics)
    except ConsumerProtocolError:
        return None


def parse_assignment(data: bytes) -> Assignment:
    """A ``ConsumerProtocolAssignment``; ConsumerProtocolError if it does not parse."""
    r = _Reader(data)
    version = r.i16()
    if version < 0:
        raise ConsumerProtocolError(f"assignment version {version}")
    partitions = r.partitions()
    user_data = None if r.at_end else r.nullable_bytes()
    return Assignment(version, partitions, user_data)


def serialize_assignment(
    partitions: Iterable[tuple[str, Iterable[int]]], version: int = ASSIGNMENT_VERSION
) -> bytes:
    """A ``ConsumerProtocolAssignment`` of ``partitions`` (topic, partitions) without user
    data, at ``version`` (at most the newest)."""
    out = bytearray(_I16.pack(max(0, min(version, ASSIGNMENT_VERSION))))
    listed = [(t, sorted(p)) for t, p in sorted(partitions)]
    out += _I32.pack(len(listed))
    for topic, parts in listed:
        raw = topic.encode()
        out += _I16.pack(len(raw)) + raw + _I32.pack(len(parts))
        for p in parts:
            out += _I32.pack(p)
    out += _I32.pack(-1)  # user data: null
    return bytes(out)
