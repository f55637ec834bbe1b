"""Fetch response encode: byte-identical to kio, readable by kafka-python, records uncopied.
Fetch request decode: what kio's generic reader reads, for every version."""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse
from kio.serial import entity_writer
from kio.static.primitive import i32Timedelta

from protocol import fetch, headers, messages
from protocol.api_keys import ApiKey
from protocol.entity_reader import read_entity
from protocol.errors import ErrorCode
from protocol.messages import BufferCollector
from protocol.records import RecordInput, build_batch, parse_records

TOPIC_ID = uuid.UUID(int=0xABCDEF)


def batches() -> list[bytes]:
    big = [RecordInput(b"x" * 5000, b"k", timestamp=1_700_000_000_001)]
    small = [RecordInput(b"s", None, [("h", b"1")], 1_700_000_000_002)]
    return [
        bytes(build_batch(big, base_offset=10)),
        bytes(build_batch(small, base_offset=11)),
    ]


def topics(records: list[bytes]) -> list[fetch.FetchTopicResult]:
    return [
        fetch.FetchTopicResult(
            name="orders",
            topic_id=TOPIC_ID,
            partitions=[
                fetch.FetchPartitionResult(
                    partition_index=0,
                    high_watermark=12,
                    last_stable_offset=12,
                    log_start_offset=0,
                    aborted_transactions=[fetch.AbortedTransaction(7, 3)],
                    records=[memoryview(r) for r in records],
                ),
                fetch.FetchPartitionResult(
                    partition_index=1,
                    error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    current_leader=(2, 9),
                    records=None,
                ),
                # a read_committed consumer's partition without aborted transactions
                fetch.FetchPartitionResult(
                    partition_index=2,
                    high_watermark=12,
                    last_stable_offset=11,
                    log_start_offset=10,
                    aborted_transactions=[],
                    records=[memoryview(r) for r in reversed(records)],
                    records_size=sum(len(r) for r in records),
                ),
                # a read_uncommitted consumer's
                fetch.FetchPartitionResult(
                    partition_index=3,
                    high_watermark=12,
                    last_stable_offset=12,
                    log_start_offset=10,
                    records=[memoryview(r) for r in records[1:]],
                ),
            ],
        )
    ]


def kio_encoding(version: int, correlation_id: int, records: list[bytes]) -> bytes:
    """The same response built and written by kio (records joined into one bytes)."""
    mod: Any = importlib.import_module(f"kio.schema.fetch.v{version}.response")
    p0: dict[str, Any] = dict(
        partition_index=0,
        error_code=ErrorCode.NONE,
        high_watermark=12,
        last_stable_offset=12,
        aborted_transactions=(mod.AbortedTransaction(producer_id=7, first_offset=3),),
        records=b"".join(records),
    )
    p1: dict[str, Any] = dict(
        partition_index=1,
        error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
        high_watermark=-1,
        last_stable_offset=-1,
        aborted_transactions=None,
        records=None,
    )
    p2: dict[str, Any] = dict(
        partition_index=2,
        error_code=ErrorCode.NONE,
        high_watermark=12,
        last_stable_offset=11,
        aborted_transactions=(),
        records=b"".join(reversed(records)),
    )
    p3: dict[str, Any] = dict(
        partition_index=3,
        error_code=ErrorCode.NONE,
        high_watermark=12,
        last_stable_offset=12,
        aborted_transactions=None,
        records=b"".join(records[1:]),
    )
    if version >= 5:
        p0["log_start_offset"] = 0
        p1["log_start_offset"] = -1
        p2["log_start_offset"] = p3["log_start_offset"] = 10
    if version >= 11:
        for p in (p0, p1, p2, p3):
            p["preferred_read_replica"] = -1
    if version >= 12:
        p1["current_leader"] = mod.LeaderIdAndEpoch(leader_id=2, leader_epoch=9)
    topic: dict[str, Any] = dict(partitions=tuple(mod.PartitionData(**p) for p in (p0, p1, p2, p3)))
    if version >= 13:
        topic["topic_id"] = TOPIC_ID
    else:
        topic["topic"] = "orders"
    body: dict[str, Any] = dict(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        responses=(mod.FetchableTopicResponse(**topic),),
    )
    if version >= 7:
        body["error_code"] = ErrorCode.NONE
        body["session_id"] = 0
    response = mod.FetchResponse(**body)
    out = BufferCollector()
    entity_writer(type(response))(out, response)  # type: ignore[arg-type]
    header = headers.encode_response_header(correlation_id, 1 if version >= 12 else 0)
    return header + b"".join(bytes(p) for p in out.finish())


