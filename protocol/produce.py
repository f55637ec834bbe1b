"""Produce request decoding that keeps record bytes in place (no copy).

kio's decoder copies each partition's ``records`` into a new ``bytes``; for the
broker's hottest request that copy is the main cost, so Produce bodies are parsed
here and ``records`` is a read-only ``memoryview`` slice of the request frame.

Produce request body, v3-v11 (v9+ flexible: compact lengths, TAGGED_FIELDS after
every struct):

==================  ================================  ================================
field               v3-v8                             v9-v11
==================  ================================  ================================
transactional_id    NULLABLE_STRING                   COMPACT_NULLABLE_STRING
acks                int16                             int16
timeout_ms          int32                             int32
topic_data          ARRAY of topic                    COMPACT_ARRAY of topic
  name              STRING                            COMPACT_STRING
  partition_data    ARRAY of partition                COMPACT_ARRAY of partition
    index           int32                             int32
    records         RECORDS (int32 length, -1 null)   COMPACT_RECORDS (uvarint N+1)
    (tags)          -                                 TAGGED_FIELDS (none known)
  (tags)            -                                 TAGGED_FIELDS (none known)
(tags)              -                                 TAGGED_FIELDS (none known)
==================  ================================  ================================

``MIN_VERSION``..``MAX_VERSION`` is the range the broker advertises for Produce (a test holds
the two equal). The maximum is Kafka 3.9's, 11: clients read the broker's version from these
maxima, and v12 (Kafka 4.0, KIP-890 part 2, v11 on the wire) would claim a 4.0 broker. v0-v2
carry magic v0/v1 message sets, which this broker does not store (Kafka 4.0 dropped them too,
KIP-896), so the minimum is 3 where Kafka 3.9's is 0.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from protocol import headers, wire
from protocol.errors import ErrorCode, InvalidRequestError
from protocol.fetch import NodeEndpoint, encode_node_endpoints, tagged_field
from protocol.record_batch import ATTRIBUTES_OFFSET, LOG_OVERHEAD, MAGIC_OFFSET

MIN_VERSION = 3
MAX_VERSION = 11
FIRST_FLEXIBLE_VERSION = 9

_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_ACKS_TIMEOUT_COUNT = struct.Struct(">hii")
_INDEX_SIZE = struct.Struct(">ii")
_INT16 = struct.Struct(">h")

FIRST_ZSTD_VERSION = 7  # KIP-110: older producers cannot have asked for zstd
_SMALLEST_RECORD = 14  # a magic-0 record's overhead, the least any batch can declare
_UP_TO_MAGIC = MAGIC_OFFSET + 1
_ZSTD = 4


@dataclass(slots=True, frozen=True)
class ProducePartitionData:
    """One partition's records: a read-only view into the request frame, or None."""

    index: int
    records: memoryview | None


@dataclass(slots=True, frozen=True)
class ProduceTopicData:
    """One topic of a Produce request."""

    name: str
    partitions: tuple[ProducePartitionData, ...]


@dataclass(slots=True, frozen=True)
class ProduceRequestData:
    """A decoded Produce request body."""

    version: int
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[ProduceTopicData, ...]


def records_error(version: int, records: memoryview | None) -> tuple[ErrorCode, str] | None:
    """Why a partition's ``records`` may not be appended, as Kafka's
    ``ProduceRequest.validateRecords`` answers before the partition reads them: exactly one
    complete magic-v2 batch, not zstd below v7. None when the partition may take over (it
    checks the rest: CRC, counts, records). A size or magic no batch can have is
    CORRUPT_MESSAGE, as Kafka's batch iterator throws it."""
    if records is None:
        return None
    first = _next_batch(records, 0)
    if isinstance(first, tuple):
        return first
    if first is None:
        return (
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} must have at least one record batch "
            "per partition",
        )
    magic = records[MAGIC_OFFSET]
    if magic != 2:
        return (
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} are only allowed to contain record "
            "batches with magic version 2",
        )
    (attributes,) = _INT16.unpack_from(records, ATTRIBUTES_OFFSET)
    if version < FIRST_ZSTD_VERSION and attributes & 0x07 == _ZSTD:
        return (
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            f"Produce requests with version {version} are not allowed to use ZStandard compression",
        )
    second = _next_batch(records, first)
    if isinstance(second, tuple):
        return second
    if second is not None:
        return (
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} are only allowed to contain exactly "
            "one record batch per partition",
        )
    return None


