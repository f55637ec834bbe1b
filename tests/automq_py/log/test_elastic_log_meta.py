"""The LOG and PARTITION JSON codecs against what AutoMQ wrote (seed 000)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.log import meta_stream_record
from automq_py.log.elastic_log_meta import (
    CLEANED_SUFFIX,
    ElasticLogMeta,
    ElasticPartitionMeta,
    ElasticStreamSegmentMeta,
    SliceRange,
    TimestampOffset,
)
from automq_py.log.meta_stream_record import InvalidMetaRecordError, MetaKeyValue

SEED_LOG = (
    b'{"streamMap":{"log":4,"tim":5,"txn":-1},"segmentMetas":[{"bo":0,"ct":1712450996411,'
    b'"lmt":0,"s":"","lsz":0,"ls":{"s":0,"e":-1},"ts":{"s":0,"e":-1},"txs":{"s":0,"e":-1},'
    b'"fbt":0,"tle":{"t":-1,"o":0}}]}'
)


@pytest.mark.parametrize(
    "text",
    [b'{"s":0,"c":0,"r":50540,"cs":false}', b'{"s":0,"c":0,"r":0,"cs":false}'],
)
def test_partition_meta_round_trips_the_seed_bytes(text: bytes) -> None:
    meta = ElasticPartitionMeta.decode(text)
    assert meta.encode() == text


def test_partition_meta_fields() -> None:
    meta = ElasticPartitionMeta.decode(b'{"s":7,"c":3,"r":50540,"cs":true}')
    assert meta == ElasticPartitionMeta(7, 3, 50540, True)
    # the StreamRecordBatch of seed 000 was 48 bytes: a 14-byte key header + this value
    seed = b'{"s":0,"c":0,"r":50540,"cs":false}'
    assert len(meta_stream_record.encode(MetaKeyValue("PARTITION", seed))) == 48


def test_log_meta_round_trips_the_seed_bytes() -> None:
    meta = ElasticLogMeta.decode(SEED_LOG)
    assert meta.encode() == SEED_LOG
    # seed 000: the LOG record was a 206-byte StreamRecordBatch payload
    assert len(meta_stream_record.encode(MetaKeyValue("LOG", SEED_LOG))) == 206
    assert dict(meta.stream_map) == {"log": 4, "tim": 5, "txn": -1}
    (segment,) = meta.segment_metas
    assert segment == ElasticStreamSegmentMeta.new_active(0, 1712450996411, 0, 0, 0)
    assert segment.log.is_active and segment.time_index_last_entry == TimestampOffset(-1, 0)


def test_a_cleaned_segment_and_its_streams_round_trip() -> None:
    cleaned = ElasticStreamSegmentMeta(
        base_offset=0,
        create_timestamp=1,
        last_modified_timestamp=2,
        stream_suffix=CLEANED_SUFFIX,
        log_size=300,
        log=SliceRange(0, 5),
        time=SliceRange(0, 12),
        txn=SliceRange(0, 0),
        first_batch_timestamp=10,
        time_index_last_entry=TimestampOffset(10, 4),
    )
    active = ElasticStreamSegmentMeta.new_active(5, 3, 5, 24, 0)
    meta = ElasticLogMeta(
        {"log": 100, "tim": 101, "txn": -1, "log.cleaned": 102, "tim.cleaned": 103},
        (cleaned, active),
    )
    data = meta.encode()
    assert b'"s":".cleaned"' in data and b" " not in data
    decoded = ElasticLogMeta.decode(data)
    assert decoded == meta and decoded.encode() == data
    assert list(decoded.stream_map) == ["log", "tim", "txn", "log.cleaned", "tim.cleaned"]
    assert decoded.stream_id("txn.cleaned") == -1


def test_decoding_accepts_missing_unknown_and_null_fields() -> None:
    meta = ElasticLogMeta.decode(b'{"streamMap":{"log":4},"segmentMetas":[{"bo":5}],"x":1}')
    assert meta.segment_metas[0] == ElasticStreamSegmentMeta(base_offset=5)
    assert meta.segment_metas[0].log == SliceRange(-1, -1)
    assert ElasticPartitionMeta.decode(b'{"s":null,"c":0,"r":null,"cs":false,"new":1}') == (
        ElasticPartitionMeta(0, 0, 0, False)
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b'{"s":"0","c":0,"r":0,"cs":false}', "PARTITION.s"),
        (b'{"s":0,"c":0,"r":0,"cs":0}', "PARTITION.cs"),
        (b"[1]", "PARTITION"),
        (b"{nope", "PARTITION"),
    ],
)
def test_bad_partition_meta_names_the_field(data: bytes, field: str) -> None:
    with pytest.raises(InvalidMetaRecordError, match=field):
        ElasticPartitionMeta.decode(data)


def test_bad_log_meta_names_the_field() -> None:
    with pytest.raises(InvalidMetaRecordError, match=r"LOG.segmentMetas\[0\].ls"):
        ElasticLogMeta.decode(b'{"streamMap":{},"segmentMetas":[{"ls":{"s":true}}]}')
    with pytest.raises(InvalidMetaRecordError, match=r"LOG\.streamMap"):
        ElasticLogMeta.decode(b'{"streamMap":{"log":"4"},"segmentMetas":[]}')


longs = st.integers(-(2**63), 2**63 - 1)
slices = st.builds(SliceRange, longs, longs)
segments = st.builds(
    ElasticStreamSegmentMeta,
    base_offset=longs,
    create_timestamp=longs,
    last_modified_timestamp=longs,
    stream_suffix=st.sampled_from(["", CLEANED_SUFFIX]),
    log_size=st.integers(0, 2**31 - 1),
    log=slices,
    time=slices,
    txn=slices,
    first_batch_timestamp=longs,
    time_index_last_entry=st.builds(TimestampOffset, longs, longs),
)


@given(
    st.dictionaries(st.sampled_from(["log", "tim", "txn", "log.cleaned"]), longs),
    st.lists(segments, max_size=4),
)
def test_log_meta_round_trip(
    stream_map: dict[str, int], metas: list[ElasticStreamSegmentMeta]
) -> None:
    meta = ElasticLogMeta(stream_map, tuple(metas))
    data = meta.encode()
    assert ElasticLogMeta.decode(data) == meta
    assert ElasticLogMeta.decode(data).encode() == data
