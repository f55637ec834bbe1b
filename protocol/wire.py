"""Kafka's primitive wire types, for the hand-written fast paths (headers, Produce, Fetch).

=====================  ==========================================================
type                   encoding
=====================  ==========================================================
int8/16/32/64          big-endian two's complement
UNSIGNED_VARINT        7 bits a byte, low group first, high bit = more follows
STRING                 int16 length N, N UTF-8 bytes (-1 = null for NULLABLE)
COMPACT_STRING         UNSIGNED_VARINT N+1, N bytes (0 = null for NULLABLE)
BYTES / RECORDS        int32 length N, N bytes (-1 = null)
COMPACT_BYTES          UNSIGNED_VARINT N+1, N bytes (0 = null)
ARRAY                  int32 count N (-1 = null), N items
COMPACT_ARRAY          UNSIGNED_VARINT N+1 (0 = null), N items
UUID                   16 bytes
TAGGED_FIELDS          UNSIGNED_VARINT count, then per field: tag (UNSIGNED_VARINT),
                       size (UNSIGNED_VARINT), size bytes
=====================  ==========================================================

Readers take ``(buf, pos)`` and return ``(value, new_pos)``; on truncated or
impossible input they raise ``InvalidRequestError`` (never ``IndexError`` or
``struct.error``), with no correlation id: the caller adds it.

:class:`Cursor` reads the same types forward from one buffer, for the decoders of what is
stored or embedded rather than requested (coordinator records, the consumer protocol's
messages), each raising an error of its own.
"""

from __future__ import annotations

import struct
from typing import ClassVar

from protocol.errors import InvalidRequestError

Buffer = bytes | bytearray | memoryview

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")

# A varint longer than this cannot be a valid uint32 length or count.
_MAX_VARINT_BYTES = 5


def read_int16(buf: Buffer, pos: int) -> tuple[int, int]:
    """Read a big-endian int16."""
    if pos + 2 > len(buf):
        raise InvalidRequestError("truncated int16")
    return INT16.unpack_from(buf, pos)[0], pos + 2


def read_int32(buf: Buffer, pos: int) -> tuple[int, int]:
    """Read a big-endian int32."""
    if pos + 4 > len(buf):
        raise InvalidRequestError("truncated int32")
    return INT32.unpack_from(buf, pos)[0], pos + 4


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """Read an UNSIGNED_VARINT of at most 5 bytes (uint32)."""
    end = len(buf)
    if pos < end and buf[pos] < 0x80:  # one byte: nearly every length and count
        return buf[pos], pos + 1
    result = 0
    shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        if pos >= end:
            raise InvalidRequestError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise InvalidRequestError("varint longer than 5 bytes")


def write_uvarint(value: int) -> bytes:
    """Encode a non-negative int as an UNSIGNED_VARINT."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:  # (a fetched partition's records' size and the like: without the loop)
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_nullable_string(buf: Buffer, pos: int) -> tuple[str | None, int]:
    """Read a (legacy, int16-length) NULLABLE_STRING."""
    n, pos = read_int16(buf, pos)
    if n < 0:
        if n != -1:
            raise InvalidRequestError(f"negative string length {n}")
        return None, pos
    return _utf8(buf, pos, n)


def read_string(buf: Buffer, pos: int) -> tuple[str, int]:
    """Read a (legacy, int16-length) STRING; null is an error."""
    value, pos = read_nullable_string(buf, pos)
    if value is None:
        raise InvalidRequestError("null where a string is required")
    return value, pos


def read_compact_nullable_string(buf: Buffer, pos: int) -> tuple[str | None, int]:
    """Read a COMPACT_NULLABLE_STRING."""
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    return _utf8(buf, pos, n - 1)


def read_compact_string(buf: Buffer, pos: int) -> tuple[str, int]:
    """Read a COMPACT_STRING; null is an error."""
    value, pos = read_compact_nullable_string(buf, pos)
    if value is None:
        raise InvalidRequestError("null where a string is required")
    return value, pos


def _utf8(buf: Buffer, pos: int, n: int) -> tuple[str, int]:
    end = pos + n
    if end > len(buf):
        raise InvalidRequestError("truncated string")
    try:
        return str(buf[pos:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"string is not UTF-8: {e}") from None


def read_array_length(buf: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    """Read an ARRAY/COMPACT_ARRAY count; null arrays read as -1."""
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    n, pos = read_int32(buf, pos)
    if n < -1:
        raise InvalidRequestError(f"negative array length {n}")
    return n, pos


def skip_tagged_fields(buf: Buffer, pos: int) -> int:
    """Skip a TAGGED_FIELDS section (all tags treated as unknown); return the new pos."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise InvalidRequestError("truncated tagged field")
    return pos