def _next_batch(records: memoryview, pos: int) -> int | tuple[ErrorCode, str] | None:
    """Where the complete batch at ``pos`` ends; None when there is none (too few bytes: a
    trailing part is not a batch), or the error its size or magic makes."""
    left = len(records) - pos
    if left < LOG_OVERHEAD:
        return None
    (size,) = _INT32.unpack_from(records, pos + LOG_OVERHEAD - 4)
    if size < _SMALLEST_RECORD:
        return (
            ErrorCode.CORRUPT_MESSAGE,
            f"Record size {size} is less than the minimum record overhead ({_SMALLEST_RECORD})",
        )
    if left < _UP_TO_MAGIC:
        return None
    magic = records[pos + MAGIC_OFFSET]
    if magic > 2:  # a signed byte in Kafka: above 127 is negative, also invalid
        signed = magic - 256 if magic > 127 else magic
        return (ErrorCode.CORRUPT_MESSAGE, f"Invalid magic found in record: {signed}")
    if left < LOG_OVERHEAD + size:
        return None
    return pos + LOG_OVERHEAD + size


def decode_produce_request(body: memoryview, pos: int, version: int) -> ProduceRequestData:
    """Decode a Produce body of ``version`` starting at ``pos`` of ``body``.

    The records views share ``body``'s memory: read-only, or writable when the frame is the
    request's own buffer, which nothing else reads (the broker then assigns offsets in
    place). Raises ``InvalidRequestError`` (without correlation id) on malformed input and
    ``ValueError`` for versions outside ``MIN_VERSION``..``MAX_VERSION``.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Produce v{version} is not handled here")
    try:
        if version >= FIRST_FLEXIBLE_VERSION:
            one = _decode_one(body, pos, version)
            return one if one is not None else _decode_flexible(body, pos, version)
        return _decode_legacy(body, pos, version)
    except (struct.error, IndexError):
        # Fixed-width reads run past the end: the struct module noticed first.
        raise InvalidRequestError("truncated Produce request") from None


def _decode_legacy(body: memoryview, pos: int, version: int) -> ProduceRequestData:
    end = len(body)
    txn_id, pos = wire.read_nullable_string(body, pos)
    acks, timeout_ms, n_topics = _ACKS_TIMEOUT_COUNT.unpack_from(body, pos)
    pos += _ACKS_TIMEOUT_COUNT.size
    topics: list[ProduceTopicData] = []
    for _ in range(n_topics):
        name, pos = wire.read_string(body, pos)
        (n_parts,) = _INT32.unpack_from(body, pos)
        pos += 4
        partitions: list[ProducePartitionData] = []
        for _ in range(n_parts):
            index, size = _INDEX_SIZE.unpack_from(body, pos)
            pos += 8
            records = None
            if size >= 0:
                if pos + size > end:
                    raise InvalidRequestError("records run past the end of the request")
                records = body[pos : pos + size]
                pos += size
            elif size != -1:
                raise InvalidRequestError(f"negative records length {size}")
            partitions.append(ProducePartitionData(index, records))
        topics.append(ProduceTopicData(name, tuple(partitions)))
    return ProduceRequestData(version, txn_id, acks, timeout_ms, tuple(topics))


# a flexible request's start in the shape of nearly every one librdkafka sends (a request per
# partition): a null transactional id, acks, timeout, one topic, the name's length (under 127)
_ONE_START = struct.Struct(">BhiBB")


def _decode_one(body: memoryview, pos: int, version: int) -> ProduceRequestData | None:
    """A flexible request of one topic and one partition, with records and no tagged fields,
    read in one pass; None when it is not of that shape (``_decode_flexible`` reads it then,
    and finds what is wrong with it, if anything)."""
    end = len(body)
    if end - pos < _ONE_START.size:
        return None
    txn_id, acks, timeout_ms, topics, name_length = _ONE_START.unpack_from(body, pos)
    if txn_id != 0 or topics != 2 or not 1 < name_length < 0x80:
        return None
    name_start = pos + _ONE_START.size
    at = name_start + name_length - 1  # the partition count
    if at + 6 > end or body[at] != 2:
        return None
    (index,) = _INT32.unpack_from(body, at + 1)
    size, pos = wire.read_uvarint(body, at + 5)
    stop = pos + size - 1  # the records' end, where the three structs' empty tags follow
    if size == 0 or stop + 3 != end or body[stop] or body[stop + 1] or body[stop + 2]:
        return None
    try:
        name = str(body[name_start:at], "utf-8")
    except UnicodeDecodeError:
        return None
    records = ProducePartitionData(index, body[pos:stop])
    topic = ProduceTopicData(name, (records,))
    return ProduceRequestData(version, None, acks, timeout_ms, (topic,))


def _decode_flexible(body: memoryview, pos: int, version: int) -> ProduceRequestData:
    end = len(body)
    txn_id, pos = wire.read_compact_nullable_string(body, pos)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(body, pos)
    pos += _ACKS_TIMEOUT.size
    n_topics, pos = wire.read_uvarint(body, pos)
    topics: list[ProduceTopicData] = []
    for _ in range(n_topics - 1):
        name, pos = wire.read_compact_string(body, pos)
        n_parts, pos = wire.read_uvarint(body, pos)
        partitions: list[ProducePartitionData] = []
        for _ in range(n_parts - 1):
            (index,) = _INT32.unpack_from(body, pos)
            size, pos = wire.read_uvarint(body, pos + 4)
            records = None
            if size:
                size -= 1
                if pos + size > end:
                    raise InvalidRequestError("records run past the end of the request")
                records = body[pos : pos + size]
                pos += size
            # Tagged fields: none are defined for partitions; a lone 0 is the usual case.
            pos = pos + 1 if body[pos] == 0 else wire.skip_tagged_fields(body, pos)
            partitions.append(ProducePartitionData(index, records))
        pos = pos + 1 if body[pos] == 0 else wire.skip_tagged_fields(body, pos)
        topics.append(ProduceTopicData(name, tuple(partitions)))
    if pos >= end:
        raise InvalidRequestError("truncated Produce request")
    pos = pos + 1 if body[pos] == 0 else wire.skip_tagged_fields(body, pos)
    return ProduceRequestData(version, txn_id, acks, timeout_ms, tuple(topics))


# -- response ------------------------------------------------------------------------------------
#
# Produce response body, v3-v11 (v9+ flexible), as the broker answers it:
#   responses            ARRAY of topic
#     name               STRING
#     partition_responses ARRAY of partition
#       index            int32
#       error_code       int16
#       base_offset      int64
#       log_append_time_ms int64
#       log_start_offset int64 (v5+)
#       record_errors    ARRAY of (batch_index int32, batch_index_error_message NULLABLE_STRING)
#                        (v8+, KIP-467: the records that failed the batch; v9+: each with tags)
#       error_message    NULLABLE_STRING (v8+)
#       (tags)           v10+: current_leader (tag 0: leader_id int32, leader_epoch int32,
#                        tags) with NOT_LEADER_OR_FOLLOWER (KIP-951); none before
#     (tags)
#   throttle_time_ms     int32
#   (tags)               v10+: node_endpoints (tag 0) of the leaders named; none before

_PARTITION = struct.Struct(">ihqq")
_LEADER = struct.Struct(">ii")
# the first version whose responses name a partition's leader (KIP-951)
FIRST_LEADER_HINT_VERSION = 10


@dataclass(slots=True, frozen=True)
class RecordError:
    """One record that made its batch fail (KIP-467): its index in the batch, and why."""

    batch_index: int
    message: str | None = None


@dataclass(slots=True, frozen=True)
class ProducePartitionResponse:
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    record_errors: tuple[RecordError, ...] = ()
    current_leader: tuple[int, int] | None = None  # (leader_id, leader_epoch): v10+


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[ProducePartitionResponse]]],
    throttle_time_ms: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> list[wire.Buffer]:
    """The whole framed Produce response (size prefix, header v0/v1, body), in one buffer:
    the kio encoder costs a few hundred microseconds per response on the hottest API.
    ``node_endpoints`` and each partition's ``current_leader`` are sent from v10 (KIP-951)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Produce v{version} is not handled here")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    hints = version >= FIRST_LEADER_HINT_VERSION
    if flexible and len(topics) == 1 and not (hints and node_endpoints):
        one = _one_partition(correlation_id, *topics[0], throttle_time_ms)
        if one is not None:
            return one
    out = bytearray(headers.encode_response_header(correlation_id, 1 if flexible else 0))
    out += wire.encode_array_length(len(topics), flexible)
    for name, partitions in topics:
        out += (
            wire.encode_compact_nullable_string(name)
            if flexible
            else wire.encode_nullable_string(name)
        )
        out += wire.encode_array_length(len(partitions), flexible)
        for p in partitions:
            out += _PARTITION.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if version >= 5:
                out += wire.INT64.pack(p.log_start_offset)
            if version >= 8:
                out += wire.encode_array_length(len(p.record_errors), flexible)
                for e in p.record_errors:
                    out += wire.INT32.pack(e.batch_index)
                    out += _nullable_string(e.message, flexible)
                    if flexible:
                        out += b"\x00"
                out += _nullable_string(p.error_message, flexible)
            if hints and p.current_leader is not None:
                out += b"\x01" + tagged_field(0, _LEADER.pack(*p.current_leader) + b"\x00")
            elif flexible:
                out += b"\x00"
        if flexible:
            out += b"\x00"
    out += wire.INT32.pack(throttle_time_ms)
    if hints and node_endpoints:
        out += b"\x01" + tagged_field(0, encode_node_endpoints(node_endpoints))
    elif flexible:
        out += b"\x00"
    return [wire.INT32.pack(len(out)), out]


