"""The controller's extension APIs on the Kafka wire: AutoMQ's and automq-py's own.

kio (Apache Kafka's message definitions) has none of these, so each message is described once
below as data, and one small codec encodes and decodes them all. Bodies are plain dicts keyed by
the snake-case field names (AutoMQ's JSON names: ``ObjectStreamRanges`` -> ``object_stream_ranges``,
``TimeToLiveInMs`` -> ``time_to_live_in_ms``); arrays are lists, ``uuid`` is ``uuid.UUID``.

=======  =========================  ========  ================================================
api_key  message                    versions  origin
=======  =========================  ========  ================================================
505      PrepareS3Object            0         AutoMQ (first 72, which is Kafka's PushTelemetry;
                                              AutoMQ moved it to 505, used here)
506      CommitStreamSetObject      0-1       AutoMQ
507      CommitStreamObject         0-1       AutoMQ (first 75, Kafka's DescribeTopicPartitions)
509      GetKVs                     0-1       AutoMQ
601      DescribeStreams            0         AutoMQ
1000     DescribeS3Metadata         0         automq-py: the whole stream/node/object image
1001     ExpirePreparedObjects      0         automq-py: PREPARED past deadline -> MARK_DESTROYED
1002     DestroyS3Objects           0         automq-py: MARK_DESTROYED objects are now deleted
1003     DescribeLogSegments        0-1       automq-py: partitions' segments and retention
                                              (v1: a cleanup.policy filter, compaction lags,
                                              segments' first batch timestamps)
1004     CommitCleanedSegment       0         automq-py: key compaction's output replaces
                                              sealed segments
=======  =========================  ========  ================================================

AutoMQ's field lists follow the newest JSON schemas in ``AutoMQ/automq``
(``clients/src/main/resources/common/message/``); fields of later versions that this broker
does not know (CommitStreamObject v2's compaction ``Operations``) are not served. The automq-py
messages (1000+, far above Kafka's 0-74 and AutoMQ's 500-6xx) use the same encoding.

Encoding: every version is flexible (KIP-482), like AutoMQ's ``"flexibleVersions": "0+"``.

================  ===========================================================================
part              encoding
================  ===========================================================================
request header    v2: api_key int16, api_version int16, correlation_id int32, client_id
                  NULLABLE_STRING (int16 length), TAGGED_FIELDS
response header   v1: correlation_id int32, TAGGED_FIELDS
int8..int64       big-endian; bool one byte (non-zero = true)
string            COMPACT_STRING: UNSIGNED_VARINT N+1, N UTF-8 bytes, N <= 32767 (0 = null,
                  only where nullable)
bytes             COMPACT_BYTES: UNSIGNED_VARINT N+1, N bytes (0 = null, only where nullable)
uuid              16 bytes
array             COMPACT_ARRAY: UNSIGNED_VARINT N+1, N items (null is refused)
struct            its fields in order, then TAGGED_FIELDS (none are defined: all are skipped)
================  ===========================================================================

Decoders check every length and count against the bytes left before reading (an array of N
items needs at least N times its item's smallest size), refuse trailing bytes, and raise only
``InvalidRequestError`` (requests; ``UnsupportedVersionError`` for an unknown key or version)
or ``ProtocolError`` (responses). Encoders refuse field names a message does not have; a field
left out takes its default (0, "", false, empty array, or the schema's own default).

Frames: ``encode_request``/``encode_response`` return whole frames, size prefix included;
``decode_request``/``decode_response`` take a frame with the size prefix stripped (what
``framing.FrameDecoder`` yields).
"""

from __future__ import annotations

import enum
import functools
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from protocol import headers, wire
from protocol.api_keys import ApiKey
from protocol.errors import InvalidRequestError, ProtocolError, UnsupportedVersionError
from protocol.framing import SIZE

Body = dict[str, Any]

REQUEST_HEADER_VERSION = 2
RESPONSE_HEADER_VERSION = 1