@pytest.mark.parametrize("version", range(fetch.MIN_VERSION, fetch.MAX_VERSION + 1))
def test_fetch_response_is_byte_identical_to_kio(version: int) -> None:
    records = batches()
    parts = fetch.encode_fetch_response(version, 321, topics(records))
    data = b"".join(bytes(p) for p in parts)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert data[4:] == kio_encoding(version, 321, records)


@pytest.mark.parametrize("version", range(fetch.MIN_VERSION, fetch.MAX_VERSION + 1))
def test_fetch_response_decodes_with_kafka_python(version: int) -> None:
    records = batches()
    data = b"".join(bytes(p) for p in fetch.encode_fetch_response(version, 5, topics(records)))
    decoded = FetchResponse.decode(data[4:], version=version, header=True)
    assert decoded.header.correlation_id == 5
    (topic,) = decoded.responses
    p0, p1, p2, p3 = topic.partitions
    assert p0.high_watermark == 12 and p1.error_code == 6
    assert (p2.last_stable_offset, p3.high_watermark) == (11, 12)
    raw = p0.records if isinstance(p0.records, bytes | bytearray) else bytes(p0.records)
    assert raw == b"".join(records)
    assert [r.offset for r in parse_records(records[0])] == [10]


def test_large_record_buffers_are_passed_through() -> None:
    records = batches()
    views = [memoryview(r) for r in records]
    result = [fetch.FetchTopicResult("t", [fetch.FetchPartitionResult(0, records=views)])]
    parts = fetch.encode_fetch_response(11, 1, result)
    assert any(p is views[0] for p in parts)  # 5 KB batch: not copied
    assert not any(p is views[1] for p in parts)  # tiny batch: folded into the fields


def test_node_endpoints_tag_v16() -> None:
    endpoints = [fetch.NodeEndpoint(2, "broker-2", 9092, None)]
    data = b"".join(
        bytes(p)
        for p in fetch.encode_fetch_response(16, 1, topics(batches()), node_endpoints=endpoints)
    )
    decoded = FetchResponse.decode(data[4:], version=16, header=True)
    assert [(e.node_id, e.host, e.port) for e in decoded.node_endpoints] == [(2, "broker-2", 9092)]


# -- the request: read field by field, as the generic reader reads it ----------------------------


def _request_types(version: int) -> tuple[Any, Any, Any, Any]:
    m = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    return m.FetchRequest, m.FetchTopic, m.FetchPartition, getattr(m, "ForgottenTopic", None)


