"""The metadata records as bytes: one entry of the PostgreSQL record log, or a snapshot.

An entry is one msgpack array of records; a record is an array whose first element is its tag,
then its fields in declaration order. Nested values are arrays too. A snapshot is an entry that
rebuilds an image from nothing (:func:`image_records`).

====  =======================  ==============================================================
tag   record                   fields after the tag
====  =======================  ==============================================================
1     StreamRecord             stream_id, epoch, state, start_offset, end_offset
2     RemoveStream             stream_id
3     RangeRecord              [stream_id, epoch, range_index, start_offset, end_offset, node]
4     RemoveRange              stream_id, range_index
5     StreamObjectRecord       [object_id, stream_id, start_offset, end_offset, object_size]
6     RemoveStreamObject       stream_id, object_id
7     StreamSetObjectRecord    object_id, node_id, order_id, data_time_ms, object_size,
                               [[stream_id, start_offset, end_offset], ...]
8     RemoveStreamSetObject    node_id, object_id
9     S3ObjectRecord           object_id, state, size, prepared_ms, expires_ms, committed_ms
                               (nil if none), mark_destroyed_ms (nil if none)
10    RemoveS3Object           object_id
11    NodeRecord               node_id, epoch, failover
12    KVRecord                 key, value (bin)
13    RemoveKV                 key
14    CounterRecord            name, next_value
====  =======================  ==============================================================

Tags are never reused: a new record kind takes the next number, and a reader that meets a tag it
does not know refuses the entry (:class:`UnknownRecordError`) rather than skip a change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from storage.metadata import records as rec
from storage.metadata.image import MetadataImage
from storage.metadata.model import (
    ObjectState,
    RangeMetadata,
    S3Object,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
)


class UnreadableEntryError(ValueError):
    """A log entry this version cannot read: never skipped, since the state after it would be
    wrong."""


class UnknownRecordError(UnreadableEntryError):
    """An entry holds a record this version cannot read (written by a newer broker?)."""


def encode(records: Sequence[rec.Record]) -> bytes:
    """One log entry holding ``records`` in order."""
    return msgpack.packb([_fields(r) for r in records], use_bin_type=True)


def decode(data: bytes) -> list[rec.Record]:
    """The records of one log entry; raises :class:`UnreadableEntryError` (a ValueError),
    :class:`UnknownRecordError` for a record kind this version does not know."""
    try:
        items = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (msgpack.UnpackException, ValueError) as e:
        raise UnreadableEntryError(f"metadata log entry is not msgpack: {e}") from e
    if not isinstance(items, list):
        raise UnreadableEntryError("metadata log entry is not an array of records")
    try:
        return [_record(item) for item in items]
    except (TypeError, ValueError) as e:
        if isinstance(e, UnknownRecordError):
            raise
        raise UnreadableEntryError(f"malformed metadata record: {e!r}") from e


def image_records(image: MetadataImage) -> list[rec.Record]:
    """Records that rebuild ``image`` when applied to an empty one (a snapshot's content)."""
    out: list[rec.Record] = [rec.CounterRecord(n, v) for n, v in sorted(image.counters.items())]
    for node in image.nodes.values():
        out.append(rec.NodeRecord(node.node_id, node.epoch, node.failover))
        out.extend(rec.StreamSetObjectRecord(sso) for sso in node.stream_set_objects)
    for s in image.streams.values():
        out.append(rec.StreamRecord(s.stream_id, s.epoch, s.state, s.start_offset, s.end_offset))
        out.extend(rec.RangeRecord(r) for r in s.ranges)
        out.extend(rec.StreamObjectRecord(so) for so in s.stream_objects)
    out.extend(rec.S3ObjectRecord(o) for o in image.objects.values())
    out.extend(rec.KVRecord(k, v) for k, v in image.kv.items())
    return out


def _fields(r: rec.Record) -> list[Any]:
    match r:
        case rec.StreamRecord(stream_id, epoch, state, start, end):
            return [1, stream_id, epoch, int(state), start, end]
        case rec.RemoveStream(stream_id):
            return [2, stream_id]
        case rec.RangeRecord(x):
            return [
                3,
                [x.stream_id, x.epoch, x.range_index, x.start_offset, x.end_offset, x.node_id],
            ]
        case rec.RemoveRange(stream_id, range_index):
            return [4, stream_id, range_index]
        case rec.StreamObjectRecord(so):
            return [5, [so.object_id, so.stream_id, so.start_offset, so.end_offset, so.object_size]]
        case rec.RemoveStreamObject(stream_id, object_id):
            return [6, stream_id, object_id]
        case rec.StreamSetObjectRecord(sso):
            ranges = [[x.stream_id, x.start_offset, x.end_offset] for x in sso.ranges]
            return [
                7,
                sso.object_id,
                sso.node_id,
                sso.order_id,
                sso.data_time_ms,
                sso.object_size,
                ranges,
            ]
        case rec.RemoveStreamSetObject(node_id, object_id):
            return [8, node_id, object_id]
        case rec.S3ObjectRecord(o):
            return [
                9,
                o.object_id,
                int(o.state),
                o.object_size,
                o.prepared_ms,
                o.expires_ms,
                o.committed_ms,
                o.mark_destroyed_ms,
            ]
        case rec.RemoveS3Object(object_id):
            return [10, object_id]
        case rec.NodeRecord(node_id, epoch, failover):
            return [11, node_id, epoch, failover]
        case rec.KVRecord(key, value):
            return [12, key, bytes(value)]
        case rec.RemoveKV(key):
            return [13, key]
        case rec.CounterRecord(name, next_value):
            return [14, name, next_value]
    raise TypeError(f"not a metadata record: {r!r}")


# each tag's fields after the tag: i int, n int or nil, b bool, s str, y bytes, l array
_SHAPES = {
    1: "iiiii",
    2: "i",
    3: "l",
    4: "ii",
    5: "l",
    6: "ii",
    7: "iiiiil",
    8: "ii",
    9: "iiiiinn",
    10: "i",
    11: "iib",
    12: "sy",
    13: "s",
    14: "si",
}
_KINDS: dict[str, tuple[type, ...]] = {
    "i": (int,),
    "n": (int, type(None)),
    "b": (bool,),
    "s": (str,),
    "y": (bytes,),
    "l": (list,),
}


_STREAM_STATES = {int(state): state for state in StreamState}


def _record(f: list[Any]) -> rec.Record:
    # the records of uploads, opens and closes, thousands per entry when a broker hands its
    # partitions over, checked field by field without the general path's generic checks
    if type(f) is list and f and type(f[0]) is int:  # (a bool tag is refused below)
        tag = f[0]
        if tag == 1 and len(f) == 6:
            _, stream_id, epoch, state, start, end = f
            if (
                type(stream_id) is int
                and type(epoch) is int
                and type(start) is int
                and type(end) is int
                and type(state) is int
                and state in _STREAM_STATES
            ):
                return rec.StreamRecord(stream_id, epoch, _STREAM_STATES[state], start, end)
        elif tag == 3 and len(f) == 2:
            fields = f[1]
            if type(fields) is list and len(fields) == 6 and all(type(v) is int for v in fields):
                return rec.RangeRecord(RangeMetadata(*fields))
    return _checked_record(f)


def _checked_record(f: list[Any]) -> rec.Record:
    if not isinstance(f, list) or not f:
        raise TypeError(f"a record is a non-empty array, got {f!r}")
    tag = f[0]
    shape = _SHAPES.get(tag) if isinstance(tag, int) and not isinstance(tag, bool) else None
    if shape is None:
        raise UnknownRecordError(
            f"unknown metadata record tag {tag!r}: written by a newer version?"
        )
    if len(f) != len(shape) + 1 or not all(
        isinstance(v, _KINDS[k]) and (k == "b" or not isinstance(v, bool))
        for v, k in zip(f[1:], shape, strict=True)
    ):
        raise TypeError(f"record {tag} has fields {f[1:]!r}, expected {shape}")
    match tag:
        case 1:
            return rec.StreamRecord(f[1], f[2], StreamState(f[3]), f[4], f[5])
        case 2:
            return rec.RemoveStream(f[1])
        case 3:
            return rec.RangeRecord(RangeMetadata(*_ints(f[1], 6)))
        case 4:
            return rec.RemoveRange(f[1], f[2])
        case 5:
            return rec.StreamObjectRecord(StreamObject(*_ints(f[1], 5)))
        case 6:
            return rec.RemoveStreamObject(f[1], f[2])
        case 7:
            ranges = tuple(
                StreamOffsetRange(x[0], x[1], x[2])
                if type(x) is list
                and len(x) == 3
                and type(x[0]) is int
                and type(x[1]) is int
                and type(x[2]) is int
                else StreamOffsetRange(*_ints(x, 3))
                for x in f[6]
            )
            return rec.StreamSetObjectRecord(StreamSetObject(f[1], f[2], f[3], f[4], f[5], ranges))
        case 8:
            return rec.RemoveStreamSetObject(f[1], f[2])
        case 9:
            obj = S3Object(f[1], ObjectState(f[2]), f[3], f[4], f[5], f[6], f[7])
            return rec.S3ObjectRecord(obj)
        case 10:
            return rec.RemoveS3Object(f[1])
        case 11:
            return rec.NodeRecord(f[1], f[2], bool(f[3]))
        case 12:
            return rec.KVRecord(f[1], f[2])
        case 13:
            return rec.RemoveKV(f[1])
        case 14:
            return rec.CounterRecord(f[1], f[2])
    raise AssertionError(tag)


def _ints(values: Any, n: int) -> list[int]:
    if not isinstance(values, list) or len(values) != n:
        raise TypeError(f"expected {n} fields, got {values!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"expected integers, got {values!r}")
    return values