MAX_STRING_BYTES = 0x7FFF  # Kafka refuses longer strings, compact or not
LONG_MAX = (1 << 63) - 1


class Kind(enum.Enum):
    """A primitive field type."""

    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"
    STRING = "string"
    NULLABLE_STRING = "nullable string"
    UUID = "uuid"
    BYTES = "bytes"
    NULLABLE_BYTES = "nullable bytes"


@dataclass(frozen=True, slots=True)
class Field:
    """One field: its name, its type, the first version that has it, its default."""

    name: str
    type: Kind | Array
    since: int = 0
    default: Any = None  # None: the type's zero value

    def default_value(self) -> Any:
        """What the field holds when a body or an older version leaves it out."""
        return _default(self)


@dataclass(frozen=True, slots=True)
class Struct:
    """Fields in wire order, followed by a tagged-fields section."""

    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Array:
    """A compact array of a primitive or of structs."""

    item: Kind | Struct


@dataclass(frozen=True, slots=True)
class Message:
    """One API: its key, name, version range and request/response bodies."""

    api_key: ApiKey
    name: str
    min_version: int
    max_version: int
    request: Struct
    response: Struct


def _s(*fields: Field) -> Struct:
    return Struct(fields)


def _f(name: str, type_: Kind | Array | Struct, since: int = 0, default: Any = None) -> Field:
    return Field(name, Array(type_) if isinstance(type_, Struct) else type_, since, default)


I8, I16, I32, I64 = Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64
BOOL, STRING, UUID = Kind.BOOL, Kind.STRING, Kind.UUID
INT64S = Array(Kind.INT64)
ERROR_AND_THROTTLE = (_f("error_code", I16), _f("throttle_time_ms", I32))


