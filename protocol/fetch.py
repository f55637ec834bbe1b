"""Fetch response encoding that hands record bytes to the socket without copying them, and
the Fetch request's decoding.

kio would need each partition's records as one ``bytes`` (a join of cached batches)
and then copies it again into its output. Here each partition's records are a
sequence of buffers (one per batch or cache block) that end up, untouched, as
separate items of the returned buffer list, ready for ``transport.writelines``.

Fetch response body, v4-v17 (v12+ flexible: compact lengths and TAGGED_FIELDS):

=========================  =========  ===============================================
field                      versions   type
=========================  =========  ===============================================
throttle_time_ms           all        int32
error_code                 7+         int16
session_id                 7+         int32
responses                  all        ARRAY of topic
  topic / topic_id         4-12/13+   STRING / UUID
  partitions               all        ARRAY of partition
    partition_index        all        int32
    error_code             all        int16
    high_watermark         all        int64
    last_stable_offset     4+         int64
    log_start_offset       5+         int64
    aborted_transactions   4+         nullable ARRAY of (producer_id int64,
                                      first_offset int64)
    preferred_read_replica 11+        int32
    records                all        nullable RECORDS
    (tags)                 12+        0 diverging_epoch (epoch int32, end_offset
                                      int64), 1 current_leader (leader_id int32,
                                      leader_epoch int32)
  (tags)                   12+        none
(tags)                     12+        0 node_endpoints (16+): ARRAY of (node_id
                                      int32, host STRING, port int32, rack
                                      nullable STRING)
=========================  =========  ===============================================

A consumer sends a Fetch request to each broker it reads from, back to back while it keeps up,
so the request is read here a layout at a time into named tuples holding kio's fields of its
version (:func:`decode_fetch_request`, :class:`FetchRequestData`): a request of eight
partitions and its header take ~10 us, against 18-21 when the body was kio's frozen dataclasses
set a slot at a time, and more through the generic reader. A request with anything in its
TAGGED_FIELDS sections, a null array or a null string is left to the generic reader, whose kio
classes have the same fields.

The response's partitions are what the broker's fetch reader made
(:class:`FetchPartitionResult`); a partition without aborted transactions is written up to its
records in one ``struct`` pack.

``MIN_VERSION``..``MAX_VERSION`` is the range the broker advertises for Fetch (a test holds
the two equal). The maximum is Kafka 3.9's (and 4.0's), 17; v18 (Kafka 4.1) only adds the high
watermark that KRaft voters send (KIP-1166), nothing a consumer uses. The minimum is 4, not
Kafka 3.9's 0: v0-v3 answer with magic v0/v1 message sets, which this broker does not store
(Kafka 4.0 dropped those versions too, KIP-896).
"""

from __future__ import annotations

import datetime
import functools
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from protocol import headers, wire
from protocol.framing import SIZE

MIN_VERSION = 4
MAX_VERSION = 17
FIRST_FLEXIBLE_VERSION = 12
FIRST_TOPIC_ID_VERSION = 13

# Records smaller than this are copied into the surrounding bytes: a separate list
# item costs more than copying a few hundred bytes.
COPY_THRESHOLD = 2048

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
# partition_index, error_code, high_watermark, last_stable_offset, [log_start_offset (5+)]
_PARTITION_HEAD = struct.Struct(">ihqq")
_PARTITION_HEAD_V5 = struct.Struct(">ihqqq")
_ABORTED = struct.Struct(">qq")
_DIVERGING = struct.Struct(">iq")
_LEADER = struct.Struct(">ii")
_NULL_UUID = bytes(16)
# a null and an empty array's length, compact (flexible versions) and int32
_NULL_COMPACT, _EMPTY_COMPACT = b"\x00", b"\x01"
_NULL_INT32, _EMPTY_INT32 = _I32.pack(-1), _I32.pack(0)


@dataclass(slots=True, frozen=True)
class AbortedTransaction:
    """A transaction aborted inside the returned records (read_committed consumers)."""

    producer_id: int
    first_offset: int


