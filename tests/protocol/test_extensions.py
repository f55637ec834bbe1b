"""The extension APIs' codec: byte layouts, round trips, and fuzzing of every decoder.

A decoder that leaks another exception type, or allocates from a count on the wire, would let
one malformed request (or answer) take down the broker (or a job's driver); the properties
here pin down that only the codec's own errors come out.
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsResponse  # type: ignore[import-untyped]

from protocol import api_versions, messages, wire
from protocol import extensions as ext
from protocol.errors import InvalidRequestError, ProtocolError, UnsupportedVersionError

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VERSIONS = [
    (m.api_key, v) for m in ext.MESSAGES.values() for v in range(m.min_version, m.max_version + 1)
]
SIDES = ["request", "response"]


# -- strategies from the schemas --------------------------------------------------------------

_PRIMITIVES: dict[ext.Kind, st.SearchStrategy[Any]] = {
    ext.Kind.INT8: st.integers(-(1 << 7), (1 << 7) - 1),
    ext.Kind.INT16: st.integers(-(1 << 15), (1 << 15) - 1),
    ext.Kind.INT32: st.integers(-(1 << 31), (1 << 31) - 1),
    ext.Kind.INT64: st.integers(-(1 << 63), (1 << 63) - 1),
    ext.Kind.BOOL: st.booleans(),
    ext.Kind.STRING: st.text(max_size=12),
    ext.Kind.NULLABLE_STRING: st.none() | st.text(max_size=12),
    ext.Kind.UUID: st.uuids(),
    ext.Kind.BYTES: st.binary(max_size=12),
    ext.Kind.NULLABLE_BYTES: st.none() | st.binary(max_size=12),
}


def values(t: ext.Kind | ext.Array | ext.Struct, version: int) -> st.SearchStrategy[Any]:
    """Any value of ``t`` at ``version``; fields the version lacks hold their default, as the
    decoder fills them in."""
    if isinstance(t, ext.Struct):
        return st.fixed_dictionaries(
            {
                f.name: values(f.type, version)
                if f.since <= version
                else st.just(f.default_value())
                for f in t.fields
            }
        )
    if isinstance(t, ext.Array):
        return st.lists(values(t.item, version), max_size=3)
    return _PRIMITIVES[t]


@st.composite
def bodies(draw: st.DrawFn) -> tuple[int, int, str, dict[str, Any]]:
    api_key, version = draw(st.sampled_from(VERSIONS))
    side = draw(st.sampled_from(SIDES))
    schema = getattr(ext.MESSAGES[api_key], side)
    return api_key, version, side, draw(values(schema, version))


def encode(api_key: int, version: int, side: str, body: dict[str, Any], cid: int = 7) -> bytes:
    """The frame without its size prefix, as the decoders take it."""
    if side == "request":
        frame = ext.encode_request(api_key, version, cid, body, "test")
    else:
        frame = ext.encode_response(api_key, version, cid, body)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    return frame[4:]


def decode(api_key: int, version: int, side: str, frame: bytes) -> tuple[int, dict[str, Any]]:
    if side == "request":
        header, body = ext.decode_request(frame)
        assert (header.api_key, header.api_version) == (api_key, version)
        return header.correlation_id, body
    return ext.decode_response(api_key, version, frame)


# -- byte layouts -----------------------------------------------------------------------------


def test_prepare_s3_object_request_layout() -> None:
    """Header v2 (int16 client id length, empty tags), then AutoMQ's three fields and tags."""
    frame = ext.encode_request(
        505, 0, 9, {"node_id": 3, "prepared_count": 2, "time_to_live_in_ms": 60_000}, "c"
    )
    expected = (
        struct.pack(">hhih", 505, 0, 9, 1) + b"c\x00" + struct.pack(">iiq", 3, 2, 60_000) + b"\x00"
    )
    assert frame == struct.pack(">i", len(expected)) + expected


