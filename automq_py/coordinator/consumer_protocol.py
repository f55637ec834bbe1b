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


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ConsumerProtocolError(f"truncated at byte {self.pos}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def count(self, item_size: int) -> int:
        n = self.i32()
        if n < 0 or n * item_size > len(self.data) - self.pos:
            raise ConsumerProtocolError(f"array count {n} does not fit the remaining bytes")
        return n

    def string(self) -> str | None:
        n = self.i16()
        if n == -1:
            return None
        try:
            return self._take(n).decode()
        except UnicodeDecodeError as e:
            raise ConsumerProtocolError(f"string is not UTF-8: {e}") from None

    def text(self) -> str:
        value = self.string()
        if value is None:
            raise ConsumerProtocolError("null string where one is required")
        return value

    def bytes_(self) -> bytes | None:
        n = self.i32()
        return None if n == -1 else self._take(n)

    def partitions(self) -> NamedPartitions:
        out: dict[str, set[int]] = {}
        for _ in range(self.count(6)):
            topic = self.text()
            out.setdefault(topic, set()).update(self.i32() for _ in range(self.count(4)))
        return {t: frozenset(p) for t, p in out.items()}


def parse_subscription(metadata: bytes) -> Subscription:
    """A ``ConsumerProtocolSubscription``; ConsumerProtocolError if it does not parse."""
    r = _Reader(bytes(metadata))
    try:
        version = r.i16()
        if version < 0:
            raise ConsumerProtocolError(f"subscription version {version}")
        topics = tuple(r.text() for _ in range(r.count(2)))
        user_data = r.bytes_()
        owned: NamedPartitions | None = None
        generation_id, rack_id = -1, None
        if version >= 1 and not r.at_end:
            owned = r.partitions()
        if version >= 2 and not r.at_end:
            generation_id = r.i32()
        if version >= 3 and not r.at_end:
            rack_id = r.string()
    except struct.error:
        raise ConsumerProtocolError("truncated subscription") from None
    return Subscription(version, topics, user_data, owned, generation_id, rack_id)


def subscription_topics(metadata: bytes) -> set[str] | None:
    """The topic names of a ``ConsumerProtocolSubscription``; None if it does not parse."""
    try:
        return set(parse_subscription(metadata).topics)
    except ConsumerProtocolError:
        return None


def parse_assignment(data: bytes) -> Assignment:
    """A ``ConsumerProtocolAssignment``; ConsumerProtocolError if it does not parse."""
    r = _Reader(bytes(data))
    try:
        version = r.i16()
        if version < 0:
            raise ConsumerProtocolError(f"assignment version {version}")
        partitions = r.partitions()
        user_data = None if r.at_end else r.bytes_()
    except struct.error:
        raise ConsumerProtocolError("truncated assignment") from None
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
