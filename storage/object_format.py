"""The S3 object format shared by Stream Set Objects and Stream Objects (AutoMQ's layout).

An object is ``data blocks | index block | footer``; all integers big-endian.

Data block (one stream, contiguous offsets)::

    magic 0x5A (1) | flag 0x02 (1) | recordCount (4) | dataLength (4) | StreamRecordBatch...

``dataLength`` excludes the 10-byte header; ``recordCount`` counts StreamRecordBatches.

Index block: one 36-byte ``DataBlockIndex`` per data block, sorted by (streamId, startOffset)::

    streamId (8) | startOffset (8) | endOffsetDelta (4) | recordCount (4)
    | blockStartPosition (8) | blockSize (4)

``blockSize`` includes the block header.

Footer, 48 bytes::

    indexStartPosition (8) | indexBlockLength (4) | 28 zero bytes | magic 0x88e241b785f4cff7 (8)

Object key: ``reverse("%08x" % objectId) + "/" + namespace + "/" + objectId`` with namespace
``_kafka_<clusterId>``, spreading keys over prefixes.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from storage import stream_record_batch
from storage.stream_record_batch import CorruptRecordError, StreamRecordBatch

BLOCK_MAGIC = 0x5A
BLOCK_FLAG = 0x02
BLOCK_HEADER = struct.Struct(">BBii")
BLOCK_HEADER_SIZE = BLOCK_HEADER.size  # 10

INDEX_ENTRY = struct.Struct(">qqiiqi")
INDEX_ENTRY_SIZE = INDEX_ENTRY.size  # 36

FOOTER_MAGIC = 0x88E241B785F4CFF7
FOOTER = struct.Struct(">qi28xQ")
FOOTER_SIZE = FOOTER.size  # 48

assert (BLOCK_HEADER_SIZE, INDEX_ENTRY_SIZE, FOOTER_SIZE) == (10, 36, 48)


class CorruptObjectError(ValueError):
    """Raised when bytes read from an object do not follow the object format."""


@dataclass(slots=True, frozen=True)
class DataBlockIndex:
    """Where one data block lies and which stream offsets it holds."""

    stream_id: int
    start_offset: int
    end_offset_delta: int
    record_count: int
    start_position: int
    size: int

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.end_offset_delta

    @property
    def end_position(self) -> int:
        return self.start_position + self.size


@dataclass(slots=True, frozen=True)
class Footer:
    index_start_position: int
    index_block_length: int


@dataclass(slots=True, frozen=True)
class StreamOffsetRange:
    """A stream's offsets ``[start_offset, end_offset)`` inside one object."""

    stream_id: int
    start_offset: int
    end_offset: int

    def __str__(self) -> str:
        return f"{self.stream_id}:{self.start_offset}-{self.end_offset}"


def object_key(namespace: str, object_id: int) -> str:
    """The object's key, e.g. ``object_key("_kafka_X", 78) == "e4000000/_kafka_X/78"``."""
    return f"{object_id:08x}"[::-1] + "/" + namespace + "/" + str(object_id)


def namespace_for_cluster(cluster_id: str) -> str:
    return f"_kafka_{cluster_id}"


def object_id_from_key(key: str) -> int:
    """The object id at the end of a key made by :func:`object_key`."""
    try:
        return int(key.rsplit("/", 1)[-1])
    except ValueError:
        raise ValueError(f"not an object key: {key!r}") from None


# -- data blocks -------------------------------------------------------------------------------


def encode_block_header(record_count: int, data_length: int) -> bytes:
    return BLOCK_HEADER.pack(BLOCK_MAGIC, BLOCK_FLAG, record_count, data_length)


def decode_block(buf: bytes | memoryview, pos: int = 0) -> tuple[list[StreamRecordBatch], int]:
    """Decode the data block at ``pos``; return its batches and the position after it."""
    view = memoryview(buf)
    if len(view) - pos < BLOCK_HEADER_SIZE:
        raise CorruptObjectError(f"truncated data block header at {pos}")
    magic, _flag, record_count, data_length = BLOCK_HEADER.unpack_from(view, pos)
    if magic != BLOCK_MAGIC:
        raise CorruptObjectError(f"bad data block magic 0x{magic:02x} at {pos}")
    start = pos + BLOCK_HEADER_SIZE
    end = start + data_length
    if data_length < 0 or end > len(view):
        raise CorruptObjectError(
            f"truncated data block at {pos}: needs {data_length} bytes, {len(view) - start} left"
        )
    try:
        batches = stream_record_batch.decode_all(view[start:end])
    except CorruptRecordError as e:
        raise CorruptObjectError(f"corrupt data block at {pos}: {e}") from e
    if len(batches) != record_count:
        raise CorruptObjectError(
            f"data block at {pos} says {record_count} records but holds {len(batches)}"
        )
    return batches, end


def check_block(buf: bytes | memoryview, entry: DataBlockIndex) -> None:
    """Check a data block read from object storage against its index entry: the header's magic
    and length, and the stream of its first batch. Cheap: the batches are parsed when read."""
    view = memoryview(buf)
    if len(view) != entry.size or len(view) < BLOCK_HEADER_SIZE:
        raise CorruptObjectError(
            f"data block at {entry.start_position}: {len(view)} bytes, the index says {entry.size}"
        )
    magic, _flag, _count, data_length = BLOCK_HEADER.unpack_from(view, 0)
    if magic != BLOCK_MAGIC or data_length != entry.size - BLOCK_HEADER_SIZE:
        raise CorruptObjectError(
            f"data block at {entry.start_position} mismatches its index entry "
            f"(magic 0x{magic:02x}, data length {data_length})"
        )
    if data_length >= stream_record_batch.HEADER_SIZE:
        stream_id = stream_record_batch.HEADER.unpack_from(view, BLOCK_HEADER_SIZE)[1]
        if stream_id != entry.stream_id:
            raise CorruptObjectError(
                f"data block at {entry.start_position} holds stream {stream_id}, "
                f"the index says {entry.stream_id}"
            )