def test_commit_stream_set_object_layout() -> None:
    """AutoMQ's field order, compact arrays (count + 1), a tag section closing each struct;
    v1 adds ``attributes`` to the stream objects and to the request."""
    body = {
        "node_id": 1,
        "node_epoch": 2,
        "object_id": 3,
        "order_id": 4,
        "object_size": 5,
        "object_stream_ranges": [
            {"stream_id": 6, "stream_epoch": 7, "start_offset": 8, "end_offset": 9}
        ],
        "stream_objects": [
            {
                "object_id": 10,
                "object_size": 11,
                "stream_id": 12,
                "start_offset": 13,
                "end_offset": 14,
                "attributes": 15,
            }
        ],
        "compacted_object_ids": [16, 17],
        "failover_mode": True,
        "attributes": 18,
    }
    v0 = encode(506, 0, "request", body)
    v1 = encode(506, 1, "request", body)
    fields = struct.pack(">iqqqq", 1, 2, 3, 4, 5)
    ranges = b"\x02" + struct.pack(">qqqq", 6, 7, 8, 9) + b"\x00"
    so = struct.pack(">qqqqq", 10, 11, 12, 13, 14)
    ids = b"\x03" + struct.pack(">qq", 16, 17)
    header = struct.pack(">hhih", 506, 0, 7, 4) + b"test\x00"
    assert v0 == header + fields + ranges + b"\x02" + so + b"\x00" + ids + b"\x01\x00"
    header1 = struct.pack(">hhih", 506, 1, 7, 4) + b"test\x00"
    assert v1 == (
        header1
        + fields
        + ranges
        + b"\x02"
        + so
        + struct.pack(">i", 15)
        + b"\x00"
        + ids
        + b"\x01"
        + struct.pack(">i", 18)
        + b"\x00"
    )
    # v0 has no attributes: they decode as the default
    _, decoded = decode(506, 0, "request", v0)
    assert decoded["attributes"] == 0 and decoded["stream_objects"][0]["attributes"] == 0


def test_commit_stream_object_keeps_automq_field_order() -> None:
    """``stream_epoch`` comes after ``source_object_ids`` (it was added later in AutoMQ)."""
    frame = encode(
        507,
        0,
        "request",
        {
            "node_id": 1,
            "node_epoch": 2,
            "object_id": 3,
            "object_size": 4,
            "stream_id": 5,
            "start_offset": 6,
            "end_offset": 7,
            "source_object_ids": [8],
            "stream_epoch": 9,
        },
    )
    body = frame[struct.calcsize(">hhih") + len("test") + 1 :]
    assert (
        body
        == struct.pack(">iqqqqqq", 1, 2, 3, 4, 5, 6, 7)
        + b"\x02"
        + struct.pack(">q", 8)
        + struct.pack(">q", 9)
        + b"\x00"
    )


def test_left_out_fields_take_defaults() -> None:
    _, body = decode(507, 0, "request", encode(507, 0, "request", {}))
    assert body["stream_epoch"] == -1 and body["source_object_ids"] == []
    cid, answer = decode(1000, 0, "response", encode(1000, 0, "response", {"error_code": 509}))
    assert cid == 7
    assert answer == {
        "error_code": 509,
        "throttle_time_ms": 0,
        "now_ms": 0,
        "next_object_id": 0,
        "streams": [],
        "nodes": [],
        "objects": [],
    }


