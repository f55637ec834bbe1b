"""The WAL file header: two copies, each in its own 4 KiB slot at file positions 0 and 4096.

Each copy (60 bytes, big-endian, rest of the slot zero)::

    ======  ====  =========================================================================
    offset  size  field
    ======  ====  =========================================================================
    0       4     magic ``0x414D5157`` ("AMQW")
    4       4     format version (1)
    8       8     generation: +1 on every header write; the valid copy with the highest wins
    16      8     capacity: bytes of record space (the ring), fixed at creation
    24      8     trim offset: records before it are uploaded and may be overwritten;
                  recovery starts here
    32      8     flushed offset (hint): the durable end of the log when the header was
                  written; exact after a clean shutdown
    40      8     window: the most bytes the writer may have written past the last fsync, so
                  recovery knows how far a torn tail can reach
    48      4     node id (signed)
    52      4     shutdown clean flag: 1 after ``close(clean=True)``, set to 0 on open
    56      4     CRC32C of bytes 0..56
    ======  ====  =========================================================================

Generation ``g`` is written to slot ``g % 2``, so consecutive writes alternate and a write torn
by a crash only ever damages the older copy; the newest durable one survives in the other slot.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from storage.wal.errors import CorruptWALError

HEADER_MAGIC = 0x414D5157
FORMAT_VERSION = 1
SLOT_SIZE = 4096
SLOT_COUNT = 2
HEADER_AREA_SIZE = SLOT_SIZE * SLOT_COUNT  # the ring starts right after both slots

_BODY = struct.Struct(">IIQQQQQiI")
_CRC = struct.Struct(">I")
ENCODED_SIZE = _BODY.size + _CRC.size
assert ENCODED_SIZE == 60


@dataclass(slots=True, frozen=True)
class WALHeader:
    """One decoded copy of the WAL header."""

    generation: int
    capacity: int
    trim_offset: int
    flushed_offset: int
    window: int
    node_id: int
    shutdown_clean: bool
    format_version: int = FORMAT_VERSION

    @property
    def slot(self) -> int:
        """Which slot (0 or 1) this generation is written to."""
        return self.generation % SLOT_COUNT

    @property
    def position(self) -> int:
        """File position of this generation's slot."""
        return self.slot * SLOT_SIZE


def encode(header: WALHeader) -> bytes:
    """The bytes of one header copy (``ENCODED_SIZE`` long)."""
    body = _BODY.pack(
        HEADER_MAGIC,
        header.format_version,
        header.generation,
        header.capacity,
        header.trim_offset,
        header.flushed_offset,
        header.window,
        header.node_id,
        1 if header.shutdown_clean else 0,
    )
    return body + _CRC.pack(crc32c.crc32c(body))


def decode(buf: bytes | bytearray | memoryview) -> WALHeader:
    """Decode one header copy; raises ``CorruptWALError`` saying what is wrong with it."""
    view = memoryview(buf).cast("B")
    if len(view) < ENCODED_SIZE:
        raise CorruptWALError(f"WAL header: {len(view)} bytes, need {ENCODED_SIZE}")
    (
        magic,
        version,
        generation,
        capacity,
        trim_offset,
        flushed_offset,
        window,
        node_id,
        clean,
    ) = _BODY.unpack_from(view)
    if magic != HEADER_MAGIC:
        raise CorruptWALError(f"WAL header: bad magic 0x{magic:08x}")
    (stored_crc,) = _CRC.unpack_from(view, _BODY.size)
    actual_crc = crc32c.crc32c(view[: _BODY.size])
    if stored_crc != actual_crc:
        raise CorruptWALError(
            f"WAL header: CRC mismatch (stored 0x{stored_crc:08x}, computed 0x{actual_crc:08x})"
        )
    if version != FORMAT_VERSION:
        raise CorruptWALError(
            f"WAL header: format version {version} is not supported (only {FORMAT_VERSION})"
        )
    if capacity <= 0 or clean not in (0, 1):
        raise CorruptWALError(f"WAL header: invalid capacity {capacity} or clean flag {clean}")
    return WALHeader(
        generation=generation,
        capacity=capacity,
        trim_offset=trim_offset,
        flushed_offset=flushed_offset,
        window=window,
        node_id=node_id,
        shutdown_clean=clean == 1,
        format_version=version,
    )


def choose(copies: Sequence[bytes | bytearray | memoryview]) -> tuple[WALHeader, list[str]]:
    """The newest valid copy among the slots' bytes, with a note for each invalid copy.

    Raises ``CorruptWALError`` naming every copy's problem when none is valid.
    """
    best: WALHeader | None = None
    problems: list[str] = []
    for slot, raw in enumerate(copies):
        try:
            decoded = decode(raw)
        except CorruptWALError as exc:
            problems.append(f"copy {slot}: {exc}")
            continue
        if decoded.slot != slot:
            # A copy is only ever written to its generation's slot; anything else is garbage
            # that happens to check out, e.g. a whole-slot copy made by hand.
            problems.append(
                f"copy {slot}: generation {decoded.generation} belongs in the other slot"
            )
            continue
        if best is None or decoded.generation > best.generation:
            best = decoded
    if best is None:
        raise CorruptWALError("no valid WAL header copy: " + "; ".join(problems))
    return best, problems