_MESSAGES = (
    Message(
        ApiKey.PREPARE_S3_OBJECT,
        "PrepareS3Object",
        0,
        0,
        _s(_f("node_id", I32), _f("prepared_count", I32), _f("time_to_live_in_ms", I64)),
        _s(*ERROR_AND_THROTTLE, _f("first_s3_object_id", I64)),
    ),
    Message(
        ApiKey.COMMIT_STREAM_SET_OBJECT,
        "CommitStreamSetObject",
        0,
        1,
        _s(
            _f("node_id", I32),
            _f("node_epoch", I64),
            _f("object_id", I64),
            _f("order_id", I64),
            _f("object_size", I64),
            _f(
                "object_stream_ranges",
                _s(
                    _f("stream_id", I64),
                    _f("stream_epoch", I64),
                    _f("start_offset", I64),
                    _f("end_offset", I64),
                ),
            ),
            _f(
                "stream_objects",
                _s(
                    _f("object_id", I64),
                    _f("object_size", I64),
                    _f("stream_id", I64),
                    _f("start_offset", I64),
                    _f("end_offset", I64),
                    _f("attributes", I32, since=1),
                ),
            ),
            _f("compacted_object_ids", INT64S),
            _f("failover_mode", BOOL),
            _f("attributes", I32, since=1),
        ),
        _s(*ERROR_AND_THROTTLE, _f("attributes", I32, since=1)),
    ),
    Message(
        ApiKey.COMMIT_STREAM_OBJECT,
        "CommitStreamObject",
        0,
        1,
        _s(
            _f("node_id", I32),
            _f("node_epoch", I64),
            _f("object_id", I64),
            _f("object_size", I64),
            _f("stream_id", I64),
            _f("start_offset", I64),
            _f("end_offset", I64),
            _f("source_object_ids", INT64S),
            _f("stream_epoch", I64, default=-1),
            _f("attributes", I32, since=1),
        ),
        _s(*ERROR_AND_THROTTLE),
    ),
    Message(
        ApiKey.GET_KVS,
        "GetKVs",
        0,
        1,
        _s(_f("get_key_requests", _s(_f("key", STRING), _f("namespace", STRING, since=1)))),
        _s(
            *ERROR_AND_THROTTLE,
            _f("get_kv_responses", _s(_f("error_code", I16), _f("value", Kind.NULLABLE_BYTES))),
        ),
    ),
    Message(
        ApiKey.DESCRIBE_STREAMS,
        "DescribeStreams",
        0,
        0,
        _s(
            _f(
                "topic_partitions",
                _s(_f("topic_name", STRING), _f("partitions", _s(_f("partition_index", I32)))),
            ),
            _f("node_id", I32, default=-1),
            _f("stream_id", I64, default=-1),
        ),
        _s(
            *ERROR_AND_THROTTLE,
            _f(
                "stream_metadata_list",
                _s(
                    _f("stream_id", I64),
                    _f("node_id", I32),
                    _f("state", STRING),
                    _f("topic_id", UUID),
                    _f("topic_name", STRING),
                    _f("partition_index", I32),
                    _f("epoch", I64),
                    _f("start_offset", I64),
                    _f("end_offset", I64),
                    _f("tags", _s(_f("key", STRING), _f("value", STRING))),
                ),
            ),
        ),
    ),
    Message(
        ApiKey.DESCRIBE_S3_METADATA,
        "DescribeS3Metadata",
        0,
        0,
        _s(),
        _s(
            *ERROR_AND_THROTTLE,
            _f("now_ms", I64),
            _f("next_object_id", I64),
            _f(
                "streams",
                _s(
                    _f("stream_id", I64),
                    _f("epoch", I64),
                    _f("state", I8),
                    _f("start_offset", I64),
                    _f("end_offset", I64),
                    _f(
                        "ranges",
                        _s(
                            _f("range_index", I32),
                            _f("epoch", I64),
                            _f("start_offset", I64),
                            _f("end_offset", I64),
                            _f("node_id", I32),
                        ),
                    ),
                    _f(
                        "stream_objects",
                        _s(
                            _f("object_id", I64),
                            _f("start_offset", I64),
                            _f("end_offset", I64),
                            _f("object_size", I64),
                        ),
                    ),
                ),
            ),
            _f(
                "nodes",
                _s(
                    _f("node_id", I32),
                    _f("node_epoch", I64),
                    _f("failover", BOOL),
                    _f(
                        "stream_set_objects",
                        _s(
                            _f("object_id", I64),
                            _f("order_id", I64),
                            _f("data_time_ms", I64),
                            _f("object_size", I64),
                            _f(
                                "ranges",
                                _s(
                                    _f("stream_id", I64),
                                    _f("start_offset", I64),
                                    _f("end_offset", I64),
                                ),
                            ),
                        ),
                    ),
                ),
            ),
            _f(
                "objects",
                _s(
                    _f("object_id", I64),
                    _f("state", I8),
                    _f("object_size", I64),
                    _f("prepared_ms", I64),
                    _f("expires_ms", I64),
                    _f("committed_ms", I64, default=-1),
                    _f("mark_destroyed_ms", I64, default=-1),
                ),
            ),
        ),
    ),
    Message(
        ApiKey.EXPIRE_PREPARED_OBJECTS,
        "ExpirePreparedObjects",
        0,
        0,
        _s(),
        _s(*ERROR_AND_THROTTLE, _f("object_ids", INT64S)),
    ),
    Message(
        ApiKey.DESTROY_S3_OBJECTS,
        "DestroyS3Objects",
        0,
        0,
        _s(_f("object_ids", INT64S)),
        _s(*ERROR_AND_THROTTLE),
    ),
    Message(
        ApiKey.DESCRIBE_LOG_SEGMENTS,
        "DescribeLogSegments",
        0,
        1,
        _s(
            _f("topics", Array(STRING)),
            # v1: only topics whose cleanup.policy has this one ("": every topic); the broker
            # skips the others before opening their partitions
            _f("cleanup_policy", STRING, since=1),
        ),
        _s(
            *ERROR_AND_THROTTLE,
            _f("now_ms", I64),
            _f(
                "topics",
                _s(
                    _f("name", STRING),
                    _f("topic_id", UUID),
                    _f("cleanup_policy", STRING),
                    _f("retention_ms", I64),
                    _f("retention_bytes", I64),
                    _f("delete_retention_ms", I64),
                    # min.cleanable.dirty.ratio, a decimal (the codec has no floats)
                    _f("min_cleanable_dirty_ratio", STRING),
                    _f("min_compaction_lag_ms", I64, since=1),
                    _f("max_compaction_lag_ms", I64, since=1, default=LONG_MAX),
                    _f(
                        "partitions",
                        _s(
                            _f("partition_index", I32),
                            _f("error_code", I16),
                            _f("log_start_offset", I64),
                            _f("log_end_offset", I64),
                            _f("last_stable_offset", I64),
                            _f(
                                "segments",
                                _s(
                                    _f("base_offset", I64),
                                    _f("next_offset", I64),
                                    _f("size_bytes", I64),
                                    _f("max_timestamp", I64),
                                    _f("cleaned", BOOL),
                                    # the first batch's max timestamp (0: none)
                                    _f("first_batch_timestamp", I64, since=1),
                                ),
                            ),
                        ),
                    ),
                ),
            ),
        ),
    ),
    Message(
        ApiKey.COMMIT_CLEANED_SEGMENT,
        "CommitCleanedSegment",
        0,
        0,
        _s(
            _f("topic", STRING),
            _f("partition_index", I32),
            _f("base_offset", I64),
            _f("end_offset", I64),
            _f("batches", _s(_f("count", I32), _f("data", Kind.BYTES))),
            # the cleaned segment's transaction index: aborted transactions whose ABORT stays
            _f(
                "aborted_transactions",
                _s(
                    _f("producer_id", I64),
                    _f("first_offset", I64),
                    _f("last_offset", I64),
                    _f("last_stable_offset", I64),
                ),
            ),
        ),
        _s(
            *ERROR_AND_THROTTLE,
            _f("error_message", Kind.NULLABLE_STRING),
            _f("segments_replaced", I32),
        ),
    ),
)

