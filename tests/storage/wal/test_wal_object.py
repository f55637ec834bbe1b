"""The object WAL's formats: keys, WAL objects, epoch records, and a fuzz of their decoders."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.wal import record, wal_object
from storage.wal.errors import CorruptRecordError, CorruptWALError
from storage.wal.wal_object import EpochRecord, ObjectName


def joined(parts: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def build(start: int, bodies: list[bytes], *, node: int = 3, epoch: int = 7) -> bytes:
    return joined(wal_object.encode_object(node, epoch, start, [[b] for b in bodies]))


def test_keys_sort_by_start_offset_then_epoch_and_parse_back() -> None:
    keys = [
        wal_object.object_key("_kafka_c", 3, start, epoch)
        for start, epoch in [(10_000, 1), (9, 2), (10_000, 12), (0, 5)]
    ]
    prefix = wal_object.node_prefix("_kafka_c", 3)
    assert keys[0] == f"{prefix}00000000000000010000-00000000000000000001"
    parsed = [wal_object.parse_object_key(prefix, k) for k in sorted(keys)]
    assert parsed == [
        ObjectName(0, 5),
        ObjectName(9, 2),
        ObjectName(10_000, 1),
        ObjectName(10_000, 12),
    ]


def test_epoch_record_keys_are_told_apart_from_objects() -> None:
    prefix = wal_object.node_prefix("ns", 1)
    key = wal_object.epoch_record_key("ns", 1, 42)
    assert key.startswith(prefix)
    assert wal_object.parse_epoch_record_key(prefix, key) == 42
    assert wal_object.parse_object_key(prefix, key) is None
    assert wal_object.parse_epoch_record_key(prefix, wal_object.object_key("ns", 1, 0, 1)) is None
    # another node's prefix, and keys that only look alike, name nothing
    assert wal_object.parse_object_key(prefix, wal_object.object_key("ns", 10, 0, 1)) is None
    assert wal_object.parse_object_key(prefix, prefix + "1-2") is None
    assert wal_object.node_prefix("ns", 1) != wal_object.node_prefix("ns", 10)[: len(prefix)]


def test_object_round_trip_gives_records_at_consecutive_offsets() -> None:
    data = build(1000, [b"a", b"bcd", b""])
    header = wal_object.decode_object_header(data)
    assert (header.node_id, header.epoch, header.start_offset) == (3, 7, 1000)
    assert header.records_length == 3 * record.HEADER_SIZE + 4
    assert len(data) == wal_object.OBJECT_HEADER_SIZE + header.records_length
    records = list(wal_object.iter_records(header, data))
    assert [(r.offset, bytes(r.body)) for r in records] == [
        (1000, b"a"),
        (1025, b"bcd"),
        (1052, b""),
    ]
    assert records[-1].next_offset == header.end_offset
    assert [r.offset for r in wal_object.iter_records(header, data, from_offset=1025)] == [
        1025,
        1052,
    ]


def test_header_layout() -> None:
    data = build(5, [b"x"], node=-1, epoch=9)
    assert data[:4] == b"OWAL"
    assert int.from_bytes(data[4:8], "big", signed=True) == -1
    assert int.from_bytes(data[8:16], "big") == 9
    assert int.from_bytes(data[16:24], "big") == 5
    assert int.from_bytes(data[24:32], "big") == record.HEADER_SIZE + 1


def test_a_truncated_object_yields_the_records_before_the_cut() -> None:
    data = build(0, [b"first", b"second", b"third"])
    header = wal_object.decode_object_header(data)
    cut = data[: wal_object.OBJECT_HEADER_SIZE + 2 * record.HEADER_SIZE + 5 + 3]
    got = []
    with pytest.raises(CorruptRecordError) as caught:
        for rec in wal_object.iter_records(header, cut):
            got.append(bytes(rec.body))
    assert got == [b"first"]
    assert caught.value.reason == record.SHORT_BODY


def test_a_flipped_body_byte_is_a_crc_mismatch() -> None:
    data = bytearray(build(0, [b"first", b"second"]))
    data[-1] ^= 0x10
    header = wal_object.decode_object_header(data)
    with pytest.raises(CorruptRecordError) as caught:
        list(wal_object.iter_records(header, data))
    assert caught.value.reason == record.BODY_CRC_MISMATCH


@pytest.mark.parametrize("position", [0, 5, 17, 30, 38])
def test_a_flipped_header_byte_is_rejected(position: int) -> None:
    data = bytearray(build(0, [b"x"]))
    data[position] ^= 0x01
    with pytest.raises(CorruptWALError):
        wal_object.decode_object_header(data)


def test_an_object_must_match_its_key() -> None:
    header = wal_object.decode_object_header(build(64, [b"x"], node=3, epoch=7))
    wal_object.check_object(header, 3, ObjectName(64, 7))
    for node, name in [(4, ObjectName(64, 7)), (3, ObjectName(64, 8)), (3, ObjectName(0, 7))]:
        with pytest.raises(CorruptWALError):
            wal_object.check_object(header, node, name)


def test_epoch_record_round_trip_and_corruption() -> None:
    rec = EpochRecord(node_id=2, epoch=5, start_offset=1 << 40, trim_offset=123)
    encoded = wal_object.encode_epoch_record(rec)
    assert len(encoded) == wal_object.EPOCH_RECORD_SIZE
    assert wal_object.decode_epoch_record(encoded) == rec
    for position in range(len(encoded)):
        damaged = bytearray(encoded)
        damaged[position] ^= 0x80
        with pytest.raises(CorruptWALError):
            wal_object.decode_epoch_record(damaged)
    with pytest.raises(CorruptWALError):
        wal_object.decode_epoch_record(encoded[:-1])


def _decode_all(data: bytes) -> None:
    """Decode ``data`` as recovery does; only the format's errors may escape."""
    with contextlib.suppress(CorruptWALError):
        header = wal_object.decode_object_header(data)
        for rec in wal_object.iter_records(header, data):
            assert header.start_offset <= rec.offset < rec.next_offset <= header.end_offset


@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_decoders(data: bytes) -> None:
    _decode_all(data)
    with contextlib.suppress(CorruptWALError):
        wal_object.decode_epoch_record(data)


@given(
    st.lists(st.binary(max_size=64), min_size=1, max_size=6),
    st.data(),
)
def test_damaged_objects_yield_a_prefix_of_their_records(
    bodies: list[bytes], data: st.DataObject
) -> None:
    encoded = bytearray(build(77, bodies))
    edits = data.draw(
        st.lists(st.tuples(st.integers(0, len(encoded) - 1), st.integers(1, 255)), max_size=4)
    )
    for position, xor in edits:
        encoded[position] ^= xor
    cut = data.draw(st.integers(0, len(encoded)))
    damaged = bytes(encoded[:cut])
    got: list[bytes] = []
    with contextlib.suppress(CorruptWALError):
        header = wal_object.decode_object_header(damaged)
        for rec in wal_object.iter_records(header, damaged):
            got.append(bytes(rec.body))
    # whatever was damaged, what comes out is what was written, in order, from the start
    assert got == bodies[: len(got)]
