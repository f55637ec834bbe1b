"""Produce decode: fields match kafka-python's encoding and kio's decoder; records stay views."""

from __future__ import annotations

import uuid

import pytest
from kafka.protocol.producer import ProduceRequest
from kio.index import load_request_schema
from kio.serial import entity_reader

from protocol import headers, messages, produce, record_batch
from protocol.errors import ErrorCode, InvalidRequestError, UnsupportedVersionError
from protocol.framing import FrameDecoder, encode_frame
from protocol.produce import ProduceRequestData
from protocol.records import Compression, RecordInput, build_batch
from tests.protocol.kafka_oracle import request_frame


def produce_frame(version: int, batches: list[bytes], correlation_id: int = 5) -> bytes:
    topic_id = uuid.UUID(int=42)
    partitions = [
        ProduceRequest.TopicProduceData.PartitionProduceData(index=i, records=b)
        for i, b in enumerate(batches)
    ]
    partitions.append(ProduceRequest.TopicProduceData.PartitionProduceData(index=99, records=None))
    msg = ProduceRequest[version](
        transactional_id="txn-1" if version >= 3 else None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="orders", topic_id=topic_id, partition_data=partitions
            )
        ],
    )
    return request_frame(msg, correlation_id=correlation_id)


def sample_batches() -> list[bytes]:
    return [
        bytes(build_batch([RecordInput(b"v%d" % i, b"k", timestamp=1_700_000_000_123)] * 3))
        for i in range(2)
    ]


@pytest.mark.parametrize("version", range(produce.MIN_VERSION, produce.MAX_VERSION + 1))
def test_produce_matches_kafka_python_and_kio(version: int) -> None:
    batches = sample_batches()
    frame = produce_frame(version, batches)
    req = messages.decode_request(frame)
    body = req.body
    assert isinstance(body, ProduceRequestData)
    assert (body.version, body.transactional_id, body.acks, body.timeout_ms) == (
        version,
        "txn-1",
        -1,
        30000,
    )
    (topic,) = body.topics
    assert topic.name == "orders"
    assert [p.index for p in topic.partitions] == [0, 1, 99]
    assert [None if p.records is None else bytes(p.records) for p in topic.partitions] == [
        *batches,
        None,
    ]
    # kio's own (copying) decoder agrees on everything.
    schema = load_request_schema(0, version)
    _, body_pos = headers.decode_request_header(frame, req.header.header_version)
    kio_body, _ = entity_reader(schema)(frame, body_pos)
    (kio_topic,) = kio_body.topic_data
    assert [p.records for p in kio_topic.partition_data] == [*batches, None]


@pytest.mark.parametrize("version", [3, 8, 9, 11])
def test_records_are_views_into_the_frame(version: int) -> None:
    frame = produce_frame(version, sample_batches())
    (view,) = FrameDecoder().feed(b"".join(bytes(p) for p in encode_frame([frame])))
    req = messages.decode_request(view)
    records = req.body.topics[0].partitions[0].records
    assert records is not None and records.readonly
    assert records.obj is view.obj  # the frame's own bytes object, not a copy
    header = record_batch.validate_batch(records)
    assert header.records_count == 3


@pytest.mark.parametrize("version", [12, 13])
def test_versions_above_kafka_3_9s_are_not_decoded(version: int) -> None:
    # v12 (Kafka 4.0, KIP-890 part 2) and v13 (topic ids, KIP-516): not advertised, not decoded,
    # refused like any version the codec does not know
    with pytest.raises(UnsupportedVersionError) as info:
        messages.decode_request(produce_frame(version, sample_batches(), correlation_id=8))
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (
        0,
        version,
        8,
    )


def test_writable_frame_records_follow_the_frame_buffer() -> None:
    # A read-only memoryview over a bytearray is used as is: mutations show through.
    buf = bytearray(produce_frame(9, sample_batches()))
    req = messages.decode_request(memoryview(buf).toreadonly())
    records = req.body.topics[0].partitions[0].records
    first = records[0]
    buf[buf.index(bytes(records[:20]))] ^= 0xFF
    assert records[0] == first ^ 0xFF


@pytest.mark.parametrize("version", [3, 9])
def test_records_overrunning_the_frame_are_rejected(version: int) -> None:
    frame = produce_frame(version, sample_batches(), correlation_id=8)
    with pytest.raises(InvalidRequestError) as info:
        messages.decode_request(frame[:-40])
    assert info.value.correlation_id == 8


# -- response encoding: byte for byte what kio encodes --------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from protocol import build  # noqa: E402
from protocol.fetch import NodeEndpoint  # noqa: E402
from protocol.messages import ResponseHeaderInfo, encode_response, response_schema  # noqa: E402
from protocol.produce import (  # noqa: E402
    ProducePartitionResponse,
    RecordError,
    encode_produce_response,
)