def _fields(cls: Any, values: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
NAMES = st.text(min_size=0, max_size=12)


@st.composite
def fetch_requests(draw: st.DrawFn, version: int) -> Any:
    request, topic, partition, forgotten = _request_types(version)

    def named(cls: Any, partitions: Any) -> Any:
        return _fields(
            cls,
            {
                "topic": draw(NAMES),
                "topic_id": uuid.UUID(int=draw(st.integers(1, (1 << 128) - 1))),
                "partitions": partitions,
            },
        )

    topics = tuple(
        named(
            topic,
            tuple(
                _fields(
                    partition,
                    {
                        "partition": draw(INT32),
                        "current_leader_epoch": draw(INT32),
                        "fetch_offset": draw(INT64),
                        "last_fetched_epoch": draw(INT32),
                        "log_start_offset": draw(INT64),
                        "partition_max_bytes": draw(INT32),
                    },
                )
                for _ in range(draw(st.integers(0, 4)))
            ),
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    gone = ()
    if forgotten is not None:
        gone = tuple(
            named(forgotten, tuple(draw(st.lists(INT32, max_size=3))))
            for _ in range(draw(st.integers(0, 2)))
        )
    return _fields(
        request,
        {
            "replica_id": draw(INT32),
            "max_wait": datetime.timedelta(milliseconds=draw(INT32)),
            "min_bytes": draw(INT32),
            "max_bytes": draw(INT32),
            "isolation_level": draw(st.integers(-128, 127)),
            "session_id": draw(INT32),
            "session_epoch": draw(INT32),
            "topics": topics,
            "forgotten_topics_data": gone,
            "rack_id": draw(NAMES),
        },
    )


@pytest.mark.parametrize("version", range(fetch.MIN_VERSION, fetch.MAX_VERSION + 1))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_fetch_request_reads_as_the_generic_reader_reads_it(version: int, data: Any) -> None:
    request = data.draw(fetch_requests(version))
    buf = io.BytesIO()
    entity_writer(type(request))(buf, request)
    body = b"\x00\x01" + buf.getvalue()  # not at the frame's start, as after a header
    read = fetch.decode_fetch_request(body, 2, version)
    assert read is not None
    assert read_entity(type(request), body, 2)[0] == request
    assert_reads_as(read, request)


def assert_reads_as(read: Any, kio: Any) -> None:
    """``read`` (the decoder's named tuples) holds what kio's ``kio`` does: each of kio's
    fields it has (entities and their tuples compared the same way), and kio's others at their
    defaults (nothing a request read here can carry)."""
    have = getattr(read, "_fields", ())
    for f in dataclasses.fields(kio):
        value = getattr(kio, f.name)
        if f.name == "max_wait":
            assert read.max_wait == value == datetime.timedelta(milliseconds=read.max_wait_ms)
        elif f.name not in have:
            default = f.default
            if default is dataclasses.MISSING:
                default = f.default_factory()  # type: ignore[misc]
            assert value == default, f.name
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            assert len(getattr(read, f.name)) == len(value), f.name
            for ours, theirs in zip(getattr(read, f.name), value, strict=True):
                assert_reads_as(ours, theirs)
        else:
            assert getattr(read, f.name) == value, f.name


@pytest.mark.parametrize("version", [12, 15, 17])
def test_a_fetch_request_with_tagged_fields_is_left_to_the_generic_reader(version: int) -> None:
    request = _request_types(version)[0]
    with_cluster = _fields(
        request,
        {
            "cluster_id": "c",
            "replica_id": -1,
            "max_wait": datetime.timedelta(milliseconds=500),
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": (),
            "forgotten_topics_data": (),
            "rack_id": "",
        },
    )
    buf = io.BytesIO()
    entity_writer(request)(buf, with_cluster)
    assert fetch.decode_fetch_request(buf.getvalue(), 0, version) is None
    frame = headers_frame(ApiKey.FETCH, version) + buf.getvalue()
    assert messages.decode_request(frame).body == with_cluster


def test_a_request_read_here_is_what_the_handler_reads() -> None:
    """The handler reads a request the same way whether this decoder or kio's generic reader
    read it: its wait as a timedelta, its topics' names or ids, partitions' fields by name."""
    request = _request_types(12)[0]
    kio_request = _fields(
        request,
        {
            "replica_id": -1,
            "max_wait": datetime.timedelta(milliseconds=500),
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 1,
            "session_id": 0,
            "session_epoch": -1,
            "topics": (
                _request_types(12)[1](
                    topic="t",
                    partitions=(
                        _request_types(12)[2](
                            partition=3, fetch_offset=1 << 40, partition_max_bytes=1 << 20
                        ),
                    ),
                ),
            ),
            "forgotten_topics_data": (),
            "rack_id": "",
        },
    )
    buf = io.BytesIO()
    entity_writer(request)(buf, kio_request)
    read = fetch.decode_fetch_request(buf.getvalue(), 0, 12)
    assert isinstance(read, fetch.FetchRequestData)
    assert read.max_wait == datetime.timedelta(milliseconds=500) and read.max_wait_ms == 500
    (topic,) = read.topics
    (p,) = topic.partitions
    assert (topic.topic, p.partition, p.fetch_offset, p.partition_max_bytes) == (
        "t",
        3,
        1 << 40,
        1 << 20,
    )
    assert (p.current_leader_epoch, p.last_fetched_epoch, p.log_start_offset) == (-1, -1, -1)


def headers_frame(api_key: int, version: int) -> bytes:
    """A request header (v2: flexible; v1 before) for ``api_key`` at ``version``."""
    flexible = version >= fetch.FIRST_FLEXIBLE_VERSION
    head = struct.pack(">hhih", api_key, version, 7, 2) + b"id"
    return head + (b"\x00" if flexible else b"")
