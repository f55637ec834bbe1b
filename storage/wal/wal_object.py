"""The object WAL's formats: WAL objects, epoch records and their keys; all integers big-endian.

A node's WAL objects live under ``<namespace>/wal/<node_id>/``::

    <namespace>/wal/<node_id>/<start offset, 20 digits>-<node epoch, 20 digits>   WAL object
    <namespace>/wal/<node_id>/epochs/<node epoch, 20 digits>                     epoch record

Zero padding makes key order the order of start offsets, so one listing of the prefix gives a
node's log in order. The epoch in the key keeps two incarnations of the node that write the
same start offset from overwriting each other.

A WAL object is a 40-byte header, then records in ``storage.wal.record``'s framing, packed: the
first at the object's start offset, each next one at its predecessor's next offset (no padding
records). Its end offset is ``start + records length``; the next object starts there.

======  ====  ===============================================================================
offset  size  field
======  ====  ===============================================================================
0       4     magic ``0x4F57414C`` ("OWAL")
4       4     node id (signed)
8       8     node epoch of the incarnation that wrote it
16      8     start offset: the WAL offset of its first record
24      8     records length: bytes of records after this header
32      4     reserved, 0
36      4     CRC32C of bytes 0..36
40      n     records
======  ====  ===============================================================================

An epoch record (36 bytes) is written by every incarnation of a node that opens its WAL, before
any of its appends, and again at every trim:

======  ====  ===============================================================================
offset  size  field
======  ====  ===============================================================================
0       4     magic ``0x4F574550`` ("OWEP")
4       4     node id (signed)
8       8     node epoch
16      8     start offset: where this incarnation's log begins (the end of what it recovered)
24      8     trim offset: every record before it is in object storage (recovery starts here)
32      4     CRC32C of bytes 0..32
======  ====  ===============================================================================
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import crc32c

from storage.wal import record
from storage.wal.errors import CorruptRecordError, CorruptWALError
from storage.wal.record import HEADER_SIZE, Buffer

OBJECT_MAGIC = 0x4F57414C
EPOCH_MAGIC = 0x4F574550

OBJECT_HEADER = struct.Struct(">IiQQQII")
OBJECT_HEADER_SIZE = OBJECT_HEADER.size
EPOCH_RECORD = struct.Struct(">IiQQQI")
EPOCH_RECORD_SIZE = EPOCH_RECORD.size
assert OBJECT_HEADER_SIZE == 40 and EPOCH_RECORD_SIZE == 36

_DIGITS = 20  # the most digits an unsigned 64-bit offset or epoch has
_OBJECT_NAME = re.compile(r"(\d{20})-(\d{20})")
_EPOCH_NAME = re.compile(r"epochs/(\d{20})")


# --- keys -----------------------------------------------------------------------------------


def node_prefix(namespace: str, node_id: int) -> str:
    """The key prefix under which every WAL object and epoch record of ``node_id`` lies."""
    return f"{namespace}/wal/{node_id}/"


def object_key(namespace: str, node_id: int, start_offset: int, epoch: int) -> str:
    """The key of the WAL object starting at ``start_offset``, written at node ``epoch``."""
    return f"{node_prefix(namespace, node_id)}{start_offset:0{_DIGITS}d}-{epoch:0{_DIGITS}d}"


def epoch_record_key(namespace: str, node_id: int, epoch: int) -> str:
    """The key of node ``epoch``'s epoch record."""
    return f"{node_prefix(namespace, node_id)}epochs/{epoch:0{_DIGITS}d}"


@dataclass(slots=True, frozen=True)
class ObjectName:
    """What a WAL object's key says: its start offset and the node epoch that wrote it."""

    start_offset: int
    epoch: int


def parse_object_key(prefix: str, key: str) -> ObjectName | None:
    """The start offset and epoch of the WAL object ``key`` listed under ``prefix``; None if the
    key names no WAL object (an epoch record, or something else)."""
    if not key.startswith(prefix):
        return None
    found = _OBJECT_NAME.fullmatch(key, len(prefix))
    if found is None:
        return None
    return ObjectName(int(found.group(1)), int(found.group(2)))


def parse_epoch_record_key(prefix: str, key: str) -> int | None:
    """The node epoch of the epoch record ``key`` listed under ``prefix``; None if it is none."""
    if not key.startswith(prefix):
        return None
    found = _EPOCH_NAME.fullmatch(key, len(prefix))
    return int(found.group(1)) if found is not None else None


# --- WAL objects ----------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ObjectHeader:
    """A decoded, validated WAL object header."""

    node_id: int
    epoch: int
    start_offset: int
    records_length: int

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.records_length


def encode_object_header(node_id: int, epoch: int, start_offset: int, records_length: int) -> bytes:
    """The 40-byte header of a WAL object whose records take ``records_length`` bytes."""
    covered = OBJECT_HEADER.pack(OBJECT_MAGIC, node_id, epoch, start_offset, records_length, 0, 0)
    covered = covered[:-4]
    return covered + crc32c.crc32c(covered).to_bytes(4, "big")


