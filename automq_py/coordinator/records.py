"""The records of ``__consumer_offsets``: Kafka's group coordinator key/value format.

Each record's key starts with an int16 *key version* that says what the record is; its value
starts with an int16 *value version*. A null value is a tombstone: the key's state is gone.
Integers are big-endian; a ``string`` is an int16 length and UTF-8 bytes (length -1: null); a
``bytes`` is an int32 length and the bytes; an array is an int32 count and its items.

=====  ======================  ===================================================
key v  record                  key fields
=====  ======================  ===================================================
0, 1   offset commit           group string, topic string, partition int32
2      classic group metadata  group string
3      consumer group epoch    group string (a KIP-848 group)
=====  ======================  ===================================================

Offset commit value, written as v3, or v1 when the commit has an expire timestamp (OffsetCommit
v2-v4's retention time); v0-v3 are read::

    v0: offset int64, metadata string, commit_timestamp int64
    v1: offset int64, metadata string, commit_timestamp int64, expire_timestamp int64
    v2: offset int64, metadata string, commit_timestamp int64
    v3: offset int64, leader_epoch int32, metadata string, commit_timestamp int64

Classic group metadata value, written as v3 (v0-v3 are read)::

    protocol_type string, generation int32, protocol string|null, leader string|null,
    [v2+] current_state_timestamp int64,
    members array of:
        member_id string, [v3+] group_instance_id string|null, client_id string,
        client_host string, [v1+] rebalance_timeout int32, session_timeout int32,
        subscription bytes, assignment bytes

Consumer group epoch value (Kafka's ``ConsumerGroupMetadataValue`` v0, flexible)::

    epoch int32, tagged fields (an unsigned varint count, written as 0)

These are the layouts Apache Kafka writes, so its tooling can read our offsets topic too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
CONSUMER_GROUP_KEY_VERSION = 3

OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
CONSUMER_GROUP_VALUE_VERSION = 0

NO_TIMESTAMP = -1
NO_LEADER_EPOCH = -1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """A key or value that does not parse as any known version."""


@dataclass(slots=True, frozen=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(slots=True, frozen=True)
class GroupKey:
    group: str


@dataclass(slots=True, frozen=True)
class ConsumerGroupKey:
    group: str


@dataclass(slots=True, frozen=True)
class OffsetValue:
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = NO_TIMESTAMP
    expire_timestamp: int = NO_TIMESTAMP  # only in v1 values


@dataclass(slots=True, frozen=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(slots=True, frozen=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = NO_TIMESTAMP
    members: tuple[MemberValue, ...] = field(default_factory=tuple)


@dataclass(slots=True, frozen=True)
class ConsumerGroupValue:
    epoch: int


Key = OffsetKey | GroupKey | ConsumerGroupKey
Value = OffsetValue | GroupValue | ConsumerGroupValue


class _Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def i16(self, v: int) -> _Writer:
        self.buf += _I16.pack(v)
        return self

    def i32(self, v: int) -> _Writer:
        self.buf += _I32.pack(v)
        return self

    def i64(self, v: int) -> _Writer:
        self.buf += _I64.pack(v)
        return self

    def string(self, v: str | None) -> _Writer:
        if v is None:
            return self.i16(-1)
        raw = v.encode()
        if len(raw) > 0x7FFF:
            raise RecordFormatError(f"string of {len(raw)} bytes is too long for int16 length")
        self.i16(len(raw))
        self.buf += raw
        return self

    def bytes_(self, v: bytes) -> _Writer:
        self.i32(len(v))
        self.buf += v
        return self


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise RecordFormatError(f"truncated at byte {self.pos}: {n} more bytes expected")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def string(self) -> str | None:
        n = self.i16()
        if n == -1:
            return None
        try:
            return bytes(self._take(n)).decode()
        except UnicodeDecodeError as e:
            raise RecordFormatError(f"string is not UTF-8: {e}") from None

    def text(self) -> str:
        value = self.string()
        if value is None:
            raise RecordFormatError(f"null string at byte {self.pos} where one is required")
        return value

    def bytes_(self) -> bytes:
        n = self.i32()
        if n == -1:
            return b""
        return bytes(self._take(n))

    def count(self) -> int:
        n = self.i32()
        # every array item here takes at least 2 bytes; a larger count is corrupt
        if n < 0 or n > (len(self.data) - self.pos) // 2:
            raise RecordFormatError(f"array count {n} does not fit the remaining bytes")
        return n

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise RecordFormatError("varint longer than 5 bytes")


# --- keys ---------------------------------------------------------------------------------------


def encode_key(key: Key) -> bytes:
    w = _Writer()
    match key:
        case OffsetKey(group, topic, partition):
            w.i16(OFFSET_COMMIT_KEY_VERSION).string(group).string(topic).i32(partition)
        case GroupKey(group):
            w.i16(GROUP_METADATA_KEY_VERSION).string(group)
        case ConsumerGroupKey(group):
            w.i16(CONSUMER_GROUP_KEY_VERSION).string(group)
    return bytes(w.buf)


def decode_key(data: bytes | memoryview) -> Key | None:
    """The key, or None for a key version this broker does not know (Kafka's newer record
    types: skipped on load)."""
    r = _Reader(data)
    version = r.i16()
    if version in (0, 1):
        return OffsetKey(r.text(), r.text(), r.i32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupKey(r.text())
    if version == CONSUMER_GROUP_KEY_VERSION:
        return ConsumerGroupKey(r.text())
    return None


# --- values -------------------------------------------------------------------------------------


def encode_offset_value(value: OffsetValue) -> bytes:
    """v3, or v1 when the commit has its own expire timestamp (as Kafka chooses)."""
    if value.expire_timestamp >= 0:
        w = _Writer().i16(1).i64(value.offset).string(value.metadata)
        w.i64(value.commit_timestamp).i64(value.expire_timestamp)
        return bytes(w.buf)
    w = _Writer().i16(OFFSET_COMMIT_VALUE_VERSION)
    w.i64(value.offset).i32(value.leader_epoch).string(value.metadata).i64(value.commit_timestamp)
    return bytes(w.buf)


def decode_offset_value(data: bytes | memoryview) -> OffsetValue:
    r = _Reader(data)
    version = r.i16()
    if version not in (0, 1, 2, 3):
        raise RecordFormatError(f"unknown offset commit value version {version}")
    offset = r.i64()
    epoch = r.i32() if version == 3 else NO_LEADER_EPOCH
    metadata = r.string() or ""
    commit_timestamp = r.i64()
    expire = r.i64() if version == 1 else NO_TIMESTAMP
    return OffsetValue(offset, epoch, metadata, commit_timestamp, expire)


def encode_group_value(value: GroupValue) -> bytes:
    w = _Writer().i16(GROUP_METADATA_VALUE_VERSION)
    w.string(value.protocol_type).i32(value.generation).string(value.protocol)
    w.string(value.leader).i64(value.current_state_timestamp)
    w.i32(len(value.members))
    for m in value.members:
        w.string(m.member_id).string(m.group_instance_id).string(m.client_id)
        w.string(m.client_host).i32(m.rebalance_timeout).i32(m.session_timeout)
        w.bytes_(m.subscription).bytes_(m.assignment)
    return bytes(w.buf)


def decode_group_value(data: bytes | memoryview) -> GroupValue:
    r = _Reader(data)
    version = r.i16()
    if version not in (0, 1, 2, 3):
        raise RecordFormatError(f"unknown group metadata value version {version}")
    protocol_type = r.text()
    generation = r.i32()
    protocol = r.string()
    leader = r.string()
    state_timestamp = r.i64() if version >= 2 else NO_TIMESTAMP
    members = []
    for _ in range(r.count()):
        member_id = r.text()
        instance_id = r.string() if version >= 3 else None
        client_id = r.text()
        client_host = r.text()
        session_timeout = r.i32()
        # v0 has no rebalance timeout: it equals the session timeout
        rebalance_timeout = session_timeout
        if version >= 1:
            rebalance_timeout, session_timeout = session_timeout, r.i32()
        members.append(
            MemberValue(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                r.bytes_(),
                r.bytes_(),
            )
        )
    return GroupValue(protocol_type, generation, protocol, leader, state_timestamp, tuple(members))


def encode_consumer_group_value(value: ConsumerGroupValue) -> bytes:
    return bytes(_Writer().i16(CONSUMER_GROUP_VALUE_VERSION).i32(value.epoch).buf) + b"\x00"


def decode_consumer_group_value(data: bytes | memoryview) -> ConsumerGroupValue:
    r = _Reader(data)
    version = r.i16()
    if version != CONSUMER_GROUP_VALUE_VERSION:
        raise RecordFormatError(f"unknown consumer group value version {version}")
    epoch = r.i32()
    r.uvarint()  # tagged fields: none are known
    return ConsumerGroupValue(epoch)


def decode_value(key: Key, data: bytes | memoryview | None) -> Value | None:
    """The value for ``key``; None for a tombstone."""
    if data is None:
        return None
    match key:
        case OffsetKey():
            return decode_offset_value(data)
        case GroupKey():
            return decode_group_value(data)
        case ConsumerGroupKey():
            return decode_consumer_group_value(data)
