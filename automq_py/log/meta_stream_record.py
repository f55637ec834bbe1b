"""MetaStream key-value records, byte-compatible with AutoMQ's ``MetaKeyValue``.

=======  =========  ====================================
offset   field      bytes
=======  =========  ====================================
0        magic      1 (``0x00``)
1        keyLength  4 (int32, big-endian)
5        key        keyLength bytes of UTF-8
5+n      value      the rest
=======  =========  ====================================

Keys: ``PARTITION`` (JSON), ``LOG`` (ElasticLogMeta JSON), ``LEADER_EPOCH_CHECKPOINT``,
``PRODUCER_SNAPSHOTS``; a later record for a key replaces the earlier one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x00
_HEAD = struct.Struct(">bi")

PARTITION = "PARTITION"
LOG = "LOG"
LEADER_EPOCH_CHECKPOINT = "LEADER_EPOCH_CHECKPOINT"
PRODUCER_SNAPSHOTS = "PRODUCER_SNAPSHOTS"
PRODUCER_SNAPSHOT_KEY_PREFIX = "PRODUCER_SNAPSHOT_"  # + offset: one snapshot per key in AutoMQ
KNOWN_KEYS = (PARTITION, LOG, LEADER_EPOCH_CHECKPOINT, PRODUCER_SNAPSHOTS)


class InvalidMetaRecordError(ValueError):
    """Bytes that are not a MetaStream key-value record."""


@dataclass(slots=True, frozen=True)
class MetaKeyValue:
    """One MetaStream record: ``key`` now has ``value``."""

    key: str
    value: bytes


def encode(record: MetaKeyValue) -> bytes:
    """The record's bytes: the payload of one MetaStream append (count 1)."""
    key = record.key.encode()
    return _HEAD.pack(MAGIC, len(key)) + key + record.value


def decode(buf: bytes | memoryview) -> MetaKeyValue:
    """Parse one record; :class:`InvalidMetaRecordError` if ``buf`` is not one."""
    if len(buf) < _HEAD.size:
        raise InvalidMetaRecordError("MetaStream record shorter than its 5-byte header")
    magic, key_len = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC:
        raise InvalidMetaRecordError(f"bad MetaStream record magic {magic}")
    if key_len < 0 or _HEAD.size + key_len > len(buf):
        raise InvalidMetaRecordError(f"MetaStream key length {key_len} exceeds the record")
    try:
        key = bytes(buf[_HEAD.size : _HEAD.size + key_len]).decode()
    except UnicodeDecodeError as e:
        raise InvalidMetaRecordError(f"MetaStream key is not UTF-8: {e}") from e
    return MetaKeyValue(key, bytes(buf[_HEAD.size + key_len :]))


@dataclass(slots=True, frozen=True)
class LeaderEpochCheckpoint:
    """``LEADER_EPOCH_CHECKPOINT`` value: version (int32), count (int32), then per entry
    epoch (int32) and startOffset (int64)."""

    version: int
    entries: tuple[tuple[int, int], ...]

    def encode(self) -> bytes:
        out = struct.pack(">ii", self.version, len(self.entries))
        return out + b"".join(struct.pack(">iq", e, o) for e, o in self.entries)

    @classmethod
    def decode(cls, buf: bytes | memoryview) -> LeaderEpochCheckpoint:
        if len(buf) < 8:
            raise InvalidMetaRecordError("leader epoch checkpoint shorter than 8 bytes")
        version, count = struct.unpack_from(">ii", buf, 0)
        if count < 0 or len(buf) != 8 + 12 * count:
            raise InvalidMetaRecordError(
                f"leader epoch checkpoint says {count} entries but holds {len(buf) - 8} bytes"
            )
        entries = tuple(struct.iter_unpack(">iq", buf[8:]))
        return cls(version, entries)

    def __str__(self) -> str:
        body = ", ".join(f"EpochEntry(epoch={e}, startOffset={o})" for e, o in self.entries)
        return f"ElasticLeaderEpochCheckpointMeta{{version={self.version}, entries=[{body}]}}"


def describe_value(key: str, value: bytes) -> str:
    """A readable rendering of a MetaStream value, by key (JSON as text, binary decoded)."""
    if key in (PARTITION, LOG):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return f"<{len(value)} bytes, not UTF-8>"
    if key == LEADER_EPOCH_CHECKPOINT:
        try:
            return str(LeaderEpochCheckpoint.decode(value))
        except InvalidMetaRecordError as e:
            return f"<invalid: {e}>"
    return f"<{len(value)} bytes: {value[:32].hex()}{'…' if len(value) > 32 else ''}>"
