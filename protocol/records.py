"""Record-level parsing and building of magic-v2 batches, through ``aiokafka.record``.

Used where the broker must look inside batches (compacted topics, time indexes,
internal topics, tests); the Produce/Fetch hot paths never come here.

Record, inside a batch's (possibly compressed) records section:

=================  ==========================================================
field              type
=================  ==========================================================
length             varint (zigzag): bytes of the rest of the record
attributes         int8 (unused)
timestampDelta     varlong, ms from the batch's baseTimestamp
offsetDelta        varint, from the batch's baseOffset
key                varint length (-1 = null), bytes
value              varint length (-1 = null), bytes
headers            varint count, then (key: varint length + UTF-8, value: varint
                   length (-1 = null) + bytes)
=================  ==========================================================

Timestamps are kept in milliseconds (kio's record reader truncates them to seconds,
which is why it is not used). Codecs: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

``build_batch`` makes a producer's batch (offsets ``0..n-1`` from the base, through aiokafka's
builder); ``encode_batch`` writes any stored batch field by field, as the log cleaner needs
(records at their own offsets with gaps, a kept lastOffsetDelta, baseTimestamp set to a delete
horizon so timestamp deltas may be negative, header-only empty batches).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import cramjam
from aiokafka import codec  # type: ignore[import-untyped]
from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)
from aiokafka.record.util import decode_varint  # type: ignore[import-untyped]

from protocol import record_batch
from protocol.record_batch import InvalidRecordBatchError, InvalidRecordsError

_TIMESTAMP_TYPE_BIT = 0x08
_CONTROL_BIT = 0x20
_MAX_BATCH_SIZE = 1 << 30

Header = tuple[str, bytes | None]


class Compression(enum.IntEnum):
    """Codec ids of the batch attributes' low 3 bits."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


@dataclass(slots=True, frozen=True)
class Record:
    """One record: absolute offset, timestamp in ms, key, value, headers."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(slots=True, frozen=True)
class RecordInput:
    """A record to put in a new batch; ``timestamp`` in ms."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[Header] = field(default_factory=tuple)
    timestamp: int = 0


def parse_records(batch: bytes | bytearray | memoryview, *, check_crc: bool = True) -> list[Record]:
    """Decompress and parse every record of one batch (exactly one batch in ``batch``).

    Raises ``InvalidRecordBatchError`` for any malformed header, CRC, codec stream or
    record (aiokafka's and the codecs' own exceptions never leak).
    """
    header = (
        record_batch.validate_batch(batch, from_producer=False)
        if check_crc
        else record_batch.parse_header(batch)
    )
    if header.size != len(batch):
        raise InvalidRecordBatchError(
            f"buffer holds {len(batch)} bytes, batch says {header.size}; use iter_batches"
        )
    if header.attributes & 0x07 not in Compression._value2member_map_:
        raise InvalidRecordBatchError(f"unknown compression codec {header.attributes & 0x07}")
    try:
        parsed = DefaultRecordBatch(bytes(batch))
        out = [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]
    except Exception as e:
        # aiokafka raises CorruptRecordException, cramjam DecompressionError,
        # UnicodeDecodeError, ...: callers handle one type.
        raise InvalidRecordsError(f"bad records: {type(e).__name__}: {e}") from None
    if len(out) != header.records_count:
        raise InvalidRecordsError(f"batch says {header.records_count} records, found {len(out)}")
    return out


# A batch's records may not decompress to more than this: a few KiB of zeros compress to
# nothing, and a broker that inflated them whole would run out of memory
MAX_DECOMPRESSED = 64 << 20


