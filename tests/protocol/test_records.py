"""Record-level parsing/building through aiokafka, batch validation and in-place patches."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

import pytest
from aiokafka import codec  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from protocol import record_batch, records
from protocol.record_batch import (
    InvalidRecordBatchError,
    InvalidRecordsError,
    LegacyMessageSetError,
)
from protocol.records import (
    Compression,
    Record,
    RecordInput,
    build_batch,
    check_records,
    parse_records,
)

T0 = 1_712_451_146_370  # ms, with a non-zero millisecond part on purpose

INPUTS = [
    RecordInput(b"value-0", b"key-0", [("trace", b"abc"), ("empty", None)], T0),
    RecordInput(None, b"tombstone", (), T0 + 1),
    RecordInput(b"v" * 3000, None, [("ü", b"")], T0 + 999),
]


@pytest.mark.parametrize("codec", list(Compression))
def test_build_and_parse_every_codec(codec: Compression) -> None:
    batch = build_batch(INPUTS, compression=codec, base_offset=500, producer_id=9, base_sequence=0)
    header = record_batch.validate_batch(batch)
    assert header.compression == codec.name
    assert (header.base_offset, header.records_count, header.producer_id) == (500, 3, 9)
    assert parse_records(batch) == [
        Record(500, T0, b"key-0", b"value-0", (("trace", b"abc"), ("empty", None))),
        Record(501, T0 + 1, b"tombstone", None, ()),
        Record(502, T0 + 999, None, b"v" * 3000, (("ü", b""),)),
    ]


def test_crc_catches_any_flipped_byte_after_the_crc() -> None:
    batch = bytes(build_batch(INPUTS, compression=Compression.LZ4))
    for i in range(record_batch.CRC_START, len(batch), 7):
        corrupted = bytearray(batch)
        corrupted[i] ^= 0x01
        with pytest.raises(InvalidRecordBatchError):
            record_batch.validate_batch(corrupted)


def test_in_place_offset_and_epoch_patch_keeps_crc_valid() -> None:
    blob = bytearray(build_batch(INPUTS) + build_batch(INPUTS[:1]))
    view = memoryview(blob)
    positions = []
    pos = 0
    for header, _ in record_batch.iter_batches(bytes(blob)):
        positions.append(pos)
        pos += header.size
    next_offset = 1_000_000
    for pos in positions:
        record_batch.assign_offsets(view, next_offset, 17, pos)
        header = record_batch.validate_batch(blob, pos)
        assert (header.base_offset, header.partition_leader_epoch) == (next_offset, 17)
        next_offset = header.last_offset + 1
    assert [r.offset for r in parse_records(blob[positions[1] :])] == [1_000_003]


def test_iter_batches_splits_and_rejects_partial_tails() -> None:
    a, b = bytes(build_batch(INPUTS)), bytes(build_batch(INPUTS[:2], base_offset=3))
    got = [(h.base_offset, bytes(v)) for h, v in record_batch.iter_batches(a + b)]
    assert got == [(0, a), (3, b)]
    with pytest.raises(InvalidRecordBatchError):
        list(record_batch.iter_batches(a + b[:-1]))
    with pytest.raises(InvalidRecordBatchError):
        list(record_batch.iter_batches(a + b[:10]))


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_are_refused(magic: int) -> None:
    # offset 8, size 4, crc 4, magic 1, attributes 1, (timestamp 8), key -1, value
    legacy = bytes(8) + (14).to_bytes(4, "big") + bytes(4) + bytes([magic]) + bytes(9)
    with pytest.raises(LegacyMessageSetError) as info:
        list(record_batch.iter_batches(legacy))
    assert info.value.magic == magic


def test_count_must_match_offset_span_for_producers() -> None:
    batch = bytearray(build_batch(INPUTS))
    batch[57:61] = (2).to_bytes(4, "big")  # recordsCount, inside the CRC: fix the CRC
    record_batch.rewrite_crc(batch)
    with pytest.raises(InvalidRecordBatchError):
        record_batch.validate_batch(batch)
    # A compacted batch may hold fewer records than its offset range.
    assert record_batch.validate_batch(batch, from_producer=False).records_count == 2


def test_control_and_log_append_time_bits() -> None:
    batch = build_batch(INPUTS[:1], is_control=True, log_append_time=True, is_transactional=True)
    header = record_batch.validate_batch(batch)
    assert header.is_control and header.is_transactional
    assert header.timestamp_type == "LOG_APPEND_TIME"


def test_corrupt_compressed_payload_is_our_error() -> None:
    batch = bytearray(build_batch(INPUTS, compression=Compression.ZSTD))
    batch[70] ^= 0xFF
    record_batch.rewrite_crc(batch)  # CRC fine, payload garbage
    with pytest.raises(InvalidRecordBatchError):
        parse_records(batch)


# -- check_records: what the broker reads of every batch it appends ---------------------------


@pytest.mark.parametrize("codec", list(Compression))
@pytest.mark.parametrize("count", [1, 7, 600])
def test_check_records_passes_every_well_formed_batch(codec: Compression, count: int) -> None:
    inputs = [RecordInput(b"v%d" % i * 40, b"k", [("h", b"x")], i) for i in range(count)]
    check_records(build_batch(inputs, compression=codec))


@pytest.mark.parametrize("codec", list(Compression))
def test_check_records_refuses_records_that_do_not_read(codec: Compression) -> None:
    batch = bytearray(build_batch(INPUTS, compression=codec))
    size = len(batch) - record_batch.HEADER_SIZE
    batch[record_batch.HEADER_SIZE :] = (bytes(range(256)) * 64)[:size]  # same size, no records
    record_batch.rewrite_crc(batch)
    with pytest.raises(InvalidRecordsError):
        check_records(batch)


def test_check_records_counts_the_records() -> None:
    batch = bytearray(build_batch(INPUTS))
    struct.pack_into(">i", batch, 57, len(INPUTS) + 1)  # the header's record count
    record_batch.rewrite_crc(batch)
    with pytest.raises(InvalidRecordsError, match="records"):
        check_records(batch)


@pytest.mark.parametrize(
    ("codec", "encode"),
    [
        (Compression.GZIP, codec.gzip_encode),
        (Compression.LZ4, codec.lz4_encode),
        (Compression.ZSTD, codec.zstd_encode),
    ],
)
def test_check_records_refuses_a_decompression_bomb(
    codec: Compression, encode: Callable[[bytes], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "MAX_DECOMPRESSED", 4 << 20)
    batch = bytearray(build_batch(INPUTS, compression=codec))
    batch[record_batch.HEADER_SIZE :] = encode(b"\0" * (5 << 20))
    struct.pack_into(">i", batch, record_batch.BATCH_LENGTH_OFFSET, len(batch) - 12)
    record_batch.rewrite_crc(batch)
    with pytest.raises(InvalidRecordsError, match="more than"):
        check_records(batch)


@given(
    codec=st.sampled_from(list(Compression)),
    noise=st.binary(max_size=600),
    cut=st.integers(min_value=0, max_value=600),
)
def test_check_records_raises_only_its_own_error(
    codec: Compression, noise: bytes, cut: int
) -> None:
    """Fuzz: a valid batch's records section replaced by, or cut and followed by, any bytes."""
    batch = bytearray(build_batch(INPUTS, compression=codec))
    keep = record_batch.HEADER_SIZE + min(cut, len(batch) - record_batch.HEADER_SIZE)
    batch[keep:] = noise
    struct.pack_into(">i", batch, record_batch.BATCH_LENGTH_OFFSET, len(batch) - 12)
    record_batch.rewrite_crc(batch)
    with contextlib.suppress(InvalidRecordsError):
        check_records(batch)


def test_check_records_reads_xerial_framed_snappy() -> None:
    """The Java clients frame snappy as xerial blocks; their sizes come from each block."""
    batch = bytearray(build_batch(INPUTS * 50, compression=Compression.SNAPPY))
    section = codec.snappy_decode(bytes(batch[record_batch.HEADER_SIZE :]))
    framed = codec.snappy_encode(section, xerial_compatible=True, xerial_blocksize=4096)
    batch[record_batch.HEADER_SIZE :] = framed
    struct.pack_into(">i", batch, record_batch.BATCH_LENGTH_OFFSET, len(batch) - 12)
    record_batch.rewrite_crc(batch)
    assert framed.startswith(b"\x82SNAPPY\x00")
    check_records(batch)