def block_batches(
    buf: bytes | memoryview, start_offset: int, end_offset: int, max_bytes: int
) -> list[StreamRecordBatch]:
    """The batches of one data block from the one holding ``start_offset``, none starting at or
    after ``end_offset`` (-1 = no bound), until their sizes reach ``max_bytes`` (at least one).

    Headers before ``start_offset`` are only stepped over, so a read that needs the end of a
    block costs no objects for its beginning. Payloads are zero-copy views of ``buf``.
    """
    view = memoryview(buf)
    header = stream_record_batch.HEADER
    pos = BLOCK_HEADER_SIZE
    end = len(view)
    out: list[StreamRecordBatch] = []
    size = 0
    while pos < end:
        if end - pos < stream_record_batch.HEADER_SIZE:
            raise CorruptObjectError(f"truncated StreamRecordBatch header in a data block at {pos}")
        magic, stream_id, epoch, base, count, length = header.unpack_from(view, pos)
        nxt = pos + stream_record_batch.HEADER_SIZE + length
        if magic != stream_record_batch.MAGIC or length < 0 or count < 0 or nxt > end:
            raise CorruptObjectError(f"corrupt StreamRecordBatch in a data block at {pos}")
        if base + count > start_offset:
            if (end_offset >= 0 and base >= end_offset) or (out and size >= max_bytes):
                break
            out.append(
                StreamRecordBatch(
                    stream_id, epoch, base, count, view[pos + stream_record_batch.HEADER_SIZE : nxt]
                )
            )
            size += nxt - pos
        pos = nxt
    return out


# -- index block -------------------------------------------------------------------------------


def encode_index(entries: list[DataBlockIndex]) -> bytes:
    return b"".join(
        INDEX_ENTRY.pack(
            e.stream_id,
            e.start_offset,
            e.end_offset_delta,
            e.record_count,
            e.start_position,
            e.size,
        )
        for e in entries
    )


def decode_index(buf: bytes | memoryview) -> list[DataBlockIndex]:
    if len(buf) % INDEX_ENTRY_SIZE:
        raise CorruptObjectError(
            f"index block length {len(buf)} is not a multiple of {INDEX_ENTRY_SIZE}"
        )
    return [DataBlockIndex(*fields) for fields in INDEX_ENTRY.iter_unpack(buf)]


# -- footer ------------------------------------------------------------------------------------


def encode_footer(footer: Footer) -> bytes:
    return FOOTER.pack(footer.index_start_position, footer.index_block_length, FOOTER_MAGIC)


def decode_footer(buf: bytes | memoryview, object_size: int | None = None) -> Footer:
    """Decode the 48-byte footer; with ``object_size``, also check the index lies inside."""
    if len(buf) != FOOTER_SIZE:
        raise CorruptObjectError(f"footer must be {FOOTER_SIZE} bytes, got {len(buf)}")
    index_pos, index_len, magic = FOOTER.unpack(buf)
    if magic != FOOTER_MAGIC:
        raise CorruptObjectError(f"bad footer magic 0x{magic:016x}")
    if index_pos < 0 or index_len < 0 or index_len % INDEX_ENTRY_SIZE:
        raise CorruptObjectError(f"bad footer: index at {index_pos}, length {index_len}")
    if object_size is not None and index_pos + index_len + FOOTER_SIZE != object_size:
        raise CorruptObjectError(
            f"footer places index at {index_pos}+{index_len}, object size is {object_size}"
        )
    return Footer(index_pos, index_len)


# -- lookups over a decoded index ----------------------------------------------------------------


def find_blocks(
    index: list[DataBlockIndex], stream_id: int, start_offset: int, end_offset: int
) -> list[DataBlockIndex]:
    """Blocks of ``stream_id`` overlapping ``[start_offset, end_offset)`` (``-1`` = no end).

    Binary search on the (streamId, startOffset) order, then a scan while blocks overlap.
    """
    i = bisect.bisect_right(index, (stream_id, start_offset), key=_stream_end)
    out: list[DataBlockIndex] = []
    while i < len(index):
        e = index[i]
        if e.stream_id != stream_id or (end_offset >= 0 and e.start_offset >= end_offset):
            break
        out.append(e)
        i += 1
    return out


def _stream_end(e: DataBlockIndex) -> tuple[int, int]:
    return (e.stream_id, e.end_offset)


def stream_ranges(index: list[DataBlockIndex]) -> list[StreamOffsetRange]:
    """Merge consecutive blocks of each stream into the object's per-stream offset ranges."""
    out: list[StreamOffsetRange] = []
    for e in index:
        last = out[-1] if out else None
        if last is not None and last.stream_id == e.stream_id and last.end_offset == e.start_offset:
            out[-1] = StreamOffsetRange(e.stream_id, last.start_offset, e.end_offset)
        else:
            out.append(StreamOffsetRange(e.stream_id, e.start_offset, e.end_offset))
    return out
