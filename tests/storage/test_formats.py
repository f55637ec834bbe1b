"""StreamRecordBatch and object format: round trips, the seed-000 object, fuzzed decoders."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import object_format, stream_record_batch
from storage.object_format import CorruptObjectError, DataBlockIndex, Footer
from storage.object_writer import ObjectWriter
from storage.stream_record_batch import CorruptRecordError, StreamRecordBatch

batches = st.builds(
    StreamRecordBatch,
    stream_id=st.integers(0, 2**63 - 1),
    epoch=st.integers(-1, 2**63 - 1),
    base_offset=st.integers(0, 2**62),
    count=st.integers(1, 2**31 - 1),
    payload=st.binary(max_size=300),
)


@given(batches)
def test_stream_record_batch_round_trip(batch: StreamRecordBatch) -> None:
    data = batch.encode()
    assert len(data) == 33 + len(batch.payload)
    decoded, end = stream_record_batch.decode(data)
    assert end == len(data)
    assert decoded == StreamRecordBatch(
        batch.stream_id, batch.epoch, batch.base_offset, batch.count, memoryview(batch.payload)
    )
    assert bytes(decoded.payload) == batch.payload


def test_stream_record_batch_layout_is_automq() -> None:
    data = StreamRecordBatch(3, 0, 5, 1, b"abc").encode()
    assert data[0] == 0x22
    assert struct.unpack(">qqqii", data[1:33]) == (3, 0, 5, 1, 3)


@given(st.binary(max_size=200))
def test_stream_record_batch_decoder_fuzz(data: bytes) -> None:
    try:
        batch, end = stream_record_batch.decode(data)
    except CorruptRecordError:
        return
    assert end <= len(data) and len(batch.payload) == end - 33


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5), st.binary(max_size=50)), max_size=40)
)
def test_object_round_trip(specs: list[tuple[int, int, bytes]]) -> None:
    offsets: dict[int, int] = {}
    items = []
    for stream, count, payload in sorted(specs, key=lambda s: s[0]):
        base = offsets.get(stream, 0)
        offsets[stream] = base + count
        items.append(StreamRecordBatch(stream, 0, base, count, payload))
    writer = ObjectWriter(block_size=128)
    writer.add_all(items)
    built = writer.finish()
    data = built.to_bytes()
    assert len(data) == built.size
    footer = object_format.decode_footer(data[-48:], len(data))
    pos = footer.index_start_position
    index = object_format.decode_index(data[pos : pos + footer.index_block_length])
    assert index == built.index
    got: list[StreamRecordBatch] = []
    for e in index:
        blk, end = object_format.decode_block(data, e.start_position)
        assert end == e.end_position and len(blk) == e.record_count
        assert blk[0].base_offset == e.start_offset and blk[-1].last_offset == e.end_offset
        got.extend(blk)
    assert [(b.stream_id, b.base_offset, b.count, bytes(b.payload)) for b in got] == [
        (b.stream_id, b.base_offset, b.count, b.payload) for b in items
    ]


def seed_000_object() -> bytes:
    """Object 78 of seed 000: 2 MetaStream records, 336 data batches, 84 time-index entries."""
    writer = ObjectWriter(block_size=1 << 20)
    for i, size in enumerate([138, 48]):
        writer.add(StreamRecordBatch(3, 0, 4 + i, 1, b"m" * size))
    for i in range(336):
        writer.add(StreamRecordBatch(4, 0, 50390 + 15 * i, 15, b"d" * 15556))
    for i in range(84):
        writer.add(StreamRecordBatch(5, 0, 8376 + 12 * i, 12, b"t" * 12))
    return writer.finish().to_bytes()


def test_seed_000_object_parses_to_the_article_numbers() -> None:
    data = seed_000_object()
    footer = object_format.decode_footer(data[-48:], len(data))
    assert footer == Footer(index_start_position=5242006, index_block_length=252)
    index = object_format.decode_index(data[5242006 : 5242006 + 252])
    assert len(index) == 7
    assert [(e.stream_id, e.start_offset, e.end_offset, e.record_count, e.start_position, e.size)
            for e in index] == [
        (3, 4, 6, 2, 0, 262),
        (4, 50390, 51410, 68, 262, 1060062),
        (4, 51410, 52430, 68, 1060324, 1060062),
        (4, 52430, 53450, 68, 2120386, 1060062),
        (4, 53450, 54470, 68, 3180448, 1060062),
        (4, 54470, 55430, 64, 4240510, 997706),
        (5, 8376, 9384, 84, 5238216, 3790),
    ]  # fmt: skip
    assert [str(r) for r in object_format.stream_ranges(index)] == [
        "3:4-6",
        "4:50390-55430",
        "5:8376-9384",
    ]


def test_object_key_reverses_the_hex_id() -> None:
    assert object_format.object_key("_kafka_HevPZiuuSiiyUU6ylL3C6Q", 78) == (
        "e4000000/_kafka_HevPZiuuSiiyUU6ylL3C6Q/78"
    )
    assert object_format.object_key(object_format.namespace_for_cluster("c1"), 0x1234) == (
        "43210000/_kafka_c1/4660"
    )
    assert object_format.object_id_from_key("e4000000/_kafka_x/78") == 78


def test_find_blocks_binary_search() -> None:
    index = [
        DataBlockIndex(1, 0, 10, 1, 0, 10),
        DataBlockIndex(2, 0, 5, 1, 10, 10),
        DataBlockIndex(2, 5, 5, 1, 20, 10),
        DataBlockIndex(2, 10, 5, 1, 30, 10),
        DataBlockIndex(3, 0, 5, 1, 40, 10),
    ]
    assert [e.start_position for e in object_format.find_blocks(index, 2, 0, -1)] == [10, 20, 30]
    assert [e.start_position for e in object_format.find_blocks(index, 2, 7, 11)] == [20, 30]
    assert [e.start_position for e in object_format.find_blocks(index, 2, 5, 10)] == [20]
    assert object_format.find_blocks(index, 2, 15, -1) == []
    assert object_format.find_blocks(index, 4, 0, -1) == []


def test_truncated_and_corrupt_objects_raise_clear_errors() -> None:
    data = seed_000_object()
    with pytest.raises(CorruptObjectError, match="footer must be 48 bytes"):
        object_format.decode_footer(data[-40:])
    with pytest.raises(CorruptObjectError, match="bad footer magic"):
        object_format.decode_footer(data[-48:-1] + b"\0")
    with pytest.raises(CorruptObjectError, match="object size"):
        object_format.decode_footer(data[-48:], len(data) - 1)
    with pytest.raises(CorruptObjectError, match="multiple of 36"):
        object_format.decode_index(b"\0" * 35)
    with pytest.raises(CorruptObjectError, match="truncated data block"):
        object_format.decode_block(data[:200])
    with pytest.raises(CorruptObjectError, match="bad data block magic"):
        object_format.decode_block(b"\0" + data[1:262])


@given(st.binary(max_size=300))
def test_object_decoders_fuzz(data: bytes) -> None:
    for decode in (
        lambda: object_format.decode_block(data),
        lambda: object_format.decode_index(data),
        lambda: object_format.decode_footer(data[-48:], len(data)),
    ):
        with contextlib.suppress(CorruptObjectError):
            decode()
