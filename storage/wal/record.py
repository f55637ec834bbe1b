"""The WAL record format: a 24-byte header followed by the body; all integers big-endian.

======  ====  ===============================================================================
offset  size  field
======  ====  ===============================================================================
0       4     magic: ``0x87654321`` for a record, ``0x76543210`` for padding (see below)
4       4     body length in bytes (unsigned)
8       8     logical offset of this record in the WAL (unsigned); checked on every read, so a
              record left over from an earlier lap of the ring can never be taken for a new one
16      4     CRC32C of the body (0 for padding)
20      4     CRC32C of bytes 0..20 of this header
24      n     body
======  ====  ===============================================================================

A record occupies ``24 + body length`` bytes and its successor starts right after it: records
are packed, not aligned to 4 KiB. AutoMQ aligns because it writes a raw block device with
O_DIRECT, which requires aligned offsets; this WAL writes a regular file through the page cache
and ``fdatasync``, where alignment buys nothing, while padding a typical ~1 KiB produce batch to
4 KiB would quadruple the bytes written per fsync and cut the usable ring to a quarter. Torn
writes are detected by the CRCs, not by block boundaries.

A record never wraps around the end of the ring. When the next record does not fit before the
end of the lap, the writer leaves the rest of the lap unused: if at least 24 bytes are left it
writes a *padding* header there, whose body length spans exactly to the end of the lap (the
body bytes are not written and not checked); if fewer are left, nothing is written and readers
skip them implicitly. Either way the next record starts at the next multiple of the capacity.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from storage.wal.errors import CorruptRecordError

RECORD_MAGIC = 0x87654321
PADDING_MAGIC = 0x76543210

HEADER = struct.Struct(">IIQII")
HEADER_SIZE = HEADER.size
_CRC_COVERED = struct.Struct(">IIQI")
assert HEADER_SIZE == 24 and _CRC_COVERED.size == 20

# Reasons carried by CorruptRecordError.reason; recovery logs them when it cuts the log.
SHORT_HEADER = "short header"
BAD_MAGIC = "bad magic"
HEADER_CRC_MISMATCH = "header CRC mismatch"
OFFSET_MISMATCH = "offset mismatch"
LENGTH_PAST_CAPACITY = "length past capacity"
BAD_PADDING = "bad padding"
SHORT_BODY = "short body"
BODY_CRC_MISMATCH = "body CRC mismatch"

Buffer = bytes | bytearray | memoryview


@dataclass(slots=True, frozen=True)
class RecordHeader:
    """A decoded, validated record header."""

    offset: int
    body_length: int
    body_crc: int
    is_padding: bool

    @property
    def size(self) -> int:
        """Bytes the record occupies in the ring, header included."""
        return HEADER_SIZE + self.body_length

    @property
    def next_offset(self) -> int:
        return self.offset + self.size


def record_size(body_length: int) -> int:
    """Bytes a record with a body of ``body_length`` bytes occupies in the ring."""
    return HEADER_SIZE + body_length


def body_crc(body_parts: Sequence[Buffer]) -> int:
    """CRC32C of the concatenation of ``body_parts``."""
    crc = 0
    for part in body_parts:
        crc = crc32c.crc32c(part, crc)
    return crc


def _encode_header(magic: int, offset: int, body_length: int, crc: int) -> bytes:
    covered = _CRC_COVERED.pack(magic, body_length, offset, crc)
    return covered + crc32c.crc32c(covered).to_bytes(4, "big")


def encode(offset: int, body_parts: Sequence[Buffer]) -> list[Buffer]:
    """Encode a record at logical ``offset``: the header, then the body parts uncopied.

    The result is meant for one vectored write; the caller must not mutate the parts until the
    write is done, or the stored body CRC will not match.
    """
    length = sum(memoryview(part).nbytes for part in body_parts)
    return [_encode_header(RECORD_MAGIC, offset, length, body_crc(body_parts)), *body_parts]


def encode_padding(offset: int, lap_end: int) -> bytes:
    """The padding header marking ``[offset, lap_end)`` unused; ``lap_end - offset >= 24``."""
    if lap_end - offset < HEADER_SIZE:
        raise ValueError(f"padding needs {HEADER_SIZE} bytes, {lap_end - offset} left in the lap")
    return _encode_header(PADDING_MAGIC, offset, lap_end - offset - HEADER_SIZE, 0)


def decode_header(
    buf: Buffer, expected_offset: int, *, max_body_length: int | None = None
) -> RecordHeader:
    """Decode and validate the record header at the start of ``buf``.

    Raises ``CorruptRecordError`` (reason: short header, bad magic, header CRC mismatch, offset
    mismatch, length past capacity) when the bytes are not a header written for
    ``expected_offset``. ``max_body_length`` is the most the body may take (the room left
    before the end of the lap).
    """
    view = memoryview(buf).cast("B")
    if len(view) < HEADER_SIZE:
        raise CorruptRecordError(SHORT_HEADER, f"{len(view)} bytes at offset {expected_offset}")
    magic, length, offset, crc, header_crc = HEADER.unpack_from(view)
    if magic not in (RECORD_MAGIC, PADDING_MAGIC):
        raise CorruptRecordError(BAD_MAGIC, f"0x{magic:08x} at offset {expected_offset}")
    actual_header_crc = crc32c.crc32c(view[: _CRC_COVERED.size])
    if actual_header_crc != header_crc:
        raise CorruptRecordError(
            HEADER_CRC_MISMATCH,
            f"stored 0x{header_crc:08x}, computed 0x{actual_header_crc:08x}"
            f" at offset {expected_offset}",
        )
    if offset != expected_offset:
        raise CorruptRecordError(
            OFFSET_MISMATCH,
            f"header says {offset}, expected {expected_offset}",
            found_offset=offset,
        )
    if max_body_length is not None and length > max_body_length:
        raise CorruptRecordError(
            LENGTH_PAST_CAPACITY,
            f"body length {length} at offset {offset} exceeds the {max_body_length} bytes"
            " left in the ring",
        )
    return RecordHeader(offset, length, crc, magic == PADDING_MAGIC)


def verify_body(header: RecordHeader, body: Buffer) -> None:
    """Check a record body against its header; raises ``CorruptRecordError`` if it differs."""
    view = memoryview(body).cast("B")
    if len(view) != header.body_length:
        raise CorruptRecordError(
            SHORT_BODY,
            f"{len(view)} of {header.body_length} bytes at offset {header.offset}",
        )
    actual = crc32c.crc32c(view)
    if actual != header.body_crc:
        raise CorruptRecordError(
            BODY_CRC_MISMATCH,
            f"stored 0x{header.body_crc:08x}, computed 0x{actual:08x} at offset {header.offset}",
        )