def check_records(
    batch: bytes | bytearray | memoryview, header: record_batch.RecordBatchHeader | None = None
) -> None:
    """What Kafka's LogValidator finds reading every record of a batch it appends, as far as
    lengths go: the records section decompresses (to at most ``MAX_DECOMPRESSED`` bytes) and
    holds exactly the header's record count of length-prefixed records, filling it.
    ``InvalidRecordsError`` otherwise. The batch's header (``header``, when already read) and
    CRC are assumed checked."""
    if header is None:
        header = record_batch.parse_header(batch)
    codec_id = header.attributes & 0x07
    section = memoryview(batch)[record_batch.HEADER_SIZE : header.size]
    if codec_id == Compression.NONE:
        data: bytes | bytearray | memoryview = section
    else:
        if codec_id not in Compression._value2member_map_:
            raise InvalidRecordsError(f"unknown compression codec {codec_id}")
        name = record_batch.COMPRESSION[codec_id]
        try:
            data = _decompress_bounded(Compression(codec_id), section)
        except InvalidRecordsError:
            raise
        except Exception as e:
            raise InvalidRecordsError(
                f"records do not decompress ({name}): {type(e).__name__}: {e}"
            ) from None
    count, pos, end = 0, 0, len(data)
    try:
        while pos < end:
            length, pos = decode_varint(data, pos)
            if length < 0 or pos + length > end:
                raise InvalidRecordsError(
                    f"record {count} claims {length} bytes, {end - pos} are left"
                )
            pos += length
            count += 1
    except IndexError:
        raise InvalidRecordsError(f"record {count}: its length is cut off") from None
    if count != header.records_count:
        raise InvalidRecordsError(f"batch says {header.records_count} records, holds {count}")


def _decompress_bounded(
    codec_id: Compression, section: memoryview
) -> bytes | bytearray | memoryview:
    too_large = InvalidRecordsError(f"records decompress to more than {MAX_DECOMPRESSED} bytes")
    if codec_id == Compression.GZIP:
        out = bytearray()
        rest = bytes(section)
        while rest:
            inflater = zlib.decompressobj(wbits=31)
            out += inflater.decompress(rest, MAX_DECOMPRESSED + 1 - len(out))
            if len(out) > MAX_DECOMPRESSED or inflater.unconsumed_tail:
                raise too_large
            if not inflater.eof:
                raise InvalidRecordsError("records do not decompress (GZIP): truncated stream")
            rest = inflater.unused_data  # another gzip member follows
        return out
    if codec_id == Compression.SNAPPY:
        if sum(_snappy_lengths(section)) > MAX_DECOMPRESSED:
            raise too_large
        return bytes(codec.snappy_decode(section))
    module = cramjam.lz4 if codec_id == Compression.LZ4 else cramjam.zstd
    data = bytes(section)
    # a buffer of a likely size first, larger ones while the records do not fit (a fresh
    # buffer is zeroed: one of MAX_DECOMPRESSED up front would cost ~0.1 s per batch)
    size = min(MAX_DECOMPRESSED, max(1 << 20, 32 * len(data)))
    while True:
        out = bytearray(size + 1)  # one byte more: a full buffer means it did not fit
        try:
            n = module.decompress_into(data, out)
        except cramjam.DecompressionError as e:
            if "whole buffer" not in str(e):
                raise
            n = len(out)
        if n <= size:
            return memoryview(out)[:n]
        if size == MAX_DECOMPRESSED:
            raise too_large
        size = min(MAX_DECOMPRESSED, size * 8)


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_lengths(section: memoryview) -> list[int]:
    """The decompressed sizes of a snappy section's blocks (raw, or xerial-framed as the Java
    clients write it), read from their headers."""
    raw = bytes(section)
    if not raw.startswith(_XERIAL_MAGIC):
        return [cramjam.snappy.decompress_raw_len(raw)]
    lengths, pos = [], 16
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise InvalidRecordsError("records do not decompress (SNAPPY): a block cut off")
        (size,) = struct.unpack_from(">i", raw, pos)
        block = raw[pos + 4 : pos + 4 + size]
        if size < 0 or len(block) != size:
            raise InvalidRecordsError("records do not decompress (SNAPPY): a block cut off")
        lengths.append(cramjam.snappy.decompress_raw_len(block))
        pos += 4 + size
    return lengths