MESSAGES: dict[int, Message] = {m.api_key: m for m in _MESSAGES}


def serves(api_key: int, api_version: int) -> bool:
    """True if this codec has ``api_key`` at ``api_version``."""
    m = MESSAGES.get(api_key)
    return m is not None and m.min_version <= api_version <= m.max_version


def _message(api_key: int, api_version: int) -> Message:
    m = MESSAGES.get(api_key)
    if m is None or not m.min_version <= api_version <= m.max_version:
        raise ValueError(f"no extension API {api_key} v{api_version}")
    return m


# -- encoding ---------------------------------------------------------------------------------

_INTS = {
    Kind.INT8: wire.INT8,
    Kind.INT16: wire.INT16,
    Kind.INT32: wire.INT32,
    Kind.INT64: wire.INT64,
}


def encode_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    body: Mapping[str, Any],
    client_id: str | None = None,
) -> bytes:
    """A request frame (size prefix, header v2, body). Raises ``ValueError`` on a bad body."""
    m = _message(api_key, api_version)
    header = headers.RequestHeader(
        api_key, api_version, correlation_id, client_id, REQUEST_HEADER_VERSION
    )
    out = bytearray(headers.encode_request_header(header))
    _encode_struct(m.request, api_version, body, out, m.name + "Request")
    return SIZE.pack(len(out)) + bytes(out)


def encode_response(
    api_key: int, api_version: int, correlation_id: int, body: Mapping[str, Any]
) -> bytes:
    """A response frame (size prefix, header v1, body). Raises ``ValueError`` on a bad body."""
    m = _message(api_key, api_version)
    out = bytearray(headers.encode_response_header(correlation_id, RESPONSE_HEADER_VERSION))
    _encode_struct(m.response, api_version, body, out, m.name + "Response")
    return SIZE.pack(len(out)) + bytes(out)


