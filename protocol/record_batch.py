"""Kafka record batch (magic v2) header: a view over the first 61 bytes, no record parsing.

======  ====================  =====
offset  field                 bytes
======  ====================  =====
0       baseOffset            8
8       batchLength           4   (bytes after this field)
12      partitionLeaderEpoch  4
16      magic                 1   (2)
17      crc                   4   (CRC-32C of attributes..end)
21      attributes            2   (bits 0-2 codec, 3 timestamp type, 4 txn, 5 control)
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
from dataclasses import dataclass

import crc32c

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
CRC_START = 21
MAGIC_OFFSET = 16
LOG_OVERHEAD = 12  # baseOffset + batchLength

COMPRESSION = {0: "NONE", 1: "GZIP", 2: "SNAPPY", 3: "LZ4", 4: "ZSTD"}

assert HEADER_SIZE == 61


class InvalidRecordBatchError(ValueError):
    """Bytes that are not a well-formed magic-v2 record batch header."""


@dataclass(slots=True, frozen=True)
class RecordBatchHeader:
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
        return bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def parse_header(buf: bytes | memoryview, pos: int = 0) -> RecordBatchHeader:
    """Decode the header at ``pos``; checks size and magic, not the CRC."""
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidRecordBatchError(f"record batch header needs {HEADER_SIZE} bytes")
    header = RecordBatchHeader(*HEADER.unpack_from(buf, pos))
    if header.magic != 2:
        raise InvalidRecordBatchError(f"unsupported record batch magic {header.magic}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatchError(f"record batch length {header.batch_length} is too small")
    return header


def crc_is_valid(buf: bytes | memoryview, header: RecordBatchHeader, pos: int = 0) -> bool:
    end = pos + header.size
    if end > len(buf):
        return False
    return crc32c.crc32c(memoryview(buf)[pos + CRC_START : end]) == header.crc


def looks_like_batch(buf: bytes | memoryview) -> bool:
    """True when ``buf`` is exactly one magic-v2 batch (by length and magic)."""
    if len(buf) < HEADER_SIZE or buf[MAGIC_OFFSET] != 2:
        return False
    (length,) = struct.unpack_from(">i", buf, 8)
    return bool(length + LOG_OVERHEAD == len(buf))