def test_describe_log_segments_v1_adds_a_policy_filter_lags_and_first_timestamps() -> None:
    """v1's fields are appended: a v0 peer neither sends nor reads them, and what a v0 frame
    leaves out decodes as Kafka's defaults (every topic; lags 0 and Long.MAX_VALUE; no first
    batch timestamp)."""
    asked = {"topics": ["a"], "cleanup_policy": "compact"}
    _, v1 = decode(1003, 1, "request", encode(1003, 1, "request", asked))
    assert v1 == asked
    v0_frame = encode(1003, 0, "request", asked)
    assert v0_frame == encode(1003, 0, "request", {"topics": ["a"]})
    _, v0 = decode(1003, 0, "request", v0_frame)
    assert v0 == {"topics": ["a"], "cleanup_policy": ""}

    segment = {
        "base_offset": 0,
        "next_offset": 5,
        "size_bytes": 100,
        "max_timestamp": 9,
        "cleaned": False,
        "first_batch_timestamp": 7,
    }
    topic = {
        "name": "a",
        "topic_id": uuid.UUID(int=1),
        "cleanup_policy": "compact",
        "retention_ms": 1,
        "retention_bytes": -1,
        "delete_retention_ms": 2,
        "min_cleanable_dirty_ratio": "0.5",
        "min_compaction_lag_ms": 3,
        "max_compaction_lag_ms": 4,
        "partitions": [{"partition_index": 0, "segments": [segment]}],
    }
    answer = {"now_ms": 10, "topics": [topic]}
    _, v1_answer = decode(1003, 1, "response", encode(1003, 1, "response", answer))
    (t1,) = v1_answer["topics"]
    assert (t1["min_compaction_lag_ms"], t1["max_compaction_lag_ms"]) == (3, 4)
    assert t1["partitions"][0]["segments"][0] == segment
    _, v0_answer = decode(1003, 0, "response", encode(1003, 0, "response", answer))
    (t0,) = v0_answer["topics"]
    assert (t0["min_compaction_lag_ms"], t0["max_compaction_lag_ms"]) == (0, (1 << 63) - 1)
    assert t0["partitions"][0]["segments"][0] == {**segment, "first_batch_timestamp": 0}


def test_describe_s3_metadata_answer_round_trips() -> None:
    answer = {
        "error_code": 0,
        "throttle_time_ms": 0,
        "now_ms": 1_700_000_000_000,
        "next_object_id": 42,
        "streams": [
            {
                "stream_id": 1,
                "epoch": 3,
                "state": 1,
                "start_offset": 0,
                "end_offset": 100,
                "ranges": [
                    {
                        "range_index": 0,
                        "epoch": 3,
                        "start_offset": 0,
                        "end_offset": 100,
                        "node_id": 0,
                    }
                ],
                "stream_objects": [
                    {"object_id": 7, "start_offset": 0, "end_offset": 50, "object_size": 1000}
                ],
            }
        ],
        "nodes": [
            {
                "node_id": 0,
                "node_epoch": 2,
                "failover": False,
                "stream_set_objects": [
                    {
                        "object_id": 8,
                        "order_id": 8,
                        "data_time_ms": 5,
                        "object_size": 99,
                        "ranges": [{"stream_id": 1, "start_offset": 50, "end_offset": 100}],
                    }
                ],
            }
        ],
        "objects": [
            {
                "object_id": 8,
                "state": 2,
                "object_size": 99,
                "prepared_ms": 1,
                "expires_ms": 2,
                "committed_ms": 3,
                "mark_destroyed_ms": -1,
            }
        ],
    }
    assert decode(1000, 0, "response", encode(1000, 0, "response", answer)) == (7, answer)


def test_unknown_tagged_fields_are_skipped() -> None:
    """KIP-482: a newer sender's tags, in the header, the body and a nested struct."""
    tags = b"\x02" + b"\x00\x03abc" + b"\x05\x00"  # two tags: 0 (3 bytes), 5 (empty)
    frame = struct.pack(">hhih", 1002, 0, 5, -1) + tags + b"\x03" + struct.pack(">qq", 1, 2) + tags
    header, body = ext.decode_request(frame)
    assert header.client_id is None and body == {"object_ids": [1, 2]}
    ranges = b"\x02" + struct.pack(">qqqq", 6, 7, 8, 9) + tags
    frame = (
        struct.pack(">hhih", 506, 0, 5, -1)
        + b"\x00"
        + struct.pack(">iqqqq", 1, 2, 3, 4, 5)
        + ranges
        + b"\x01\x01\x01"
        + b"\x00"
    )
    _, body = ext.decode_request(frame)
    assert body["object_stream_ranges"] == [
        {"stream_id": 6, "stream_epoch": 7, "start_offset": 8, "end_offset": 9}
    ]
    assert body["failover_mode"] is True


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        # an array announcing 2^32 - 2 ids in a few bytes: refused before any allocation
        (struct.pack(">hhih", 1002, 0, 1, -1) + b"\x00" + b"\xff\xff\xff\xff\x0f", "array of"),
        # a varint of six bytes
        (struct.pack(">hhih", 1002, 0, 1, -1) + b"\x00" + b"\xff" * 6, "varint"),
        # a truncated int32
        (struct.pack(">hhih", 505, 0, 1, -1) + b"\x00" + b"\x00\x00", "truncated int32"),
        # null array
        (struct.pack(">hhih", 1002, 0, 1, -1) + b"\x00\x00\x00", "null array"),
        # a string longer than the frame
        (struct.pack(">hhih", 1003, 0, 1, -1) + b"\x00\x02\x10ab\x00", "truncated string"),
        # a string that is not UTF-8
        (struct.pack(">hhih", 1003, 0, 1, -1) + b"\x00\x02\x02\xff\x00", "UTF-8"),
        # bytes after the body
        (struct.pack(">hhih", 1001, 0, 1, -1) + b"\x00\x00\x00", "after the body"),
        # a tagged field longer than the frame
        (struct.pack(">hhih", 1001, 0, 1, -1) + b"\x00\x01\x00\x09ab", "tagged field"),
    ],
)
def test_malformed_requests_raise_invalid_request(frame: bytes, error: str) -> None:
    with pytest.raises(InvalidRequestError, match=error) as info:
        ext.decode_request(frame)
    assert info.value.correlation_id == 1