def _default(f: Field) -> Any:
    if f.default is not None:
        return f.default
    t = f.type
    if isinstance(t, Array):
        return []
    if t in _INTS:
        return 0
    return {
        Kind.BOOL: False,
        Kind.STRING: "",
        Kind.NULLABLE_STRING: None,
        Kind.UUID: uuid.UUID(int=0),
        Kind.BYTES: b"",
        Kind.NULLABLE_BYTES: None,
    }[t]


def _encode_struct(
    s: Struct, version: int, value: Mapping[str, Any], out: bytearray, path: str
) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: expected a mapping, got {type(value).__name__}")
    names = {f.name for f in s.fields}
    unknown = [k for k in value if k not in names]
    if unknown:
        raise ValueError(f"{path}: no fields {unknown}")
    for f in s.fields:
        if f.since <= version:
            v = value.get(f.name, _default(f))
            _encode_value(f.type, version, v, out, f"{path}.{f.name}")
    out.append(0)  # no tagged fields


def _encode_value(
    t: Kind | Array | Struct, version: int, v: Any, out: bytearray, path: str
) -> None:
    if isinstance(t, Struct):
        _encode_struct(t, version, v, out, path)
    elif isinstance(t, Array):
        if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
            raise ValueError(f"{path}: expected a sequence, got {type(v).__name__}")
        items = list(v)
        out += wire.write_uvarint(len(items) + 1)
        for i, item in enumerate(items):
            _encode_value(t.item, version, item, out, f"{path}[{i}]")
    elif t in _INTS:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{path}: expected an int, got {type(v).__name__}")
        try:
            out += _INTS[t].pack(v)
        except struct.error:
            raise ValueError(f"{path}: {v} does not fit in {t.value}") from None
    elif t is Kind.BOOL:
        if not isinstance(v, bool):
            raise ValueError(f"{path}: expected a bool, got {type(v).__name__}")
        out.append(1 if v else 0)
    elif t in (Kind.STRING, Kind.NULLABLE_STRING):
        if v is None and t is Kind.NULLABLE_STRING:
            out.append(0)
            return
        if not isinstance(v, str):
            raise ValueError(f"{path}: expected a str, got {type(v).__name__}")
        data = v.encode()
        if len(data) > MAX_STRING_BYTES:
            raise ValueError(f"{path}: {len(data)} bytes, more than {MAX_STRING_BYTES}")
        out += wire.write_uvarint(len(data) + 1) + data
    elif t in (Kind.BYTES, Kind.NULLABLE_BYTES):
        if v is None and t is Kind.NULLABLE_BYTES:
            out.append(0)
            return
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise ValueError(f"{path}: expected bytes, got {type(v).__name__}")
        out += wire.write_uvarint(len(v) + 1)
        out += v
    elif t is Kind.UUID:
        if not isinstance(v, uuid.UUID):
            raise ValueError(f"{path}: expected a UUID, got {type(v).__name__}")
        out += v.bytes
    else:  # pragma: no cover - every Kind is handled above
        raise AssertionError(t)


# -- decoding ---------------------------------------------------------------------------------


def decode_request(frame: wire.Buffer) -> tuple[headers.RequestHeader, Body]:
    """Decode a request frame (size prefix stripped): its header v2 and body."""
    api_key, api_version, correlation_id = headers.peek_request_ids(frame)
    if not serves(api_key, api_version):
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    header, pos = headers.decode_request_header(frame, REQUEST_HEADER_VERSION)
    return header, decode_request_body(api_key, api_version, frame, pos, correlation_id)


def decode_request_body(
    api_key: int, api_version: int, frame: wire.Buffer, pos: int, correlation_id: int = -1
) -> Body:
    """Decode the body at ``pos`` (after a header the caller read); it must end the frame."""
    if not serves(api_key, api_version):
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    m = MESSAGES[api_key]
    try:
        return _decode_all(m.request, api_version, frame, pos)
    except InvalidRequestError as e:
        raise InvalidRequestError(f"{m.name}Request v{api_version}: {e}", correlation_id) from None


