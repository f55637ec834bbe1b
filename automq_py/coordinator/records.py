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
5      consumer group member   group string, member string
6      target assignment epoch group string
7      target assignment       group string, member string (a member's target)
8      current assignment      group string, member string
16     regular expression      group string, regex string (what a subscribed regex matched)
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

A KIP-848 group's members, each kept by three records, as Kafka's coordinator keeps them so that
another broker loading the partition knows them (v0, flexible: compact strings and arrays, an
unsigned varint length + 1, 0 for null; a uuid is 16 bytes; each struct ends with its tagged
fields, written as none)::

    member (Kafka's ConsumerGroupMemberMetadataValue): instance_id string|null,
        rack_id string|null, client_id string, client_host string,
        subscribed_topic_names [string], subscribed_topic_regex string|null,
        rebalance_timeout_ms int32, server_assignor string|null,
        tagged field 0, classic_member_metadata (a member of the classic protocol in a
        consumer-protocol group, null otherwise; a nullable struct: int8 1, or -1 for null):
        session_timeout_ms int32, supported_protocols [name string, metadata bytes]
    target assignment epoch (ConsumerGroupTargetAssignmentMetadataValue): epoch int32
    target assignment (ConsumerGroupTargetAssignmentMemberValue): [topic_id uuid,
        partitions [int32]]
    current assignment (ConsumerGroupCurrentMemberAssignmentValue): member_epoch int32,
        previous_member_epoch int32, state int8 (0 stable, 1 unrevoked partitions,
        2 unreleased partitions), assigned [topic_id uuid, partitions [int32]],
        pending_revocation [topic_id uuid, partitions [int32]]
    regular expression (ConsumerGroupRegularExpressionValue): topics [string],
        version int64 (the topics' metadata version it was resolved at; 0 here),
        timestamp int64

These are the layouts Apache Kafka writes, so its tooling can read our offsets topic too.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field

from protocol.wire import Cursor

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
CONSUMER_GROUP_KEY_VERSION = 3
MEMBER_METADATA_KEY_VERSION = 5
TARGET_EPOCH_KEY_VERSION = 6
TARGET_MEMBER_KEY_VERSION = 7
CURRENT_ASSIGNMENT_KEY_VERSION = 8
REGEX_KEY_VERSION = 16

OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
CONSUMER_GROUP_VALUE_VERSION = 0
MEMBER_VALUES_VERSION = 0  # of each KIP-848 member record
CLASSIC_MEMBER_METADATA_TAG = 0

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
class ConsumerMemberKey:
    """One of a KIP-848 member's records: ``version`` is the key version (5, 7 or 8)."""

    version: int
    group: str
    member: str


@dataclass(slots=True, frozen=True)
class TargetEpochKey:
    group: str


@dataclass(slots=True, frozen=True)
class RegexKey:
    group: str
    regex: str


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


# a topic id -> partitions, as the KIP-848 records list them
TopicPartitions = tuple[tuple[uuid.UUID, tuple[int, ...]], ...]


@dataclass(slots=True, frozen=True)
class ClassicMemberMetadata:
    """What a member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat) in a
    consumer-protocol group keeps of its JoinGroup: its session timeout and its protocols."""

    session_timeout_ms: int
    # (name, ConsumerProtocolSubscription) in the member's order of preference
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(slots=True, frozen=True)
class MemberMetadataValue:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMemberMetadata | None = None


@dataclass(slots=True, frozen=True)
class TargetEpochValue:
    epoch: int


@dataclass(slots=True, frozen=True)
class RegexValue:
    topics: tuple[str, ...]
    version: int
    timestamp: int


@dataclass(slots=True, frozen=True)
class TargetMemberValue:
    partitions: TopicPartitions


@dataclass(slots=True, frozen=True)
class CurrentAssignmentValue:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: TopicPartitions
    pending_revocation: TopicPartitions


Key = OffsetKey | GroupKey | ConsumerGroupKey | ConsumerMemberKey | TargetEpochKey | RegexKey
Value = (
    OffsetValue
    | GroupValue
    | ConsumerGroupValue
    | MemberMetadataValue
    | TargetEpochValue
    | TargetMemberValue
    | CurrentAssignmentValue
    | RegexValue
)
# the values of a KIP-848 group's records beside its epoch
MemberValues = (
    MemberMetadataValue | TargetEpochValue | TargetMemberValue | CurrentAssignmentValue | RegexValue
)


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

    def i8(self, v: int) -> _Writer:
        self.buf.append(v & 0xFF)
        return self

    def uvarint(self, v: int) -> _Writer:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)
        return self

    def compact_string(self, v: str | None) -> _Writer:
        if v is None:
            return self.uvarint(0)
        raw = v.encode()
        self.uvarint(len(raw) + 1)
        self.buf += raw
        return self

    def compact_bytes(self, v: bytes) -> _Writer:
        self.uvarint(len(v) + 1)
        self.buf += v
        return self

    def topic_partitions(self, v: TopicPartitions) -> _Writer:
        self.uvarint(len(v) + 1)
        for topic_id, partitions in v:
            self.buf += topic_id.bytes
            self.uvarint(len(partitions) + 1)
            for p in partitions:
                self.i32(p)
            self.uvarint(0)  # the struct's tagged fields
        return self


class _Reader(Cursor):
    __slots__ = ()
    error = RecordFormatError

    def bytes_(self) -> bytes:
        """BYTES, null read as empty."""
        return self.nullable_bytes() or b""

    def compact_count(self) -> int | None:
        """A compact array's or string's length; None for null."""
        n = self.uvarint() - 1
        if n > len(self.data) - self.pos:
            raise RecordFormatError(f"length {n} does not fit the remaining bytes")
        return None if n < 0 else n

    def compact_string(self) -> str | None:
        n = self.compact_count()
        if n is None:
            return None
        try:
            return bytes(self.take(n)).decode()
        except UnicodeDecodeError as e:
            raise RecordFormatError(f"string is not UTF-8: {e}") from None

    def compact_text(self) -> str:
        value = self.compact_string()
        if value is None:
            raise RecordFormatError(f"null string at byte {self.pos} where one is required")
        return value

    def compact_bytes(self) -> bytes:
        n = self.compact_count()
        return b"" if n is None else bytes(self.take(n))

    def tagged_fields(self) -> dict[int, memoryview]:
        """A struct's tagged fields, by tag (the caller reads those it knows)."""
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.take(self.uvarint())
        return out

    def topic_partitions(self) -> TopicPartitions:
        out = []
        for _ in range(self.compact_count() or 0):
            topic_id = uuid.UUID(bytes=bytes(self.take(16)))
            partitions = tuple(self.i32() for _ in range(self.compact_count() or 0))
            self.tagged_fields()
            out.append((topic_id, partitions))
        return tuple(out)


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
        case ConsumerMemberKey(version, group, member):
            w.i16(version).string(group).string(member)
        case TargetEpochKey(group):
            w.i16(TARGET_EPOCH_KEY_VERSION).string(group)
        case RegexKey(group, regex):
            w.i16(REGEX_KEY_VERSION).string(group).string(regex)
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
    if version in (
        MEMBER_METADATA_KEY_VERSION,
        TARGET_MEMBER_KEY_VERSION,
        CURRENT_ASSIGNMENT_KEY_VERSION,
    ):
        return ConsumerMemberKey(version, r.text(), r.text())
    if version == TARGET_EPOCH_KEY_VERSION:
        return TargetEpochKey(r.text())
    if version == REGEX_KEY_VERSION:
        return RegexKey(r.text(), r.text())
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
    for _ in range(r.count(2)):  # a member takes more than 2 bytes
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


def encode_member_value(value: MemberValues) -> bytes:
    """A KIP-848 member record's value (or the target assignment's epoch, or a regex's)."""
    w = _Writer().i16(MEMBER_VALUES_VERSION)
    match value:
        case MemberMetadataValue():
            w.compact_string(value.instance_id).compact_string(value.rack_id)
            w.compact_string(value.client_id).compact_string(value.client_host)
            w.uvarint(len(value.subscribed_topic_names) + 1)
            for name in value.subscribed_topic_names:
                w.compact_string(name)
            w.compact_string(value.subscribed_topic_regex).i32(value.rebalance_timeout_ms)
            w.compact_string(value.server_assignor)
            if value.classic is not None:
                # a nullable struct starts with 1 (-1: null)
                classic = _Writer().i8(1).i32(value.classic.session_timeout_ms)
                classic.uvarint(len(value.classic.protocols) + 1)
                for name, metadata in value.classic.protocols:
                    classic.compact_string(name).compact_bytes(metadata).uvarint(0)
                classic.uvarint(0)
                w.uvarint(1).uvarint(CLASSIC_MEMBER_METADATA_TAG).uvarint(len(classic.buf))
                w.buf += classic.buf
                return bytes(w.buf)
        case TargetEpochValue(epoch):
            w.i32(epoch)
        case TargetMemberValue(partitions):
            w.topic_partitions(partitions)
        case CurrentAssignmentValue():
            w.i32(value.member_epoch).i32(value.previous_member_epoch).i8(value.state)
            w.topic_partitions(value.assigned).topic_partitions(value.pending_revocation)
        case RegexValue(topics, version, timestamp):
            w.uvarint(len(topics) + 1)
            for topic in topics:
                w.compact_string(topic)
            w.i64(version).i64(timestamp)
    return bytes(w.uvarint(0).buf)  # tagged fields: none


def _decode_member_value(
    key: ConsumerMemberKey | TargetEpochKey | RegexKey, data: bytes | memoryview
) -> MemberValues:
    r = _Reader(data)
    version = r.i16()
    if version != MEMBER_VALUES_VERSION:
        raise RecordFormatError(f"unknown consumer group member value version {version}")
    value: MemberValues
    if isinstance(key, TargetEpochKey):
        value = TargetEpochValue(r.i32())
    elif isinstance(key, RegexKey):
        topics = tuple(r.compact_text() for _ in range(r.compact_count() or 0))
        value = RegexValue(topics, r.i64(), r.i64())
    elif key.version == MEMBER_METADATA_KEY_VERSION:
        instance_id, rack_id = r.compact_string(), r.compact_string()
        client_id, client_host = r.compact_text(), r.compact_text()
        names = tuple(r.compact_text() for _ in range(r.compact_count() or 0))
        regex, timeout, assignor = r.compact_string(), r.i32(), r.compact_string()
        classic = None
        tagged = r.tagged_fields().get(CLASSIC_MEMBER_METADATA_TAG)
        if tagged is not None:
            c = _Reader(tagged)
            if c.i8() >= 0:  # a nullable struct: -1 for null
                session_timeout = c.i32()
                protocols = []
                for _ in range(c.compact_count() or 0):
                    protocols.append((c.compact_text(), c.compact_bytes()))
                    c.tagged_fields()
                c.tagged_fields()
                classic = ClassicMemberMetadata(session_timeout, tuple(protocols))
        return MemberMetadataValue(
            instance_id, rack_id, client_id, client_host, names, regex, timeout, assignor, classic
        )
    elif key.version == TARGET_MEMBER_KEY_VERSION:
        value = TargetMemberValue(r.topic_partitions())
    else:
        epoch, previous, state = r.i32(), r.i32(), r.i8()
        value = CurrentAssignmentValue(
            epoch, previous, state, r.topic_partitions(), r.topic_partitions()
        )
    r.tagged_fields()
    return value


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
        case ConsumerMemberKey() | TargetEpochKey() | RegexKey():
            return _decode_member_value(key, data)