class AbortedTransactionLike(Protocol):
    """What the response takes of an aborted transaction (the broker's index entries carry
    these fields among others)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def first_offset(self) -> int: ...


@dataclass(slots=True)
class FetchPartitionResult:
    """One partition of a Fetch response; ``records`` are the batches' bytes, in order. (Not
    frozen: a fetch makes one per partition, and a frozen dataclass takes four times as long to
    make.)"""

    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: Sequence[AbortedTransactionLike] | None = None
    preferred_read_replica: int = -1
    records: Sequence[wire.Buffer] | None = ()
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end_offset)
    current_leader: tuple[int, int] | None = None  # (leader_id, leader_epoch)
    records_size: int = -1  # the bytes of ``records`` when the caller knows them (-1: counted)


@dataclass(slots=True)
class FetchTopicResult:
    """One topic of a Fetch response: named (v4-12) or by id (v13+)."""

    name: str
    partitions: Sequence[FetchPartitionResult]
    topic_id: uuid.UUID | None = None


@dataclass(slots=True, frozen=True)
class NodeEndpoint:
    """A broker address, sent with leader hints (v16+)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: Sequence[FetchTopicResult],
    *,
    throttle_time_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> list[wire.Buffer]:
    """Encode a whole framed Fetch response (size prefix, header v0/v1, body).

    Record buffers of ``COPY_THRESHOLD`` bytes or more appear as list items as given.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Fetch v{version} is not handled here")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    # a partition with no aborted transactions and records: one pack through the records' size
    # (its varint follows from v12), the aborted array's length null or empty
    one_pack = _ONE_PACK.get(version)
    null_txn, empty_txn = (0, 1) if flexible else (-1, 0)
    parts: list[wire.Buffer] = []
    cur = bytearray(headers.encode_response_header(correlation_id, 1 if flexible else 0))
    cur += _I32.pack(throttle_time_ms)
    if version >= 7:
        cur += _I16.pack(error_code) + _I32.pack(session_id)
    cur += wire.encode_array_length(len(topics), flexible)
    for topic in topics:
        if version >= FIRST_TOPIC_ID_VERSION:
            cur += topic.topic_id.bytes if topic.topic_id is not None else _NULL_UUID
        elif flexible:
            cur += wire.encode_compact_nullable_string(topic.name)
        else:
            cur += wire.encode_nullable_string(topic.name)
        cur += wire.encode_array_length(len(topic.partitions), flexible)
        for p in topic.partitions:
            aborted = p.aborted_transactions
            records = p.records
            if not aborted and records is not None and one_pack is not None:
                size = p.records_size
                if size < 0:
                    size = sum(len(r) for r in records)
                txn = null_txn if aborted is None else empty_txn
                if flexible:  # the records' size a varint after the pack
                    tail: tuple[int, ...] = (p.preferred_read_replica,)
                elif version >= 11:
                    tail = (p.preferred_read_replica, size)
                else:
                    tail = (size,)
                cur += one_pack.pack(
                    p.partition_index,
                    p.error_code,
                    p.high_watermark,
                    p.last_stable_offset,
                    p.log_start_offset,
                    txn,
                    *tail,
                )
                if flexible:
                    cur += wire.write_uvarint(size + 1)
            else:
                _encode_partition_fields(cur, p, version, flexible)
            if records:
                for r in records:
                    if len(r) < COPY_THRESHOLD:
                        cur += r
                    else:
                        if cur:
                            parts.append(cur)
                            cur = bytearray()
                        parts.append(r)
            if flexible:
                if p.diverging_epoch is None and p.current_leader is None:
                    cur += b"\x00"  # no tagged fields
                else:
                    cur += _partition_tags(p)
        if flexible:
            cur += b"\x00"
    if flexible:
        if version >= 16 and node_endpoints:
            cur += b"\x01" + tagged_field(0, encode_node_endpoints(node_endpoints))
        else:
            cur += b"\x00"
    if cur:
        parts.append(cur)
    parts.insert(0, SIZE.pack(sum(map(len, parts))))
    return parts


# the one-pack layouts (partition_index, error_code, high_watermark, last_stable_offset,
# log_start_offset, the aborted array's length, [preferred_read_replica (11+)], [the records'
# int32 size (before 12)]); v4, without log_start_offset, takes the field-by-field way
_ONE_PACK = {
    **{v: struct.Struct(">ihqqqii") for v in range(5, 11)},
    11: struct.Struct(">ihqqqiii"),
    **{v: struct.Struct(">ihqqqBi") for v in range(FIRST_FLEXIBLE_VERSION, MAX_VERSION + 1)},
}


def _encode_partition_fields(
    cur: bytearray, p: FetchPartitionResult, version: int, flexible: bool
) -> None:
    """A partition's fields up to its records' bytes, field by field (v4, aborted
    transactions, null records)."""
    if version >= 5:
        cur += _PARTITION_HEAD_V5.pack(
            p.partition_index,
            p.error_code,
            p.high_watermark,
            p.last_stable_offset,
            p.log_start_offset,
        )
    else:
        cur += _PARTITION_HEAD.pack(
            p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset
        )
    aborted = p.aborted_transactions
    if aborted is None:
        cur += _NULL_COMPACT if flexible else _NULL_INT32
    elif not aborted:
        cur += _EMPTY_COMPACT if flexible else _EMPTY_INT32
    else:
        cur += wire.encode_array_length(len(aborted), flexible)
        for txn in aborted:
            cur += _ABORTED.pack(txn.producer_id, txn.first_offset)
            if flexible:
                cur += b"\x00"
    if version >= 11:
        cur += _I32.pack(p.preferred_read_replica)
    records = p.records
    if records is None:
        cur += _NULL_COMPACT if flexible else _NULL_INT32
    else:
        size = p.records_size
        if size < 0:
            size = sum(len(r) for r in records)
        cur += wire.write_uvarint(size + 1) if flexible else _I32.pack(size)


def _partition_tags(p: FetchPartitionResult) -> bytes:
    tags = []
    if p.diverging_epoch is not None:
        tags.append(tagged_field(0, _DIVERGING.pack(*p.diverging_epoch) + b"\x00"))
    if p.current_leader is not None:
        tags.append(tagged_field(1, _LEADER.pack(*p.current_leader) + b"\x00"))
    return wire.write_uvarint(len(tags)) + b"".join(tags)


def tagged_field(tag: int, value: bytes) -> bytes:
    """A tagged field (flexible versions): its tag, its size and ``value``."""
    return wire.write_uvarint(tag) + wire.write_uvarint(len(value)) + value


def encode_node_endpoints(endpoints: Sequence[NodeEndpoint]) -> bytes:
    """The NodeEndpoints of a leader hint (KIP-951; Fetch v16+, Produce v10+): a compact
    array of (node_id, host, port, rack, tags)."""
    out = bytearray(wire.write_uvarint(len(endpoints) + 1))
    for e in endpoints:
        out += _I32.pack(e.node_id) + wire.encode_compact_nullable_string(e.host)
        out += _I32.pack(e.port) + wire.encode_compact_nullable_string(e.rack) + b"\x00"
    return bytes(out)


# -- the request ---------------------------------------------------------------------------------

# replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level; v7+ session_id, session_epoch
_REQUEST_HEAD = struct.Struct(">iiiib")
_REQUEST_HEAD_V7 = struct.Struct(">iiiibii")
_REQUEST_HEAD_V15 = struct.Struct(">iiibii")  # replica_id moved into the tagged ReplicaState
_TOPIC_ID = struct.Struct(">16s")


# What the request's decoder makes: for each entity the fields kio's class of the version has
# (the ones a request read here can carry; the rest are at kio's defaults, since a request with
# tagged fields goes to the generic reader), as named tuples, made in one call from what the
# wire layout unpacks (kio's frozen dataclasses took 1.7 us a partition).


class FetchPartitionV4(NamedTuple):
    partition: int
    fetch_offset: int
    partition_max_bytes: int


class FetchPartitionV5(NamedTuple):
    partition: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int


class FetchPartitionV9(NamedTuple):
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int


class FetchPartitionV12(NamedTuple):
    """v12-v17 (v17's replica_directory_id is a tagged field: the generic reader's)."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