def build_batch(
    records: Sequence[RecordInput],
    *,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    log_append_time: bool = False,
) -> bytearray:
    """Build one magic-v2 batch; record i gets offset ``base_offset + i``.

    ``log_append_time`` sets the timestamp type bit (then readers use maxTimestamp for
    every record); ``is_control`` marks a transaction marker batch.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(compression),
        is_transactional=int(is_transactional),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=_MAX_BATCH_SIZE,
    )
    for i, r in enumerate(records):
        appended = builder.append(
            offset=i, timestamp=r.timestamp, key=r.key, value=r.value, headers=list(r.headers)
        )
        if appended is None:
            raise ValueError(f"records exceed {_MAX_BATCH_SIZE} bytes")
    data = builder.build()
    record_batch.assign_offsets(data, base_offset, partition_leader_epoch)
    extra = (_CONTROL_BIT if is_control else 0) | (_TIMESTAMP_TYPE_BIT if log_append_time else 0)
    if extra:
        # aiokafka's builder cannot set these bits; they are inside the CRC'd range.
        attrs = int.from_bytes(data[21:23], "big") | extra
        data[21:23] = attrs.to_bytes(2, "big")
        record_batch.rewrite_crc(data)
    return data


_COMPRESSORS = {
    Compression.GZIP: codec.gzip_encode,
    Compression.SNAPPY: codec.snappy_encode,
    Compression.LZ4: codec.lz4_encode,
    Compression.ZSTD: codec.zstd_encode,
}


def _compress(codec_id: Compression, section: bytes, level: int | None) -> bytes:
    if level is None or codec_id == Compression.SNAPPY:
        return _COMPRESSORS[codec_id](section)
    if codec_id == Compression.GZIP:
        return codec.gzip_encode(section, compresslevel=level)
    if codec_id == Compression.LZ4:
        return codec.lz4_encode(section, level=level)
    return codec.zstd_encode(section, level=level)


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    compression_level: int | None = None,
) -> bytearray:
    """One magic-v2 batch with every header field given, holding ``records`` at their own
    offsets and timestamps (Kafka's ``MemoryRecordsBuilder`` appending records with offsets,
    then ``overrideLastOffset``). ``compression_level`` is the gzip, lz4 or zstd level (a
    topic's ``compression.<codec>.level``; None: the codec's default; snappy has none).

    Each record's offsetDelta is ``offset - base_offset`` and its timestampDelta ``timestamp -
    base_timestamp`` (negative when the base is a delete horizon). The records section is
    compressed with the codec of ``attributes``' low 3 bits whatever the gain, as Kafka does; a
    batch without records is a bare header and must be uncompressed.
    """
    codec_id = attributes & 0x07
    if codec_id not in Compression._value2member_map_:
        raise ValueError(f"unknown compression codec {codec_id}")
    if not records and codec_id != Compression.NONE:
        raise ValueError("an empty batch is not compressed")
    body = bytearray()
    previous = base_offset - 1
    for r in records:
        if not previous < r.offset <= base_offset + last_offset_delta:
            raise ValueError(
                f"record offset {r.offset} is not after {previous} within the batch's "
                f"[{base_offset}, {base_offset + last_offset_delta}]"
            )
        previous = r.offset
        _write_record(body, r, r.offset - base_offset, r.timestamp - base_timestamp)
    section = bytes(body)
    if codec_id != Compression.NONE:
        section = _compress(Compression(codec_id), section, compression_level)
    data = bytearray(record_batch.HEADER_SIZE + len(section))
    record_batch.HEADER.pack_into(
        data,
        0,
        base_offset,
        len(data) - record_batch.LOG_OVERHEAD,
        partition_leader_epoch,
        2,
        0,  # the CRC, below
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    data[record_batch.HEADER_SIZE :] = section
    record_batch.rewrite_crc(data)
    return data


def _write_record(out: bytearray, r: Record, offset_delta: int, timestamp_delta: int) -> None:
    body = bytearray(b"\x00")  # attributes, unused
    _write_varint(body, timestamp_delta)
    _write_varint(body, offset_delta)
    _write_bytes(body, r.key)
    _write_bytes(body, r.value)
    _write_varint(body, len(r.headers))
    for name, value in r.headers:
        _write_bytes(body, name.encode())
        _write_bytes(body, value)
    _write_varint(out, len(body))
    out += body


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


def _write_varint(out: bytearray, n: int) -> None:
    """Kafka's zigzag varint/varlong (protobuf's sint64 encoding)."""
    z = (n << 1) ^ (n >> 63)
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
