"""Kafka record batch (magic v2) header: a view over the first 61 bytes, no record parsing.

A Produce or Fetch ``records`` field is a sequence of such batches, back to back.
baseOffset and partitionLeaderEpoch lie before the CRC'd range, so the broker assigns
them in place without re-checksumming. Legacy message sets (magic 0/1: offset int64,
size int32, crc int32, magic int8 at the same offset 16) are recognised and refused.
Record-level parsing and building (compression) lives in ``protocol.records``.

With attribute bit 6 set (KIP-534, written only by the log cleaner), baseTimestamp holds the
batch's *delete horizon*: the time after which the cleaner may drop its tombstones and its
transaction marker; record timestamps stay ``baseTimestamp + timestampDelta``.

======  ====================  =====
offset  field                 bytes
======  ====================  =====
0       baseOffset            8
8       batchLength           4   (bytes after this field)
12      partitionLeaderEpoch  4
16      magic                 1   (2)
17      crc                   4   (CRC-32C of attributes..end)
21      attributes            2   (bits 0-2 codec, 3 timestamp type, 4 txn, 5 control,
                                   6 delete horizon)
23      lastOffsetDelta       4
27      baseTimestamp         8
35      maxTimestamp          8
43      producerId            8
51      producerEpoch         2
53      baseSequence          4
57      recordsCount          4
61      records
======  ====================  =====
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import crc32c

from protocol.errors import ProtocolError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
CRC_START = 21
MAGIC_OFFSET = 16
LOG_OVERHEAD = 12  # baseOffset + batchLength
BATCH_LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")

COMPRESSION = {0: "NONE", 1: "GZIP", 2: "SNAPPY", 3: "LZ4", 4: "ZSTD"}

assert HEADER_SIZE == 61


class InvalidRecordBatchError(ProtocolError, ValueError):
    """Bytes that are not a well-formed magic-v2 record batch."""


class InvalidRecordsError(InvalidRecordBatchError):
    """A batch whose header and CRC are sound but whose records are not: they do not
    decompress, or do not parse (Kafka's InvalidRecordException, INVALID_RECORD)."""


class LegacyMessageSetError(InvalidRecordBatchError):
    """A magic 0/1 message set: this broker stores only magic-v2 batches."""

    def __init__(self, magic: int) -> None:
        super().__init__(
            f"legacy message format (magic {magic}) is not supported; "
            "the client must send record batches (magic 2, Kafka >= 0.11)"
        )
        self.magic = magic


class RecordBatchHeader(NamedTuple):
    """A batch's fixed header, as ``HEADER`` unpacks it (a tuple: made for every batch a
    Produce carries, where a frozen dataclass's field-by-field ``__init__`` cost 3-4 times
    as much)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> str:
        return COMPRESSION.get(self.attributes & 0x07, f"UNKNOWN({self.attributes & 0x07})")

    @property
    def timestamp_type(self) -> str:
        return "LOG_APPEND_TIME" if self.attributes & 0x08 else "CREATE_TIME"

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The delete horizon a log cleaner put in baseTimestamp (KIP-534), if any."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> RecordBatchHeader:
    """Decode the header at ``pos``; checks size and magic, not the CRC."""
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidRecordBatchError(f"record batch header needs {HEADER_SIZE} bytes")
    header = RecordBatchHeader(*HEADER.unpack_from(buf, pos))
    if header.magic in (0, 1):
        raise LegacyMessageSetError(header.magic)
    if header.magic != 2:
        raise InvalidRecordBatchError(f"unsupported record batch magic {header.magic}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatchError(f"record batch length {header.batch_length} is too small")
    return header


def crc_is_valid(
    buf: bytes | bytearray | memoryview, header: RecordBatchHeader, pos: int = 0
) -> bool:
    """True when the stored CRC-32C matches attributes..end of the batch at ``pos``."""
    end = pos + header.size
    if end > len(buf):
        return False
    return crc32c.crc32c(memoryview(buf)[pos + CRC_START : end]) == header.crc


def looks_like_batch(buf: bytes | bytearray | memoryview) -> bool:
    """True when ``buf`` is exactly one magic-v2 batch (by length and magic)."""
    if len(buf) < HEADER_SIZE or buf[MAGIC_OFFSET] != 2:
        return False
    (length,) = struct.unpack_from(">i", buf, 8)
    return bool(length + LOG_OVERHEAD == len(buf))


def validate_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    from_producer: bool = True,
    header: RecordBatchHeader | None = None,
) -> RecordBatchHeader:
    """Check the batch at ``pos``: header, size within ``buf``, CRC, record count.

    A producer's batch must have ``recordsCount == lastOffsetDelta + 1 > 0`` (as Kafka's
    LogValidator requires); a stored batch (``from_producer=False``, e.g. after
    compaction) may hold fewer records than its offset range. ``header``: the batch's
    header as ``parse_header`` already read it (not read again).
    """
    if header is None:
        header = parse_header(buf, pos)
    if pos + header.size > len(buf):
        raise InvalidRecordBatchError(
            f"record batch of {header.size} bytes runs past the end ({len(buf) - pos} left)"
        )
    if not crc_is_valid(buf, header, pos):
        raise InvalidRecordBatchError("record batch CRC-32C mismatch")
    count, span = header.records_count, header.last_offset_delta + 1
    if from_producer:  # INVALID_RECORD, as Kafka's LogValidator.validateBatch
        if span <= 0:
            raise InvalidRecordsError(
                f"Batch has an invalid offset range: [0, {header.last_offset_delta}]"
            )
        if count <= 0:
            raise InvalidRecordsError(f"Invalid reported count for record batch: {count}")
        if count != span:
            raise InvalidRecordsError(
                f"Inconsistent batch offset range [0, {header.last_offset_delta}] and record "
                f"count {count}"
            )
    elif count < 0 or span <= 0 or count > span:
        raise InvalidRecordBatchError(
            f"record count {count} is impossible for lastOffsetDelta {header.last_offset_delta}"
        )
    return header


def iter_batches(
    records: bytes | bytearray | memoryview,
) -> Iterator[tuple[RecordBatchHeader, memoryview]]:
    """Split a ``records`` field into its batches: (header, view of the whole batch).

    Checks framing only (header, sizes); run ``validate_batch`` for CRC and counts.
    A trailing partial batch is an error (a producer never sends one).
    """
    view = memoryview(records)
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < LOG_OVERHEAD + 5:
            raise InvalidRecordBatchError(f"{end - pos} trailing bytes are not a record batch")
        magic = view[pos + MAGIC_OFFSET]
        if magic in (0, 1):
            raise LegacyMessageSetError(magic)
        header = parse_header(view, pos)
        stop = pos + header.size
        if stop > end:
            raise InvalidRecordBatchError(
                f"record batch of {header.size} bytes runs past the end ({end - pos} left)"
            )
        yield header, view[pos:stop]
        pos = stop


def assign_offsets(
    buf: bytearray | memoryview,
    base_offset: int,
    partition_leader_epoch: int | None = None,
    pos: int = 0,
) -> None:
    """Write baseOffset (and partitionLeaderEpoch) into the writable batch at ``pos``.

    Both fields precede the CRC'd range, so the CRC stays valid.
    """
    _INT64.pack_into(buf, pos, base_offset)
    if partition_leader_epoch is not None:
        _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_log_append_time(buf: bytearray | memoryview, timestamp_ms: int, pos: int = 0) -> None:
    """Stamp the writable batch at ``pos`` with the broker's time (a LogAppendTime topic):
    the timestamp-type bit set, maxTimestamp the append time, the CRC rewritten. Readers then
    take maxTimestamp as every record's timestamp; the records stay as they are."""
    (attributes,) = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_BIT)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    rewrite_crc(buf, pos)


def rewrite_crc(buf: bytearray | memoryview, pos: int = 0) -> int:
    """Recompute and store the CRC of the writable batch at ``pos`` (after editing
    attributes or later fields); return the new CRC."""
    (length,) = _INT32.unpack_from(buf, pos + BATCH_LENGTH_OFFSET)
    end = pos + LOG_OVERHEAD + length
    if length < HEADER_SIZE - LOG_OVERHEAD or end > len(buf):
        raise InvalidRecordBatchError("record batch length does not fit the buffer")
    crc: int = crc32c.crc32c(memoryview(buf)[pos + CRC_START : end])
    struct.pack_into(">I", buf, pos + 17, crc)
    return crc