class FetchTopicByName(NamedTuple):
    """A fetched topic of v4-v12, or a forgotten one (``partitions`` their indexes)."""

    topic: str
    partitions: tuple[Any, ...]


class FetchTopicById(NamedTuple):
    """A fetched or forgotten topic of v13+."""

    topic_id: uuid.UUID
    partitions: tuple[Any, ...]


class FetchRequestData(NamedTuple):
    """A Fetch request as :func:`decode_fetch_request` reads it: kio's FetchRequest's fields
    by name, ``max_wait`` kept in milliseconds (:attr:`max_wait` makes kio's timedelta). The
    fields a version lacks hold what kio's later versions default them to; ``replica_id`` of
    v15+ is -1 (a follower's is in the tagged ReplicaState, which the generic reader reads)."""

    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    topics: tuple[Any, ...]
    forgotten_topics_data: tuple[Any, ...]
    rack_id: str

    @property
    def max_wait(self) -> datetime.timedelta:
        return datetime.timedelta(milliseconds=self.max_wait_ms)


# a fetched partition's layout and class in versions 4, 5-8, 9-11 and 12+
_PARTITION_V4 = (struct.Struct(">iqi"), FetchPartitionV4)
_PARTITION_V5 = (struct.Struct(">iqqi"), FetchPartitionV5)
_PARTITION_V9 = (struct.Struct(">iiqqi"), FetchPartitionV9)
_PARTITION_V12 = (struct.Struct(">iiqiqi"), FetchPartitionV12)


def decode_fetch_request(body: wire.Buffer, pos: int, version: int) -> FetchRequestData | None:
    """The Fetch request body of ``version`` (``MIN_VERSION``..``MAX_VERSION``) at ``pos``
    of ``body``, with the fields kio's generic reader gives it; None when it has tagged fields,
    a null array or a null string (the generic reader reads it then). Raises on a truncated
    request (``struct.error``, ``IndexError``, ``InvalidRequestError``)."""
    try:
        return _decode_fetch(body, pos, version)
    except _LeftToGenericReader:
        return None


