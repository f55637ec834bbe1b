"""The durable store's schema and the record -> SQL mapping, shared by every SQL backend.

The SQL is kept portable between SQLite and PostgreSQL: plain types (BIGINT, INTEGER, TEXT,
BLOB; a PostgreSQL backend maps BLOB to BYTEA), ``INSERT ... ON CONFLICT (...) DO UPDATE`` for
upserts, ``?`` placeholders (a PostgreSQL backend rewrites them to ``$n``). Each record becomes
a few statements; a record list runs in one transaction.

=========================  ====================================================================
table                      rows
=========================  ====================================================================
counters                   name -> next id (stream_id, object_id)
nodes                      node_id, epoch, failover
streams                    stream_id, epoch, state, start_offset, end_offset
stream_ranges              (stream_id, range_index) -> epoch, start/end offsets, node_id
stream_objects             object_id -> stream_id, start/end offsets, size
stream_set_objects         object_id -> node_id, order_id, data_time_ms, size
stream_set_object_ranges   (object_id, stream_id, start_offset) -> end_offset
objects                    object_id -> state, size, prepared/expires/committed/marked times
kv                         kv_key -> kv_value
=========================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from storage.metadata import records as rec
from storage.metadata.image import (
    MetadataImage,
    range_order,
    sorted_ranges,
    stream_object_order,
    stream_set_object_order,
)
from storage.metadata.model import (
    NodeMetadata,
    ObjectState,
    RangeMetadata,
    S3Object,
    StreamMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
)

Statement = tuple[str, tuple[Any, ...]]
Row = Sequence[Any]

SCHEMA: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS counters (
        name TEXT PRIMARY KEY,
        next_value BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS nodes (
        node_id INTEGER PRIMARY KEY,
        epoch BIGINT NOT NULL,
        failover INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS streams (
        stream_id BIGINT PRIMARY KEY,
        epoch BIGINT NOT NULL,
        state INTEGER NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS stream_ranges (
        stream_id BIGINT NOT NULL,
        range_index INTEGER NOT NULL,
        epoch BIGINT NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        node_id INTEGER NOT NULL,
        PRIMARY KEY (stream_id, range_index))""",
    """CREATE TABLE IF NOT EXISTS stream_objects (
        object_id BIGINT PRIMARY KEY,
        stream_id BIGINT NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        object_size BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS stream_objects_by_stream ON stream_objects (stream_id)",
    """CREATE TABLE IF NOT EXISTS stream_set_objects (
        object_id BIGINT PRIMARY KEY,
        node_id INTEGER NOT NULL,
        order_id BIGINT NOT NULL,
        data_time_ms BIGINT NOT NULL,
        object_size BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS stream_set_object_ranges (
        object_id BIGINT NOT NULL,
        stream_id BIGINT NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        PRIMARY KEY (object_id, stream_id, start_offset))""",
    """CREATE TABLE IF NOT EXISTS objects (
        object_id BIGINT PRIMARY KEY,
        state INTEGER NOT NULL,
        object_size BIGINT NOT NULL,
        prepared_ms BIGINT NOT NULL,
        expires_ms BIGINT NOT NULL,
        committed_ms BIGINT,
        mark_destroyed_ms BIGINT)""",
    """CREATE TABLE IF NOT EXISTS kv (
        kv_key TEXT PRIMARY KEY,
        kv_value BLOB NOT NULL)""",
)

LOAD_QUERIES: dict[str, str] = {
    "counters": "SELECT name, next_value FROM counters",
    "nodes": "SELECT node_id, epoch, failover FROM nodes",
    "streams": "SELECT stream_id, epoch, state, start_offset, end_offset FROM streams",
    "stream_ranges": (
        "SELECT stream_id, epoch, range_index, start_offset, end_offset, node_id FROM stream_ranges"
    ),
    "stream_objects": (
        "SELECT object_id, stream_id, start_offset, end_offset, object_size FROM stream_objects"
    ),
    "stream_set_objects": (
        "SELECT object_id, node_id, order_id, data_time_ms, object_size FROM stream_set_objects"
    ),
    "stream_set_object_ranges": (
        "SELECT object_id, stream_id, start_offset, end_offset FROM stream_set_object_ranges"
    ),
    "objects": (
        "SELECT object_id, state, object_size, prepared_ms, expires_ms, committed_ms, "
        "mark_destroyed_ms FROM objects"
    ),
    "kv": "SELECT kv_key, kv_value FROM kv",
}


def _upsert(
    table: str, columns: Sequence[str], key: Sequence[str], values: tuple[Any, ...]
) -> Statement:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    sql = (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    )
    return sql, values


def statements(record: rec.Record) -> list[Statement]:
    """The SQL that makes the tables say what ``record`` says."""
    match record:
        case rec.StreamRecord(stream_id, epoch, state, start_offset, end_offset):
            return [
                _upsert(
                    "streams",
                    ("stream_id", "epoch", "state", "start_offset", "end_offset"),
                    ("stream_id",),
                    (stream_id, epoch, int(state), start_offset, end_offset),
                )
            ]
        case rec.RemoveStream(stream_id):
            return [
                ("DELETE FROM stream_ranges WHERE stream_id = ?", (stream_id,)),
                ("DELETE FROM stream_objects WHERE stream_id = ?", (stream_id,)),
                ("DELETE FROM streams WHERE stream_id = ?", (stream_id,)),
            ]
        case rec.RangeRecord(r):
            return [
                _upsert(
                    "stream_ranges",
                    ("stream_id", "range_index", "epoch", "start_offset", "end_offset", "node_id"),
                    ("stream_id", "range_index"),
                    (r.stream_id, r.range_index, r.epoch, r.start_offset, r.end_offset, r.node_id),
                )
            ]
        case rec.RemoveRange(stream_id, range_index):
            return [
                (
                    "DELETE FROM stream_ranges WHERE stream_id = ? AND range_index = ?",
                    (stream_id, range_index),
                )
            ]
        case rec.StreamObjectRecord(so):
            return [
                _upsert(
                    "stream_objects",
                    ("object_id", "stream_id", "start_offset", "end_offset", "object_size"),
                    ("object_id",),
                    (so.object_id, so.stream_id, so.start_offset, so.end_offset, so.object_size),
                )
            ]
        case rec.RemoveStreamObject(stream_id, object_id):
            return [
                (
                    "DELETE FROM stream_objects WHERE stream_id = ? AND object_id = ?",
                    (stream_id, object_id),
                )
            ]
        case rec.StreamSetObjectRecord(sso):
            return [
                _upsert(
                    "stream_set_objects",
                    ("object_id", "node_id", "order_id", "data_time_ms", "object_size"),
                    ("object_id",),
                    (sso.object_id, sso.node_id, sso.order_id, sso.data_time_ms, sso.object_size),
                ),
                ("DELETE FROM stream_set_object_ranges WHERE object_id = ?", (sso.object_id,)),
                *(
                    (
                        "INSERT INTO stream_set_object_ranges "
                        "(object_id, stream_id, start_offset, end_offset) VALUES (?, ?, ?, ?)",
                        (sso.object_id, r.stream_id, r.start_offset, r.end_offset),
                    )
                    for r in sso.ranges
                ),
            ]
        case rec.RemoveStreamSetObject(node_id, object_id):
            return [
                ("DELETE FROM stream_set_object_ranges WHERE object_id = ?", (object_id,)),
                (
                    "DELETE FROM stream_set_objects WHERE node_id = ? AND object_id = ?",
                    (node_id, object_id),
                ),
            ]
        case rec.RemoveS3Object(object_id):
            return [("DELETE FROM objects WHERE object_id = ?", (object_id,))]
        case rec.S3ObjectRecord(o):
            return [
                _upsert(
                    "objects",
                    (
                        "object_id",
                        "state",
                        "object_size",
                        "prepared_ms",
                        "expires_ms",
                        "committed_ms",
                        "mark_destroyed_ms",
                    ),
                    ("object_id",),
                    (
                        o.object_id,
                        int(o.state),
                        o.object_size,
                        o.prepared_ms,
                        o.expires_ms,
                        o.committed_ms,
                        o.mark_destroyed_ms,
                    ),
                )
            ]
        case rec.NodeRecord(node_id, epoch, failover):
            return [
                _upsert(
                    "nodes",
                    ("node_id", "epoch", "failover"),
                    ("node_id",),
                    (node_id, epoch, int(failover)),
                )
            ]
        case rec.KVRecord(key, value):
            return [_upsert("kv", ("kv_key", "kv_value"), ("kv_key",), (key, value))]
        case rec.RemoveKV(key):
            return [("DELETE FROM kv WHERE kv_key = ?", (key,))]
        case rec.CounterRecord(name, next_value):
            return [_upsert("counters", ("name", "next_value"), ("name",), (name, next_value))]
    raise TypeError(f"not a metadata record: {record!r}")


def image_from_rows(rows: Mapping[str, Sequence[Row]]) -> MetadataImage:
    """Build the image from the result of every query in ``LOAD_QUERIES`` (keyed alike)."""
    ranges: dict[int, list[RangeMetadata]] = {}
    for stream_id, epoch, range_index, start, end, node_id in rows["stream_ranges"]:
        ranges.setdefault(stream_id, []).append(
            RangeMetadata(stream_id, epoch, range_index, start, end, node_id)
        )
    sos: dict[int, list[StreamObject]] = {}
    for object_id, stream_id, start, end, size in rows["stream_objects"]:
        sos.setdefault(stream_id, []).append(StreamObject(object_id, stream_id, start, end, size))
    streams = {
        stream_id: StreamMetadata(
            stream_id,
            epoch,
            StreamState(state),
            start,
            end,
            tuple(sorted(ranges.get(stream_id, ()), key=range_order)),
            tuple(sorted(sos.get(stream_id, ()), key=stream_object_order)),
        )
        for stream_id, epoch, state, start, end in rows["streams"]
    }

    sso_ranges: dict[int, list[StreamOffsetRange]] = {}
    for object_id, stream_id, start, end in rows["stream_set_object_ranges"]:
        sso_ranges.setdefault(object_id, []).append(StreamOffsetRange(stream_id, start, end))
    ssos: dict[int, list[StreamSetObject]] = {}
    for object_id, node_id, order_id, data_time_ms, size in rows["stream_set_objects"]:
        ssos.setdefault(node_id, []).append(
            StreamSetObject(
                object_id,
                node_id,
                order_id,
                data_time_ms,
                size,
                sorted_ranges(sso_ranges.get(object_id, ())),
            )
        )
    nodes = {
        node_id: NodeMetadata(
            node_id,
            epoch,
            bool(failover),
            tuple(sorted(ssos.get(node_id, ()), key=stream_set_object_order)),
        )
        for node_id, epoch, failover in rows["nodes"]
    }

    objects = {
        object_id: S3Object(
            object_id, ObjectState(state), size, prepared_ms, expires_ms, committed_ms, marked_ms
        )
        for object_id, state, size, prepared_ms, expires_ms, committed_ms, marked_ms in rows[
            "objects"
        ]
    }
    kv = {key: bytes(value) for key, value in rows["kv"]}
    counters = {name: next_value for name, next_value in rows["counters"]}
    return MetadataImage(streams, nodes, objects, kv, counters)
