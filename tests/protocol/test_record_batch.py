"""The magic-v2 record batch header view."""

from __future__ import annotations

import struct

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from protocol import record_batch


def make_batch(base_offset: int = 55400, count: int = 15, records: bytes = b"r" * 40) -> bytes:
    """A header with a correct CRC over an opaque records section."""
    after_crc = (
        struct.pack(">hiqqqhii", 0, count - 1, 1712451146370, 1712451146370, 7002, 0, 5400, count)
        + records
    )
    crc = crc32c.crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, 0, 2, crc) + after_crc


def test_parse_header_fields() -> None:
    data = make_batch()
    h = record_batch.parse_header(data)
    assert (h.base_offset, h.last_offset, h.records_count, h.size) == (55400, 55414, 15, len(data))
    assert (h.producer_id, h.base_sequence, h.last_sequence) == (7002, 5400, 5414)
    assert h.compression == "NONE" and h.timestamp_type == "CREATE_TIME"
    assert record_batch.crc_is_valid(data, h)
    assert record_batch.looks_like_batch(data)
    corrupted = data[:-1] + b"x"
    assert not record_batch.crc_is_valid(corrupted, record_batch.parse_header(corrupted))


@given(st.binary(max_size=120))
def test_header_parser_fuzz(data: bytes) -> None:
    try:
        h = record_batch.parse_header(data)
    except record_batch.InvalidRecordBatchError:
        return
    record_batch.crc_is_valid(data, h)
    record_batch.looks_like_batch(data)