def test_unknown_keys_and_versions() -> None:
    with pytest.raises(UnsupportedVersionError):
        ext.decode_request(struct.pack(">hhih", 1099, 0, 1, -1) + b"\x00\x00")
    with pytest.raises(UnsupportedVersionError):
        ext.decode_request(struct.pack(">hhih", 505, 1, 1, -1) + b"\x00\x00")
    with pytest.raises(ProtocolError):
        ext.decode_response(505, 3, b"\x00\x00\x00\x01\x00")
    with pytest.raises(ValueError):
        ext.encode_request(72, 0, 1, {})
    assert ext.serves(1003, 1) and not ext.serves(1003, 2) and not ext.serves(72, 0)


def test_encoder_refuses_bad_bodies() -> None:
    with pytest.raises(ValueError, match="no fields"):
        ext.encode_request(1002, 0, 1, {"object_id": [1]})
    with pytest.raises(ValueError, match="does not fit"):
        ext.encode_response(505, 0, 1, {"error_code": 1 << 15})
    with pytest.raises(ValueError, match="expected a sequence"):
        ext.encode_request(1002, 0, 1, {"object_ids": 5})
    with pytest.raises(ValueError, match="expected an int"):
        ext.encode_request(1002, 0, 1, {"object_ids": ["5"]})
    with pytest.raises(ValueError, match="bytes, more than"):
        ext.encode_request(1003, 0, 1, {"topics": ["x" * 40_000]})


def test_messages_decode_request_routes_extension_keys() -> None:
    """The broker's decoder reads extension frames with header v2 and a dict body, and still
    checks the broker's table first."""
    frame = ext.encode_request(1003, 0, 11, {"topics": ["a", "b"]}, "jobs")[4:]
    request = messages.decode_request(frame, {1003: (0, 0)})
    assert request.header.header_version == 2 and request.header.client_id == "jobs"
    assert request.body == {"topics": ["a", "b"], "cleanup_policy": ""}  # v0: every topic
    with pytest.raises(UnsupportedVersionError):
        messages.decode_request(frame, {18: (0, 4)})
    with pytest.raises(InvalidRequestError) as info:
        messages.decode_request(frame[:-1], {1003: (0, 0)})
    assert info.value.correlation_id == 11


def test_api_versions_lists_extension_keys() -> None:
    """kio's int16 api_key holds AutoMQ's and automq-py's keys; kafka-python decodes them."""
    supported = {0: (3, 11), 18: (0, 4)} | {
        k: (m.min_version, m.max_version) for k, m in ext.MESSAGES.items()
    }
    for version in range(5):
        data = b"".join(
            bytes(p) for p in api_versions.encode_api_versions_response(3, version, supported)
        )
        r: Any = ApiVersionsResponse.decode(data[4:], version=version, header=True)
        got = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
        assert got == supported


# -- properties -------------------------------------------------------------------------------