def encode_object(
    node_id: int, epoch: int, start_offset: int, bodies: Sequence[Sequence[Buffer]]
) -> list[Buffer]:
    """A whole WAL object of records with ``bodies`` (each a list of parts), the first at
    ``start_offset``: the header, then each record's header and its parts uncopied."""
    buffers: list[Buffer] = []
    offset = start_offset
    for parts in bodies:
        encoded = record.encode(offset, parts)
        buffers.extend(encoded)
        offset += sum(memoryview(b).nbytes for b in encoded)
    return [encode_object_header(node_id, epoch, start_offset, offset - start_offset), *buffers]


def decode_object_header(data: Buffer) -> ObjectHeader:
    """Decode and validate the header at the start of a WAL object; ``CorruptWALError`` if the
    bytes are no WAL object header."""
    view = memoryview(data).cast("B")
    if len(view) < OBJECT_HEADER_SIZE:
        raise CorruptWALError(f"WAL object of {len(view)} bytes has no complete header")
    magic, node_id, epoch, start, length, _reserved, crc = OBJECT_HEADER.unpack_from(view)
    if magic != OBJECT_MAGIC:
        raise CorruptWALError(f"bad WAL object magic 0x{magic:08x}")
    actual = crc32c.crc32c(view[: OBJECT_HEADER_SIZE - 4])
    if actual != crc:
        raise CorruptWALError(
            f"WAL object header CRC mismatch: stored 0x{crc:08x}, computed 0x{actual:08x}"
        )
    return ObjectHeader(node_id, epoch, start, length)


@dataclass(slots=True, frozen=True)
class ObjectRecord:
    """A record read from a WAL object: ``[offset, next_offset)`` and its body (a view)."""

    offset: int
    next_offset: int
    body: memoryview


def iter_records(
    header: ObjectHeader, data: Buffer, *, from_offset: int = 0
) -> Iterator[ObjectRecord]:
    """Yield the records of a WAL object (``data``: the whole object, header included) in
    order, skipping those before ``from_offset``.

    Raises ``CorruptRecordError`` at the first record that is torn, corrupted or reaches past
    the records length (the object is shorter than its header says, or was damaged), once the
    records before it have been yielded: the log is cut at the end of the last one.
    """
    view = memoryview(data).cast("B")
    stop = min(len(view), OBJECT_HEADER_SIZE + header.records_length)
    position = OBJECT_HEADER_SIZE
    offset = header.start_offset
    while offset < header.end_offset:
        room = header.end_offset - offset - HEADER_SIZE
        if room < 0:
            raise CorruptRecordError(
                record.SHORT_HEADER,
                f"{header.end_offset - offset} bytes left at offset {offset} of a WAL object",
            )
        head = record.decode_header(view[position:stop], offset, max_body_length=room)
        if head.is_padding:
            raise CorruptRecordError(record.BAD_PADDING, f"padding at offset {offset}")
        body_start = position + HEADER_SIZE
        body = view[body_start : min(stop, body_start + head.body_length)]
        record.verify_body(head, body)
        if offset >= from_offset:
            yield ObjectRecord(offset, head.next_offset, body)
        position = body_start + head.body_length
        offset = head.next_offset


def check_object(header: ObjectHeader, node_id: int, name: ObjectName) -> None:
    """``CorruptWALError`` unless the header says what the object's key and node say."""
    if (header.node_id, header.epoch, header.start_offset) != (
        node_id,
        name.epoch,
        name.start_offset,
    ):
        raise CorruptWALError(
            f"WAL object header (node {header.node_id}, epoch {header.epoch}, start "
            f"{header.start_offset}) does not match its key (node {node_id}, epoch "
            f"{name.epoch}, start {name.start_offset})"
        )


# --- epoch records --------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class EpochRecord:
    """Node ``epoch`` writes its log from ``start_offset`` on; records before ``trim_offset``
    are in object storage."""

    node_id: int
    epoch: int
    start_offset: int
    trim_offset: int


def encode_epoch_record(rec: EpochRecord) -> bytes:
    covered = EPOCH_RECORD.pack(
        EPOCH_MAGIC, rec.node_id, rec.epoch, rec.start_offset, rec.trim_offset, 0
    )[:-4]
    return covered + crc32c.crc32c(covered).to_bytes(4, "big")


def decode_epoch_record(data: Buffer) -> EpochRecord:
    """Decode and validate an epoch record; ``CorruptWALError`` if the bytes are none."""
    view = memoryview(data).cast("B")
    if len(view) != EPOCH_RECORD_SIZE:
        raise CorruptWALError(f"epoch record of {len(view)} bytes, expected {EPOCH_RECORD_SIZE}")
    magic, node_id, epoch, start, trim, crc = EPOCH_RECORD.unpack(view)
    if magic != EPOCH_MAGIC:
        raise CorruptWALError(f"bad epoch record magic 0x{magic:08x}")
    actual = crc32c.crc32c(view[: EPOCH_RECORD_SIZE - 4])
    if actual != crc:
        raise CorruptWALError(
            f"epoch record CRC mismatch: stored 0x{crc:08x}, computed 0x{actual:08x}"
        )
    return EpochRecord(node_id, epoch, start, trim)
