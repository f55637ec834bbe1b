"""The WAL record format: round trip, each validation error, and random bytes."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.wal import record
from storage.wal.errors import CorruptRecordError, WALError


def joined(parts: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_round_trip_of_a_multi_part_body() -> None:
    encoded = joined(record.encode(4096, [b"hello ", memoryview(b"world")]))
    head = record.decode_header(encoded, 4096)
    assert (head.offset, head.body_length, head.is_padding) == (4096, 11, False)
    assert head.next_offset == 4096 + record.HEADER_SIZE + 11
    body = encoded[record.HEADER_SIZE :]
    record.verify_body(head, body)
    assert body == b"hello world"


def test_header_layout_is_big_endian_magic_length_offset_crcs() -> None:
    encoded = joined(record.encode(7, [b"abc"]))
    assert encoded[:4] == bytes.fromhex("87654321")
    assert int.from_bytes(encoded[4:8], "big") == 3
    assert int.from_bytes(encoded[8:16], "big") == 7
    assert len(encoded) == 24 + 3


def test_padding_spans_to_the_end_of_the_lap() -> None:
    head = record.decode_header(record.encode_padding(100, 4096), 100)
    assert head.is_padding and head.next_offset == 4096
    with pytest.raises(ValueError):
        record.encode_padding(4090, 4096)


@pytest.mark.parametrize(
    ("position", "reason"),
    [
        (0, record.BAD_MAGIC),
        (5, record.HEADER_CRC_MISMATCH),
        (21, record.HEADER_CRC_MISMATCH),
    ],
)
def test_a_flipped_header_byte_is_detected(position: int, reason: str) -> None:
    encoded = bytearray(joined(record.encode(0, [b"body"])))
    encoded[position] ^= 0x01
    with pytest.raises(CorruptRecordError) as caught:
        record.decode_header(encoded, 0)
    assert caught.value.reason == reason


def test_a_record_from_another_offset_is_rejected() -> None:
    encoded = joined(record.encode(100, [b"body"]))
    with pytest.raises(CorruptRecordError, match="offset mismatch") as caught:
        record.decode_header(encoded, 100 + 65536)
    assert caught.value.found_offset == 100


def test_a_length_past_the_room_left_is_rejected() -> None:
    encoded = joined(record.encode(0, [b"x" * 100]))
    with pytest.raises(CorruptRecordError, match="length past capacity"):
        record.decode_header(encoded, 0, max_body_length=99)


def test_a_short_header_is_rejected() -> None:
    with pytest.raises(CorruptRecordError, match="short header"):
        record.decode_header(b"\x87\x65\x43\x21", 0)


def test_a_flipped_body_byte_fails_the_body_crc() -> None:
    encoded = bytearray(joined(record.encode(0, [b"some body"])))
    encoded[-1] ^= 0x80
    head = record.decode_header(encoded, 0)
    with pytest.raises(CorruptRecordError, match="body CRC mismatch"):
        record.verify_body(head, encoded[record.HEADER_SIZE :])
    with pytest.raises(CorruptRecordError, match="short body"):
        record.verify_body(head, encoded[record.HEADER_SIZE : -1])


@given(
    st.binary(max_size=64),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.none() | st.integers(min_value=0, max_value=2**32),
)
def test_random_bytes_raise_only_wal_errors(
    data: bytes, expected: int, max_body_length: int | None
) -> None:
    with contextlib.suppress(WALError):
        head = record.decode_header(data, expected, max_body_length=max_body_length)
        record.verify_body(head, data[record.HEADER_SIZE :])


@given(st.binary(max_size=200), st.integers(min_value=0, max_value=2**63), st.data())
def test_any_single_bit_flip_is_caught(body: bytes, offset: int, data: st.DataObject) -> None:
    encoded = bytearray(joined(record.encode(offset, [body])))
    bit = data.draw(st.integers(min_value=0, max_value=len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptRecordError):
        head = record.decode_header(encoded, offset)
        record.verify_body(head, encoded[record.HEADER_SIZE :])
