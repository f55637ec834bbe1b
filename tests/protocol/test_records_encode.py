"""``encode_batch``: stored batches written field by field (the log cleaner's re-encoding),
checked against aiokafka's builder and reader."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import record_batch
from protocol.records import (
    Compression,
    Record,
    RecordInput,
    build_batch,
    encode_batch,
    parse_records,
)

T0 = 1_712_451_146_370


def test_contiguous_records_encode_as_aiokafkas_builder_does() -> None:
    inputs = [
        RecordInput(b"v0", b"k0", [("h", b"x"), ("none", None)], T0),
        RecordInput(None, b"k1", (), T0 + 5),
        RecordInput(b"v2", None, [("ü", b"")], T0 - 3),
    ]
    built = build_batch(inputs, base_offset=40, producer_id=3, producer_epoch=1, base_sequence=7)
    records = parse_records(built)
    header = record_batch.parse_header(built)
    ours = encode_batch(
        records,
        base_offset=40,
        last_offset_delta=2,
        base_timestamp=T0,
        max_timestamp=header.max_timestamp,
        producer_id=3,
        producer_epoch=1,
        base_sequence=7,
    )
    assert ours == built


@pytest.mark.parametrize("codec", list(Compression))
def test_gaps_negative_time_deltas_and_a_kept_last_offset(codec: Compression) -> None:
    records = [
        Record(101, T0, b"a", b"1", (("h", b"v"),)),
        Record(104, T0 - 10, b"b", None, ()),
    ]
    data = encode_batch(
        records,
        base_offset=100,
        last_offset_delta=9,
        base_timestamp=T0 + 86_400_000,  # a delete horizon: both deltas are negative
        max_timestamp=T0,
        attributes=int(codec) | 0x10 | record_batch.DELETE_HORIZON_BIT,
        producer_id=9,
        producer_epoch=2,
        base_sequence=0,
        partition_leader_epoch=4,
    )
    header = record_batch.validate_batch(data, from_producer=False)
    assert (header.base_offset, header.last_offset, header.records_count) == (100, 109, 2)
    assert header.compression == codec.name and header.is_transactional
    assert header.delete_horizon_ms == T0 + 86_400_000
    assert header.partition_leader_epoch == 4
    assert parse_records(data) == records


def test_an_empty_batch_is_a_bare_header() -> None:
    data = encode_batch([], base_offset=7, last_offset_delta=3, base_timestamp=-1, max_timestamp=T0)
    header = record_batch.validate_batch(data, from_producer=False)
    assert len(data) == record_batch.HEADER_SIZE
    assert (header.records_count, header.last_offset, header.max_timestamp) == (0, 10, T0)
    assert parse_records(data) == []
    with pytest.raises(ValueError):
        encode_batch(
            [],
            base_offset=7,
            last_offset_delta=0,
            base_timestamp=-1,
            max_timestamp=-1,
            attributes=1,
        )


@pytest.mark.parametrize("offsets", [[5, 5], [4], [3, 2], [12]])
def test_records_must_lie_in_the_batch_in_order(offsets: list[int]) -> None:
    records = [Record(o, T0, b"k", b"v") for o in offsets]
    with pytest.raises(ValueError):
        encode_batch(
            records, base_offset=5, last_offset_delta=6, base_timestamp=T0, max_timestamp=T0
        )


@given(
    st.lists(
        st.tuples(
            st.integers(1, 1000),
            st.integers(-(1 << 40), 1 << 40),
            st.none() | st.binary(max_size=20),
            st.none() | st.binary(max_size=20),
        ),
        max_size=8,
    ),
    st.sampled_from(list(Compression)),
    st.integers(-(1 << 62), 1 << 62),
)
def test_any_records_round_trip(
    raw: list[tuple[int, int, bytes | None, bytes | None]], codec: Compression, base_ts: int
) -> None:
    offset, records = 1000, []
    for gap, ts, key, value in raw:
        offset += gap
        records.append(Record(offset, ts, key, value, (("k", value),)))
    data = encode_batch(
        records,
        base_offset=1000,
        last_offset_delta=offset - 1000 + 1,
        base_timestamp=base_ts,
        max_timestamp=0,
        attributes=int(codec) if records else 0,
    )
    record_batch.validate_batch(data, from_producer=False)
    assert parse_records(data) == records


@pytest.mark.parametrize(
    ("codec", "low", "high"),
    [(Compression.GZIP, 1, 9), (Compression.LZ4, 1, 17), (Compression.ZSTD, -5, 19)],
)
def test_the_compression_level_is_the_topics(codec: Compression, low: int, high: int) -> None:
    """compression.<codec>.level reaches the codec: the levels give different bytes, and both
    read back as the same records."""
    text = b" ".join(b"record %d of a compacted topic's log, said again" % i for i in range(400))
    records = [Record(i, T0 + i, b"k%d" % i, text[i * 50 : i * 50 + 400], ()) for i in range(40)]

    def encoded(level: int | None) -> bytearray:
        return encode_batch(
            records,
            base_offset=0,
            last_offset_delta=39,
            base_timestamp=T0,
            max_timestamp=T0 + 39,
            attributes=int(codec),
            compression_level=level,
        )

    fast, small = encoded(low), encoded(high)
    assert fast != small
    assert parse_records(fast) == parse_records(small) == parse_records(encoded(None))