_int64 = st.integers(-(1 << 63), (1 << 63) - 1)
_partition = st.builds(
    ProducePartitionResponse,
    index=st.integers(0, (1 << 31) - 1),
    error_code=st.integers(-1, 120),
    base_offset=_int64,
    log_append_time_ms=st.just(-1) | st.integers(0, 4_000_000_000_000),
    log_start_offset=_int64,
    error_message=st.none() | st.text(max_size=40),
    record_errors=st.lists(
        st.builds(RecordError, st.integers(0, 1000), st.none() | st.text(max_size=40)),
        max_size=3,
    ).map(tuple),
    # (leader_id, leader_epoch) of a KIP-951 hint, sent from v10; never Kafka's default -1/-1
    current_leader=st.none() | st.tuples(st.integers(0, 1000), st.integers(0, (1 << 31) - 1)),
)
_endpoints = st.lists(
    st.builds(
        NodeEndpoint,
        st.integers(0, 1000),
        st.text(min_size=1, max_size=20),
        st.integers(1, 65535),
        st.none() | st.text(max_size=10),
    ),
    max_size=3,
)
_topics = st.lists(
    st.tuples(st.text(min_size=1, max_size=30), st.lists(_partition, max_size=4)), max_size=4
)


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(produce.MIN_VERSION, produce.MAX_VERSION),
    correlation_id=st.integers(-(1 << 31), (1 << 31) - 1),
    topics=_topics,
    throttle=st.integers(0, (1 << 31) - 1),
    endpoints=_endpoints,
)
def test_response_encoding_is_kios(
    version: int, correlation_id: int, topics: list, throttle: int, endpoints: list
) -> None:
    _assert_encoding_is_kios(version, correlation_id, topics, throttle, endpoints)


# the common response (one topic, one partition, no message or record errors), which
# ``encode_produce_response`` builds in one pass; names past 126 bytes take the general path
@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(produce.MIN_VERSION, produce.MAX_VERSION),
    correlation_id=st.integers(-(1 << 31), (1 << 31) - 1),
    name=st.text(min_size=1, max_size=30) | st.text(min_size=120, max_size=140),
    partition=_partition.map(
        lambda p: ProducePartitionResponse(
            p.index, p.error_code, p.base_offset, p.log_append_time_ms, p.log_start_offset
        )
    ),
    throttle=st.integers(0, (1 << 31) - 1),
)
def test_one_partition_response_is_kios(
    version: int,
    correlation_id: int,
    name: str,
    partition: ProducePartitionResponse,
    throttle: int,
) -> None:
    _assert_encoding_is_kios(version, correlation_id, [(name, [partition])], throttle)


def _assert_encoding_is_kios(
    version: int, correlation_id: int, topics: list, throttle: int, endpoints: list = ()
) -> None:
    ours = b"".join(
        bytes(b)
        for b in encode_produce_response(version, correlation_id, topics, throttle, endpoints)
    )
    body = build.build(
        response_schema(0, version),
        {
            "throttle_time": throttle,
            "node_endpoints": [
                {"node_id": e.node_id, "host": e.host, "port": e.port, "rack": e.rack}
                for e in endpoints
            ],
            "responses": [
                {
                    "name": name,
                    "partition_responses": [
                        {
                            "index": p.index,
                            "error_code": p.error_code,
                            "base_offset": p.base_offset,
                            "log_append_time": p.log_append_time_ms,
                            "log_start_offset": p.log_start_offset,
                            "error_message": p.error_message,
                            "current_leader": {
                                "leader_id": (p.current_leader or (-1, -1))[0],
                                "leader_epoch": (p.current_leader or (-1, -1))[1],
                            },
                            "record_errors": [
                                {
                                    "batch_index": e.batch_index,
                                    "batch_index_error_message": e.message,
                                }
                                for e in p.record_errors
                            ],
                        }
                        for p in parts
                    ],
                }
                for name, parts in topics
            ],
        },
    )
    info = ResponseHeaderInfo(correlation_id=correlation_id, api_key=0, api_version=version)
    theirs = b"".join(bytes(b) for b in encode_response(info, body))
    assert ours == theirs


# -- the common request: one topic, one partition (librdkafka's), read in one pass -----------


@settings(max_examples=300, deadline=None)
@given(
    version=st.integers(produce.FIRST_FLEXIBLE_VERSION, produce.MAX_VERSION),
    transactional_id=st.none() | st.text(max_size=10),
    acks=st.sampled_from([-1, 0, 1]),
    timeout_ms=st.integers(-(1 << 31), (1 << 31) - 1),
    name=st.text(max_size=30) | st.text(min_size=120, max_size=140),
    index=st.integers(-(1 << 31), (1 << 31) - 1),
    records=st.none() | st.binary(max_size=300),
)
def test_one_partition_request_is_read_as_kio_and_the_general_decoder_read_it(
    version: int,
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    name: str,
    index: int,
    records: bytes | None,
) -> None:
    partition = ProduceRequest.TopicProduceData.PartitionProduceData(index=index, records=records)
    frame = request_frame(
        ProduceRequest[version](
            transactional_id=transactional_id,
            acks=acks,
            timeout_ms=timeout_ms,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=name, topic_id=uuid.UUID(int=1), partition_data=[partition]
                )
            ],
        )
    )
    req = messages.decode_request(frame)
    body = req.body
    (topic,) = body.topics
    (ours,) = topic.partitions
    assert (body.transactional_id, body.acks, body.timeout_ms, topic.name, ours.index) == (
        transactional_id,
        acks,
        timeout_ms,
        name,
        index,
    )
    assert (None if ours.records is None else bytes(ours.records)) == records
    _, pos = headers.decode_request_header(frame, req.header.header_version)
    kio_body, _ = entity_reader(load_request_schema(0, version))(frame, pos)
    (kio_topic,) = kio_body.topic_data
    assert (kio_topic.name, kio_topic.partition_data[0].records) == (name, records)
    # the one-pass read (where it applies) and the general one give the same request
    general = produce._decode_flexible(memoryview(frame), pos, version)
    assert _plain(general) == _plain(body)