def decode_response(api_key: int, api_version: int, frame: wire.Buffer) -> tuple[int, Body]:
    """Decode a response frame (size prefix stripped): (correlation id, body)."""
    m = MESSAGES.get(api_key)
    if m is None or not m.min_version <= api_version <= m.max_version:
        raise ProtocolError(f"no extension API {api_key} v{api_version}")
    try:
        correlation_id, pos = headers.decode_response_header(frame, RESPONSE_HEADER_VERSION)
        return correlation_id, _decode_all(m.response, api_version, frame, pos)
    except InvalidRequestError as e:
        raise ProtocolError(f"{m.name}Response v{api_version}: {e}") from None


def _decode_all(s: Struct, version: int, buf: wire.Buffer, pos: int) -> Body:
    body, pos = _decode_struct(s, version, buf, pos)
    if pos != len(buf):
        raise InvalidRequestError(f"{len(buf) - pos} bytes after the body")
    return body


@functools.cache
def _min_size(t: Kind | Array | Struct, version: int) -> int:
    """The fewest bytes a value of ``t`` takes at ``version``: bounds an array's count by the
    bytes left."""
    if isinstance(t, Struct):
        return 1 + sum(_min_size(f.type, version) for f in t.fields if f.since <= version)
    if isinstance(t, Array):
        return 1
    return {
        Kind.INT8: 1,
        Kind.INT16: 2,
        Kind.INT32: 4,
        Kind.INT64: 8,
        Kind.BOOL: 1,
        Kind.UUID: 16,
    }.get(t, 1)


def _decode_struct(s: Struct, version: int, buf: wire.Buffer, pos: int) -> tuple[Body, int]:
    out: Body = {}
    for f in s.fields:
        if f.since <= version:
            out[f.name], pos = _decode_value(f.type, version, buf, pos)
        else:
            out[f.name] = _default(f)
    return out, wire.skip_tagged_fields(buf, pos)


def _decode_value(t: Kind | Array | Struct, version: int, buf: wire.Buffer, pos: int) -> Any:
    if isinstance(t, Struct):
        return _decode_struct(t, version, buf, pos)
    if isinstance(t, Array):
        n, pos = wire.read_uvarint(buf, pos)
        if n == 0:
            raise InvalidRequestError("null array")
        n -= 1
        if n * _min_size(t.item, version) > len(buf) - pos:
            raise InvalidRequestError(f"array of {n} items, only {len(buf) - pos} bytes left")
        items = []
        for _ in range(n):
            item, pos = _decode_value(t.item, version, buf, pos)
            items.append(item)
        return items, pos
    if t in _INTS:
        codec = _INTS[t]
        if pos + codec.size > len(buf):
            raise InvalidRequestError(f"truncated {t.value}")
        return codec.unpack_from(buf, pos)[0], pos + codec.size
    if t is Kind.BOOL:
        if pos >= len(buf):
            raise InvalidRequestError("truncated bool")
        return buf[pos] != 0, pos + 1
    if t is Kind.UUID:
        if pos + 16 > len(buf):
            raise InvalidRequestError("truncated uuid")
        return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16
    nullable = t in (Kind.NULLABLE_STRING, Kind.NULLABLE_BYTES)
    n, pos = wire.read_uvarint(buf, pos)
    if n == 0:
        if not nullable:
            raise InvalidRequestError(f"null {t.value}")
        return None, pos
    end = pos + n - 1
    if end > len(buf):
        raise InvalidRequestError(f"truncated {t.value}")
    if t in (Kind.BYTES, Kind.NULLABLE_BYTES):
        return bytes(buf[pos:end]), end
    if n - 1 > MAX_STRING_BYTES:
        raise InvalidRequestError(f"string of {n - 1} bytes, more than {MAX_STRING_BYTES}")
    try:
        return str(buf[pos:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"string is not UTF-8: {e}") from None