# a flexible response's one topic with one partition that has no error message or record
# errors (nearly every response to librdkafka, which sends a request per partition):
# header, topic count 1, the name's length; then the partition count 1, the partition, no
# record errors, a null message, its tags, the topic's tags, throttle, the body's tags
_ONE_HEAD = struct.Struct(">iBBB")
_ONE_TAIL = struct.Struct(">BihqqqBBBBiB")


def _one_partition(
    correlation_id: int,
    name: str,
    partitions: Sequence[ProducePartitionResponse],
    throttle_time_ms: int,
) -> list[wire.Buffer] | None:
    """The framed response in one pass of ``struct`` when it is the common one above; None
    otherwise."""
    if len(partitions) != 1:
        return None
    p = partitions[0]
    data = name.encode()
    if (
        p.record_errors
        or p.error_message is not None
        or p.current_leader is not None
        or len(data) >= 0x7F
    ):
        return None
    out = (
        _ONE_HEAD.pack(correlation_id, 0, 2, len(data) + 1)
        + data
        + _ONE_TAIL.pack(
            2,
            p.index,
            p.error_code,
            p.base_offset,
            p.log_append_time_ms,
            p.log_start_offset,
            1,
            0,
            0,
            0,
            throttle_time_ms,
            0,
        )
    )
    return [wire.INT32.pack(len(out)), out]


def _nullable_string(value: str | None, flexible: bool) -> bytes:
    if flexible:
        return wire.encode_compact_nullable_string(value)
    return wire.encode_nullable_string(value)