def _plain(body: ProduceRequestData) -> tuple:
    """The request's fields, its records as bytes."""
    topics = [
        (t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partitions])
        for t in body.topics
    ]
    return body.version, body.transactional_id, body.acks, body.timeout_ms, topics


def _one_partition_frame() -> bytes:
    partition = ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=sample_batches()[0]
    )
    topic = ProduceRequest.TopicProduceData(
        name="t", topic_id=uuid.UUID(int=1), partition_data=[partition]
    )
    return request_frame(
        ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=100, topic_data=[topic])
    )


def test_a_byte_past_the_end_leaves_the_request_to_the_general_decoder() -> None:
    frame = _one_partition_frame()
    longer = frame + b"\x00"
    _, pos = headers.decode_request_header(longer, 2)
    assert produce._decode_one(memoryview(longer), pos, 9) is None
    assert _plain(messages.decode_request(longer).body) == _plain(
        messages.decode_request(frame).body
    )


@pytest.mark.parametrize(
    "tags",
    [
        b"\x00\x00\x01",  # the body's tagged fields: a count with none behind it
        b"\x01\x00\x00",  # the partition's: one tag, the topic's then cut off
    ],
)
def test_tagged_fields_leave_the_request_to_the_general_decoder(tags: bytes) -> None:
    frame = _one_partition_frame()[:-3] + tags
    _, pos = headers.decode_request_header(frame, 2)
    assert produce._decode_one(memoryview(frame), pos, 9) is None
    with pytest.raises(InvalidRequestError):
        messages.decode_request(frame)


# -- the request's own record rules (Kafka's ProduceRequest.validateRecords) -------------------

_ONE = bytes(build_batch([RecordInput(b"v", b"k")]))
_ZSTD = bytes(build_batch([RecordInput(b"v", b"k")], compression=Compression.ZSTD))
_LEGACY = bytes(8) + (14).to_bytes(4, "big") + bytes(4) + b"\x01" + bytes(9)  # a magic-1 message


def _with_magic(batch: bytes, magic: int) -> bytes:
    return (
        batch[: record_batch.MAGIC_OFFSET] + bytes([magic]) + batch[record_batch.MAGIC_OFFSET + 1 :]
    )


@pytest.mark.parametrize(
    ("records", "version", "code"),
    [
        (_ONE, 3, None),
        (_ONE + _ONE[:30], 9, None),  # a trailing part is not a batch here (the log refuses it)
        (_ZSTD, 7, None),
        (b"", 9, ErrorCode.INVALID_RECORD),
        (_ONE[:11], 9, ErrorCode.INVALID_RECORD),
        (_ONE[:-1], 9, ErrorCode.INVALID_RECORD),
        (_LEGACY, 9, ErrorCode.INVALID_RECORD),
        (_ONE + _ONE, 9, ErrorCode.INVALID_RECORD),
        (_ONE + _LEGACY, 9, ErrorCode.INVALID_RECORD),
        (_ZSTD, 6, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
        (_ZSTD, 3, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
        (_with_magic(_ONE, 3), 9, ErrorCode.CORRUPT_MESSAGE),
        (_with_magic(_ONE, 0xFF), 9, ErrorCode.CORRUPT_MESSAGE),
        (_ONE[:8] + (13).to_bytes(4, "big") + _ONE[12:], 9, ErrorCode.CORRUPT_MESSAGE),
        (_ONE + _with_magic(_ONE, 7), 9, ErrorCode.CORRUPT_MESSAGE),
    ],
)
def test_records_are_checked_as_kafka_checks_a_produce_request(
    records: bytes, version: int, code: ErrorCode | None
) -> None:
    refused = produce.records_error(version, memoryview(records))
    assert (refused[0] if refused else None) == code
    if refused is not None:
        assert f"version {version}" in refused[1] or code == ErrorCode.CORRUPT_MESSAGE


def test_null_records_are_left_to_the_partition() -> None:
    assert produce.records_error(9, None) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(produce.MIN_VERSION, produce.MAX_VERSION))
def test_any_records_get_an_answer_or_none(records: bytes, version: int) -> None:
    refused = produce.records_error(version, memoryview(records))
    assert refused is None or (isinstance(refused[0], ErrorCode) and refused[1])