class _LeftToGenericReader(Exception):
    """What :func:`decode_fetch_request` does not read: tagged fields, nulls."""


def _decode_fetch(body: wire.Buffer, pos: int, version: int) -> FetchRequestData:
    flexible = version >= FIRST_FLEXIBLE_VERSION
    session_id, epoch, replica = 0, -1, -1
    if version >= 15:
        wait, min_bytes, max_bytes, isolation, session_id, epoch = _REQUEST_HEAD_V15.unpack_from(
            body, pos
        )
        pos += _REQUEST_HEAD_V15.size
    elif version >= 7:
        (replica, wait, min_bytes, max_bytes, isolation, session_id, epoch) = (
            _REQUEST_HEAD_V7.unpack_from(body, pos)
        )
        pos += _REQUEST_HEAD_V7.size
    else:
        replica, wait, min_bytes, max_bytes, isolation = _REQUEST_HEAD.unpack_from(body, pos)
        pos += _REQUEST_HEAD.size
    layout: struct.Struct
    partition_type: Any
    if version >= FIRST_FLEXIBLE_VERSION:
        layout, partition_type = _PARTITION_V12
    elif version >= 9:
        layout, partition_type = _PARTITION_V9
    else:
        layout, partition_type = _PARTITION_V5 if version >= 5 else _PARTITION_V4
    make_partition = functools.partial(tuple.__new__, partition_type)  # (_make, without a frame)
    by_id = version >= FIRST_TOPIC_ID_VERSION
    topic_type: Any = FetchTopicById if by_id else FetchTopicByName
    size = layout.size
    topics = []
    n_topics, pos = _count(body, pos, flexible)
    for _ in range(n_topics):
        topic, pos = _read_topic(body, pos, flexible, by_id)
        n_parts, pos = _count(body, pos, flexible)
        partitions = []
        for _ in range(n_parts):
            values = layout.unpack_from(body, pos)
            pos += size
            if flexible:
                if body[pos]:  # (v17's replica_directory_id is a tagged field)
                    raise _LeftToGenericReader
                pos += 1
            partitions.append(make_partition(values))
        if flexible:
            pos = _no_tags(body, pos)
        topics.append(topic_type(topic, tuple(partitions)))
    forgotten = []
    if version >= 7:
        n_forgotten, pos = _count(body, pos, flexible)
        for _ in range(n_forgotten):
            topic, pos = _read_topic(body, pos, flexible, by_id)
            n_parts, pos = _count(body, pos, flexible)
            if pos + 4 * n_parts > len(body):
                raise wire.InvalidRequestError("truncated forgotten topic")
            indexes = struct.unpack_from(f">{n_parts}i", body, pos)
            pos += 4 * n_parts
            if flexible:
                pos = _no_tags(body, pos)
            forgotten.append(topic_type(topic, indexes))
    rack_id = ""
    if version >= 11:
        rack_id, pos = _read_string(body, pos, flexible)
    if flexible:
        _no_tags(body, pos)  # cluster_id, replica_state
    return FetchRequestData(
        replica,
        wait,
        min_bytes,
        max_bytes,
        isolation,
        session_id,
        epoch,
        tuple(topics),
        tuple(forgotten),
        rack_id,
    )


def _count(body: wire.Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    """An array's count (a null array is the generic reader's)."""
    n, pos = wire.read_array_length(body, pos, flexible)
    if n < 0:
        raise _LeftToGenericReader
    return n, pos


def _no_tags(body: wire.Buffer, pos: int) -> int:
    """Past an empty TAGGED_FIELDS section (one with tags is the generic reader's)."""
    if body[pos]:
        raise _LeftToGenericReader
    return pos + 1


def _read_topic(body: wire.Buffer, pos: int, flexible: bool, by_id: bool) -> tuple[Any, int]:
    """A fetched or forgotten topic's name (v4-12) or id (v13+); a null name or the null id
    (which the generic reader gives as None) is the generic reader's."""
    if by_id:
        (raw,) = _TOPIC_ID.unpack_from(body, pos)
        if raw == _NULL_UUID:
            raise _LeftToGenericReader
        return uuid.UUID(bytes=raw), pos + 16
    return _read_string(body, pos, flexible)


def _read_string(body: wire.Buffer, pos: int, flexible: bool) -> tuple[str, int]:
    """A (compact) string; a null one is the generic reader's."""
    if flexible:
        value, pos = wire.read_compact_nullable_string(body, pos)
    else:
        value, pos = wire.read_nullable_string(body, pos)
    if value is None:
        raise _LeftToGenericReader
    return value, pos