@FUZZ
@given(bodies())
def test_round_trip(case: tuple[int, int, str, dict[str, Any]]) -> None:
    api_key, version, side, body = case
    frame = encode(api_key, version, side, body)
    assert decode(api_key, version, side, frame) == (7, body)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, int, str, bytes]:
    api_key, version, side, body = draw(bodies())
    data = bytearray(encode(api_key, version, side, body))
    # requests: keep the fixed header so the mutation hits the body's decoding
    floor = 8 if side == "request" else 4
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "byte", "insert", "varint", "tail"]))
        pos = draw(st.integers(min(floor, len(data)), max(len(data) - 1, floor)))
        if kind == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "byte" and pos < len(data):
            data[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "varint":
            data[pos : pos + 1] = b"\xff\xff\xff\xff\x0f"
        elif kind == "tail":
            data += draw(st.binary(min_size=1, max_size=16))
    return api_key, version, side, bytes(data)


def _decode_or_error(api_key: int, version: int, side: str, frame: bytes) -> Any:
    try:
        return decode(api_key, version, side, frame)
    except InvalidRequestError as e:
        assert side == "request" and e.correlation_id is not None
    except ProtocolError:
        assert side == "response"
    return None


@FUZZ
@given(mutated())
def test_mutated_frames_decode_or_raise_protocol_errors(case: tuple[int, int, str, bytes]) -> None:
    """Whatever a mutation left, the decoder either refuses it with the codec's own error or
    reads a body that encodes back to a frame decoding to the same body."""
    api_key, version, side, frame = case
    note(frame.hex())
    decoded = _decode_or_error(api_key, version, side, frame)
    if decoded is not None:
        cid, body = decoded
        assert decode(api_key, version, side, encode(api_key, version, side, body, cid)) == (
            cid,
            body,
        )


@FUZZ
@given(
    st.sampled_from(VERSIONS),
    st.sampled_from(SIDES),
    st.binary(max_size=200),
)
def test_random_bodies_raise_only_protocol_errors(
    key_version: tuple[int, int], side: str, data: bytes
) -> None:
    api_key, version = key_version
    if side == "request":
        frame = struct.pack(">hhih", api_key, version, 3, -1) + b"\x00" + data
    else:
        frame = struct.pack(">i", 3) + b"\x00" + data
    _decode_or_error(api_key, version, side, frame)


@FUZZ
@given(st.binary(max_size=64))
def test_random_frames_raise_only_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        ext.decode_request(data)


def test_array_bound_uses_item_size() -> None:
    """Eight bytes left cannot hold two int64s: refused before reading any item."""
    frame = struct.pack(">hhih", 1002, 0, 1, -1) + b"\x00" + b"\x03" + b"\x00" * 8 + b"\x00"
    with pytest.raises(InvalidRequestError, match="array of 2 items"):
        ext.decode_request(frame)


def test_wire_uvarint_agrees_with_the_codec() -> None:
    for n in (0, 1, 127, 128, 16_383, 16_384, (1 << 32) - 1):
        assert wire.read_uvarint(wire.write_uvarint(n), 0) == (n, len(wire.write_uvarint(n)))


def test_uuid_fields_round_trip() -> None:
    topic_id = uuid.uuid4()
    answer = {
        "topics": [
            {
                "name": "t",
                "topic_id": topic_id,
                "cleanup_policy": "compact,delete",
                "retention_ms": -1,
                "retention_bytes": 1 << 40,
                "delete_retention_ms": 86_400_000,
                "min_cleanable_dirty_ratio": "0.5",
                "partitions": [
                    {
                        "partition_index": 0,
                        "error_code": 0,
                        "log_start_offset": 5,
                        "log_end_offset": 10,
                        "last_stable_offset": 8,
                        "segments": [
                            {
                                "base_offset": 0,
                                "next_offset": 10,
                                "size_bytes": 1234,
                                "max_timestamp": 99,
                                "cleaned": True,
                            }
                        ],
                    }
                ],
            }
        ]
    }
    _, body = decode(1003, 0, "response", encode(1003, 0, "response", answer))
    (topic,) = body["topics"]
    assert topic["topic_id"] == topic_id
    sent = answer["topics"][0]
    assert {k: topic[k] for k in sent if k != "partitions"} == {
        k: v for k, v in sent.items() if k != "partitions"
    }