def encode_array_length(n: int, flexible: bool) -> bytes:
    """An ARRAY/BYTES length (int32) or its compact form (uvarint N+1); n = -1 is null."""
    return write_uvarint(n + 1) if flexible else INT32.pack(n)


def encode_nullable_string(value: str | None) -> bytes:
    """Encode a (legacy, int16-length) NULLABLE_STRING."""
    if value is None:
        return INT16.pack(-1)
    data = value.encode()
    return INT16.pack(len(data)) + data


def encode_compact_nullable_string(value: str | None) -> bytes:
    """Encode a COMPACT_NULLABLE_STRING."""
    if value is None:
        return b"\x00"
    data = value.encode()
    return write_uvarint(len(data) + 1) + data


class Cursor:
    """A buffer read forward, field by field. Truncated or impossible input raises the class's
    ``error`` (a subclass names its decoder's), with the byte it was found at; never
    ``IndexError`` or ``struct.error``."""

    __slots__ = ("data", "pos")
    error: ClassVar[type[Exception]] = InvalidRequestError

    def __init__(self, data: Buffer) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def take(self, n: int) -> memoryview:
        """The next ``n`` bytes."""
        if n < 0 or n > len(self.data) - self.pos:
            raise self.error(
                f"truncated at byte {self.pos}: {n} bytes needed, {self.remaining()} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def i8(self) -> int:
        return int(INT8.unpack(self.take(1))[0])

    def i16(self) -> int:
        return int(INT16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(INT32.unpack(self.take(4))[0])

    def i64(self) -> int:
        return int(INT64.unpack(self.take(8))[0])

    def uvarint(self) -> int:
        """An UNSIGNED_VARINT of at most 5 bytes."""
        value = 0
        for i in range(_MAX_VARINT_BYTES):
            b = self.take(1)[0]
            value |= (b & 0x7F) << (7 * i)
            if not b & 0x80:
                return value
        raise self.error(f"unsigned varint longer than 5 bytes at byte {self.pos}")

    def utf8(self, n: int) -> str:
        """The next ``n`` bytes, as UTF-8."""
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"string is not UTF-8: {e}") from None

    def string(self) -> str | None:
        """A NULLABLE_STRING (int16 length, -1 for null)."""
        n = self.i16()
        return None if n == -1 else self.utf8(n)

    def text(self) -> str:
        """A STRING: null is an error."""
        at = self.pos
        value = self.string()
        if value is None:
            raise self.error(f"null string at byte {at} where one is required")
        return value

    def nullable_bytes(self) -> bytes | None:
        """A NULLABLE_BYTES (int32 length, -1 for null)."""
        n = self.i32()
        return None if n == -1 else bytes(self.take(n))

    def fits(self, n: int, item_size: int) -> int:
        """``n``, an array's count, if its items (each at least ``item_size`` bytes) fit the
        bytes left."""
        if n < 0:
            raise self.error(f"null array at byte {self.pos} where one is required")
        if n * item_size > self.remaining():
            raise self.error(
                f"array of {n} items does not fit the {self.remaining()} bytes left "
                f"at byte {self.pos}"
            )
        return n

    def count(self, item_size: int) -> int:
        """An ARRAY's int32 count (null is an error), checked with :meth:`fits`."""
        return self.fits(self.i32(), item_size)
