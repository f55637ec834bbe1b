"""The records of ``__transaction_state``: Kafka's transaction coordinator key/value format.

One record per transactional id; the latest one (by offset) is the id's state, and a null
value is a tombstone (the id expired and was removed). Integers are big-endian.

Key (Kafka's ``TransactionLogKey``, only version 0)::

    key_version int16 (0), transactional_id string

Value (Kafka's ``TransactionLogValue``): an int16 *value version*, then the fields.

================================  ======================  ===============================
field (Kafka's name)              v0                      v1 (flexible)
================================  ======================  ===============================
ProducerId                        int64                   int64
ProducerEpoch                     int16                   int16
TransactionTimeoutMs              int32                   int32
TransactionStatus                 int8                    int8
TransactionPartitions             nullable array of:      nullable compact array of:
  Topic                             string                  compact string
  PartitionIds                      array of int32          compact array of int32
  (the entry's tagged fields)       --                      none known
TransactionLastUpdateTimestampMs  int64                   int64
TransactionStartTimestampMs       int64                   int64
(tagged fields)                   --                      tag 0 PreviousProducerId int64
                                                          tag 1 NextProducerId int64
                                                          tag 2 ClientTransactionVersion
                                                          int16
================================  ======================  ===============================

A tag is written only when its value is not the default (-1, -1, 0).

``string``: int16 length + UTF-8; ``array``: int32 count + items (a nullable array: count -1 is
null). Flexible (v1): ``compact string`` is an unsigned varint length+1 + UTF-8; ``compact
array`` an unsigned varint count+1 (0 is null); a tagged-field section is an unsigned varint
count, then per field an unsigned varint tag, an unsigned varint size and the value.

TransactionStatus is Kafka's ``TransactionState`` id: 0 Empty, 1 Ongoing, 2 PrepareCommit,
3 PrepareAbort, 4 CompleteCommit, 5 CompleteAbort, 6 Dead, 7 PrepareEpochFence. It stays a
plain int here; the coordinator's state machine owns its meaning. Kafka writes null partitions
for Empty and ignores the partitions of an Empty record when loading.

Versions: Kafka 3.9 writes v0 (v1 only once the unstable ``transaction.version`` >= 1 is
enabled) and has no tagged fields yet; Kafka 4.0 writes v1 when ``transaction.version`` >= 1
(the default of a cluster formatted at 4.0), v0 at 0, and of the tags writes only
ClientTransactionVersion (it reads all three). This module writes v0 by default
(``encode_value(value, version=1)`` for v1, with every non-default tag) and reads both.

Tolerance, as Kafka's readers: bytes after the last field are ignored (key and value); unknown
tagged fields are skipped; a negative count on the nullable partitions array is null. A key
version other than 0 is not an error: Kafka skips such records on load (``decode_key`` returns
None). A value version other than 0 or 1 is an error, as in Kafka. Stricter than Kafka: a known
tag whose size is not its type's width is an error (Kafka would misread the rest).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.wire import Cursor

TRANSACTION_LOG_KEY_VERSION = 0
TRANSACTION_LOG_VALUE_VERSION = 0  # what Kafka 3.9 writes
FLEXIBLE_VALUE_VERSION = 1
VALUE_VERSIONS = (0, 1)

NO_PRODUCER_ID = -1
DEFAULT_CLIENT_TRANSACTION_VERSION = 0

_TAG_PREVIOUS_PRODUCER_ID = 0
_TAG_NEXT_PRODUCER_ID = 1
_TAG_CLIENT_TRANSACTION_VERSION = 2
_TAG_WIDTHS = {
    _TAG_PREVIOUS_PRODUCER_ID: 8,
    _TAG_NEXT_PRODUCER_ID: 8,
    _TAG_CLIENT_TRANSACTION_VERSION: 2,
}

_MAX_STRING_BYTES = 0x7FFF

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
# the fixed fields before the partitions, and the two timestamps after them
_HEAD = struct.Struct(">qhib")
_TAIL = struct.Struct(">qq")


class TransactionLogFormatError(ValueError):
    """Bytes that are not a ``__transaction_state`` key or value, or a value that cannot be
    written in the requested version."""


@dataclass(slots=True, frozen=True)
class TransactionLogKey:
    transactional_id: str


@dataclass(slots=True, frozen=True)
class TopicPartitions:
    """One topic of a transaction and its partition ids (Kafka's ``PartitionsSchema``)."""

    topic: str
    partition_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class TransactionLogValue:
    """A transactional id's state; ``status`` is the ``TransactionState`` id (int8)."""

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: int
    partitions: tuple[TopicPartitions, ...] | None
    last_update_timestamp_ms: int
    start_timestamp_ms: int
    # v1 tagged fields (KIP-890); a v0 record reads as the defaults
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = DEFAULT_CLIENT_TRANSACTION_VERSION


# --- writing ------------------------------------------------------------------------------------


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _utf8(value: str) -> bytes:
    try:
        raw = value.encode()
    except UnicodeEncodeError as e:  # a lone surrogate
        raise TransactionLogFormatError(f"string is not encodable as UTF-8: {e}") from None
    if len(raw) > _MAX_STRING_BYTES:
        raise TransactionLogFormatError(f"string of {len(raw)} bytes is longer than 32767")
    return raw


def encode_key(key: TransactionLogKey) -> bytes:
    """Key version 0 and the transactional id."""
    raw = _utf8(key.transactional_id)
    return _I16.pack(TRANSACTION_LOG_KEY_VERSION) + _I16.pack(len(raw)) + raw


def _tagged_fields(value: TransactionLogValue) -> list[tuple[int, bytes]]:
    tags = []
    if value.previous_producer_id != NO_PRODUCER_ID:
        tags.append((_TAG_PREVIOUS_PRODUCER_ID, _I64.pack(value.previous_producer_id)))
    if value.next_producer_id != NO_PRODUCER_ID:
        tags.append((_TAG_NEXT_PRODUCER_ID, _I64.pack(value.next_producer_id)))
    if value.client_transaction_version != DEFAULT_CLIENT_TRANSACTION_VERSION:
        tags.append((_TAG_CLIENT_TRANSACTION_VERSION, _I16.pack(value.client_transaction_version)))
    return tags


def encode_value(value: TransactionLogValue, version: int = TRANSACTION_LOG_VALUE_VERSION) -> bytes:
    """The value in ``version`` (0, as Kafka 3.9 writes, or 1).

    v0 has no tagged fields: a value whose previous/next producer id or client transaction
    version is not the default cannot be written as v0 (Kafka refuses too).
    """
    if version not in VALUE_VERSIONS:
        raise TransactionLogFormatError(f"unknown transaction log value version {version}")
    flexible = version >= FLEXIBLE_VALUE_VERSION
    try:
        tags = _tagged_fields(value)
        if tags and not flexible:
            raise TransactionLogFormatError(
                "previous/next producer id and client transaction version need value version 1"
            )
        out = bytearray(_I16.pack(version))
        out += _HEAD.pack(value.producer_id, value.producer_epoch, value.timeout_ms, value.status)
        parts = value.partitions
        if parts is None:
            out += _uvarint(0) if flexible else _I32.pack(-1)
        else:
            out += _uvarint(len(parts) + 1) if flexible else _I32.pack(len(parts))
            for entry in parts:
                topic = _utf8(entry.topic)
                ids = entry.partition_ids
                if flexible:
                    out += _uvarint(len(topic) + 1) + topic + _uvarint(len(ids) + 1)
                else:
                    out += _I16.pack(len(topic)) + topic + _I32.pack(len(ids))
                out += struct.pack(f">{len(ids)}i", *ids)
                if flexible:
                    out += _uvarint(0)  # the entry's tagged fields
        out += _TAIL.pack(value.last_update_timestamp_ms, value.start_timestamp_ms)
        if flexible:
            out += _uvarint(len(tags))
            for tag, data in tags:
                out += _uvarint(tag) + _uvarint(len(data)) + data
    except struct.error as e:
        raise TransactionLogFormatError(f"field out of range: {e}") from None
    return bytes(out)


# --- reading ------------------------------------------------------------------------------------


class _Reader(Cursor):
    __slots__ = ()
    error = TransactionLogFormatError

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        return tuple(fmt.unpack(self.take(fmt.size)))

    def sized_text(self, n: int) -> str:
        """``n`` bytes of UTF-8 (``n`` from a non-nullable string's length field)."""
        if n < 0:
            raise TransactionLogFormatError(f"null string at byte {self.pos}")
        if n > _MAX_STRING_BYTES:
            raise TransactionLogFormatError(f"string length {n} is longer than 32767")
        return self.utf8(n)

    def int32s(self, n: int) -> tuple[int, ...]:
        return struct.unpack(f">{n}i", self.take(4 * n))

    def skip_tagged_fields(self) -> None:
        for _ in range(self.fits(self.uvarint(), 2)):
            self.uvarint()
            self.take(self.uvarint())


def decode_key(data: bytes | bytearray | memoryview) -> TransactionLogKey | None:
    """The key, or None for a key version other than 0 (Kafka skips those records on load)."""
    r = _Reader(data)
    if r.i16() != TRANSACTION_LOG_KEY_VERSION:
        return None
    return TransactionLogKey(r.sized_text(r.i16()))


def _partitions(r: _Reader, flexible: bool) -> tuple[TopicPartitions, ...] | None:
    n = r.uvarint() - 1 if flexible else r.i32()
    if n < 0:
        return None  # Kafka reads any negative count of this nullable array as null
    out = []
    # an entry takes at least 3 bytes flexible (2 varints and a tag count), 6 bytes in v0
    for _ in range(r.fits(n, 3 if flexible else 6)):
        topic = r.sized_text(r.uvarint() - 1 if flexible else r.i16())
        ids = r.int32s(r.fits(r.uvarint() - 1 if flexible else r.i32(), 4))
        if flexible:
            r.skip_tagged_fields()
        out.append(TopicPartitions(topic, ids))
    return tuple(out)


def decode_value(data: bytes | bytearray | memoryview | None) -> TransactionLogValue | None:
    """The value of v0 or v1, or None for a tombstone (``data`` None)."""
    if data is None:
        return None
    r = _Reader(data)
    version = r.i16()
    if version not in VALUE_VERSIONS:
        raise TransactionLogFormatError(f"unknown transaction log value version {version}")
    flexible = version >= FLEXIBLE_VALUE_VERSION
    producer_id, epoch, timeout_ms, status = r.unpack(_HEAD)
    parts = _partitions(r, flexible)
    last_update, start = r.unpack(_TAIL)
    previous_id, next_id = NO_PRODUCER_ID, NO_PRODUCER_ID
    client_version = DEFAULT_CLIENT_TRANSACTION_VERSION
    if flexible:
        for _ in range(r.fits(r.uvarint(), 2)):
            tag = r.uvarint()
            field = r.take(r.uvarint())
            width = _TAG_WIDTHS.get(tag)
            if width is None:
                continue  # a tag from a newer Kafka
            if len(field) != width:
                raise TransactionLogFormatError(f"tag {tag} has {len(field)} bytes, not {width}")
            if tag == _TAG_PREVIOUS_PRODUCER_ID:
                previous_id = _I64.unpack(field)[0]
            elif tag == _TAG_NEXT_PRODUCER_ID:
                next_id = _I64.unpack(field)[0]
            else:
                client_version = _I16.unpack(field)[0]
    return TransactionLogValue(
        producer_id,
        epoch,
        timeout_ms,
        status,
        parts,
        last_update,
        start,
        previous_id,
        next_id,
        client_version,
    )
