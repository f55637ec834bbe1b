"""Control records: the transaction markers (COMMIT/ABORT) a control batch carries.

A transaction marker is a magic-v2 batch of one record with the *transactional* (0x10) and
*control* (0x20) attribute bits, the transaction's producer id and epoch, base sequence -1,
no compression and CREATE_TIME (Kafka's ``MemoryRecords.withEndTransactionMarker``). Its
record has no headers; key and value are:

=======================  =====  ==============================================
part                     bytes  fields
=======================  =====  ==============================================
control record key       4      version int16 (0), type int16
end transaction marker   6      version int16 (0), coordinator_epoch int32
=======================  =====  ==============================================

Control record types (Kafka's ``ControlRecordType``): 0 ABORT, 1 COMMIT; 2-6 are KRaft's
(leader change, snapshot header/footer, kraft version, voters). A reader maps any other type
to UNKNOWN and ignores the record; only ABORT and COMMIT are transaction markers.

Tolerance, as Kafka's readers (``ControlRecordType.parseTypeId``,
``EndTransactionMarker.deserializeValue``): a negative version is corrupt; a version above 0
is read as version 0 (later versions may only add fields), so bytes after the known fields are
ignored; a key shorter than 4 bytes or a value shorter than 6 is corrupt. Kafka reads the first
record of a control batch (an empty one is a marker the cleaner removed).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import NamedTuple

from protocol import record_batch
from protocol.record_batch import InvalidRecordBatchError
from protocol.records import Record, RecordInput, build_batch, parse_records

CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0
NO_SEQUENCE = -1

_KEY = struct.Struct(">hh")
_MARKER = struct.Struct(">hi")

assert _KEY.size == 4 and _MARKER.size == 6


class ControlRecordType(enum.IntEnum):
    """Kafka's control record types (the key's int16 ``type``)."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


class InvalidControlRecordError(InvalidRecordBatchError):
    """A control record key, marker value or marker batch that does not parse."""


class TransactionMarker(NamedTuple):
    """What an end transaction marker says: commit or abort, and by which coordinator epoch."""

    is_commit: bool
    coordinator_epoch: int


def encode_control_key(control_type: int) -> bytes:
    """The 4-byte key of a control record of ``control_type`` (a ``ControlRecordType``)."""
    try:
        return _KEY.pack(CONTROL_KEY_VERSION, control_type)
    except struct.error as e:
        raise InvalidControlRecordError(f"control type {control_type}: {e}") from None


def decode_control_key(key: bytes | bytearray | memoryview | None) -> int:
    """The key's control type id, known to ``ControlRecordType`` or not (Kafka's UNKNOWN)."""
    if key is None or len(key) < _KEY.size:
        raise InvalidControlRecordError(
            f"control record key needs {_KEY.size} bytes, found {0 if key is None else len(key)}"
        )
    version, control_type = _KEY.unpack_from(key)
    if version < 0:
        raise InvalidControlRecordError(f"control record key version {version} is negative")
    return int(control_type)


def encode_end_txn_marker(coordinator_epoch: int) -> bytes:
    """The 6-byte value of a transaction marker."""
    try:
        return _MARKER.pack(END_TXN_MARKER_VERSION, coordinator_epoch)
    except struct.error as e:
        raise InvalidControlRecordError(f"coordinator epoch {coordinator_epoch}: {e}") from None


def decode_end_txn_marker(value: bytes | bytearray | memoryview | None) -> int:
    """The coordinator epoch of a transaction marker's value."""
    if value is None or len(value) < _MARKER.size:
        raise InvalidControlRecordError(
            f"end transaction marker needs {_MARKER.size} bytes, "
            f"found {0 if value is None else len(value)}"
        )
    version, coordinator_epoch = _MARKER.unpack_from(value)
    if version < 0:
        raise InvalidControlRecordError(f"end transaction marker version {version} is negative")
    return int(coordinator_epoch)


def decode_marker(
    key: bytes | bytearray | memoryview | None, value: bytes | bytearray | memoryview | None
) -> TransactionMarker:
    """The marker in one record of a control batch (``InvalidControlRecordError`` when its
    type is not ABORT or COMMIT: a KRaft or unknown control record is no marker)."""
    control_type = decode_control_key(key)
    if control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
        raise InvalidControlRecordError(f"control type {control_type} is not a transaction marker")
    return TransactionMarker(control_type == ControlRecordType.COMMIT, decode_end_txn_marker(value))


def build_marker_batch(
    commit: bool,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytearray:
    """The one-record control batch Kafka appends to end a transaction on a partition."""
    control_type = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    record = RecordInput(
        value=encode_end_txn_marker(coordinator_epoch),
        key=encode_control_key(control_type),
        timestamp=timestamp_ms,
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        is_transactional=True,
        is_control=True,
    )


def parse_marker(
    batch: bytes | bytearray | memoryview, *, check_crc: bool = True
) -> TransactionMarker:
    """The marker of one whole control batch (its first record, as Kafka reads it).

    Raises ``InvalidControlRecordError`` for a batch that is malformed, not a transactional
    control batch, empty, or whose first record is not a transaction marker.
    """
    try:
        header = record_batch.parse_header(batch)
        records: Sequence[Record] = parse_records(batch, check_crc=check_crc)
    except InvalidControlRecordError:
        raise
    except InvalidRecordBatchError as e:
        raise InvalidControlRecordError(str(e)) from None
    if not (header.is_control and header.is_transactional):
        raise InvalidControlRecordError("not a transactional control batch")
    if not records:
        raise InvalidControlRecordError("control batch holds no record")
    return decode_marker(records[0].key, records[0].value)
