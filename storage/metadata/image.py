"""MetadataImage: the in-memory state every metadata read consults, changed only by records.

The image holds immutable values (``model``); applying a record swaps the value it changes.
Orderings are fixed here, once, for both ``apply`` and loading from a store:

* a stream's ranges by range_index, its Stream Objects by (start_offset, object_id);
* a node's Stream Set Objects by (order_id, object_id), an SSO's ranges by (stream_id, start).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from storage.metadata import records as rec
from storage.metadata.model import (
    NodeMetadata,
    ObjectState,
    RangeMetadata,
    S3Object,
    S3ObjectMetadata,
    S3ObjectType,
    StreamMetadata,
    StreamObject,
    StreamOffsetRange,
    StreamSetObject,
    StreamState,
)

_MAX = 1 << 63  # above any offset or id


def range_order(r: RangeMetadata) -> int:
    """Sort key of a stream's ranges."""
    return r.range_index


def stream_object_order(so: StreamObject) -> tuple[int, int]:
    """Sort key of a stream's Stream Objects."""
    return (so.start_offset, so.object_id)


def stream_set_object_order(sso: StreamSetObject) -> tuple[int, int]:
    """Sort key of a node's Stream Set Objects: data order, then id."""
    return (sso.order_id, sso.object_id)


def offset_range_order(r: StreamOffsetRange) -> tuple[int, int]:
    """Sort key of an SSO's ranges, as in the object's index."""
    return (r.stream_id, r.start_offset)


def sorted_ranges(ranges: Iterable[StreamOffsetRange]) -> tuple[StreamOffsetRange, ...]:
    """An SSO's ranges in the order the image keeps them."""
    return tuple(sorted(ranges, key=offset_range_order))


@dataclass(eq=True)
class MetadataImage:
    """Streams, nodes, objects, KV pairs and id counters, as the durable store last committed.

    Callers read it and never change it; only :meth:`apply` does, with records that the store
    has already persisted.
    """

    streams: dict[int, StreamMetadata] = field(default_factory=dict)
    nodes: dict[int, NodeMetadata] = field(default_factory=dict)
    objects: dict[int, S3Object] = field(default_factory=dict)
    kv: dict[str, bytes] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    # stream id -> sorted (start offset, end offset, object id) of the SSO ranges holding it,
    # and the SSOs by id: built on the first lookup, then kept current by apply (None: not yet)
    _sso_ranges: dict[int, list[tuple[int, int, int]]] | None = field(
        default=None, compare=False, repr=False
    )
    _ssos: dict[int, StreamSetObject] = field(default_factory=dict, compare=False, repr=False)

    # -- reads -----------------------------------------------------------------------------------

    def next_id(self, counter: str) -> int:
        """The next id ``counter`` will hand out (ids start at 0, as in AutoMQ)."""
        return self.counters.get(counter, 0)

    def stream(self, stream_id: int) -> StreamMetadata | None:
        """The stream's metadata, or None."""
        return self.streams.get(stream_id)

    def streams_opened_by(self, node_id: int) -> list[StreamMetadata]:
        """Streams in state OPENED whose current range belongs to ``node_id``, by id."""
        return [
            s
            for _, s in sorted(self.streams.items())
            if s.state is StreamState.OPENED and s.owner == node_id
        ]

    def objects_to_delete(self, marked_by_ms: int) -> list[S3Object]:
        """MARK_DESTROYED objects marked at or before ``marked_by_ms``, by id (a retention of
        zero deletes what was marked in the same millisecond)."""
        return [
            o
            for _, o in sorted(self.objects.items())
            if o.state is ObjectState.MARK_DESTROYED
            and o.mark_destroyed_ms is not None
            and o.mark_destroyed_ms <= marked_by_ms
        ]

    def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int, limit: int
    ) -> list[S3ObjectMetadata]:
        """The objects holding ``[start_offset, end_offset)`` of a stream, in offset order.

        Seed 001's lookup: take the stream's Stream Objects in order while they cover the next
        offset; where they stop, binary-search the stream's ranges for the one holding that
        offset, and look through its node's Stream Set Objects (order_id order) for the one
        holding the stream there; repeat. ``end_offset`` -1 means the stream's end. Stops after
        ``limit`` objects, or where no object holds the next offset (a partial answer).
        """
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        stream = self.streams.get(stream_id)
        if stream is None:
            return []
        end = stream.end_offset if end_offset == -1 else end_offset
        sos = stream.stream_objects
        # Stream Objects never overlap, so their end offsets are sorted too.
        so_index = bisect.bisect_right(sos, start_offset, key=lambda so: so.end_offset)
        out: list[S3ObjectMetadata] = []
        pos = start_offset
        while pos < end and len(out) < limit:
            if so_index < len(sos) and sos[so_index].start_offset <= pos:
                so = sos[so_index]
                out.append(
                    S3ObjectMetadata(
                        so.object_id,
                        so.object_size,
                        S3ObjectType.STREAM,
                        so.start_offset,
                        so.end_offset,
                    )
                )
                pos = so.end_offset
                so_index += 1
                continue
            found = self._stream_set_object_at(stream, pos)
            if found is None:
                break
            sso, held = found
            out.append(
                S3ObjectMetadata(
                    sso.object_id,
                    sso.object_size,
                    S3ObjectType.STREAM_SET,
                    held.start_offset,
                    held.end_offset,
                )
            )
            pos = held.end_offset
            so_index = bisect.bisect_right(sos, pos, key=lambda so: so.end_offset)
        return out

    def _stream_set_object_at(
        self, stream: StreamMetadata, offset: int
    ) -> tuple[StreamSetObject, StreamOffsetRange] | None:
        ranges = stream.ranges
        # Range start offsets never decrease; the last range starting at or before ``offset``
        # is the one that may hold it (an empty range before it shares its start).
        i = bisect.bisect_right(ranges, offset, key=lambda r: r.start_offset) - 1
        if i < 0 or offset >= ranges[i].end_offset:
            return None
        entries = self._sso_index().get(stream.stream_id, [])
        # the last SSO range starting at or before ``offset``; earlier ones only while a
        # compaction's records are half applied (its sources and result overlap)
        j = bisect.bisect_right(entries, (offset, _MAX, _MAX)) - 1
        while j >= 0:
            _, end, object_id = entries[j]
            if offset < end:
                sso = self._ssos[object_id]
                k = bisect.bisect_right(
                    sso.ranges, (stream.stream_id, offset), key=offset_range_order
                )
                return sso, sso.ranges[k - 1]
            j -= 1
        return None

    def _sso_index(self) -> dict[int, list[tuple[int, int, int]]]:
        if self._sso_ranges is None:
            self._sso_ranges, self._ssos = {}, {}
            for node in self.nodes.values():
                for sso in node.stream_set_objects:
                    self._index_sso(sso)
        return self._sso_ranges

    def _index_sso(self, sso: StreamSetObject) -> None:
        assert self._sso_ranges is not None
        self._ssos[sso.object_id] = sso
        for r in sso.ranges:
            entries = self._sso_ranges.setdefault(r.stream_id, [])
            bisect.insort(entries, (r.start_offset, r.end_offset, sso.object_id))

    def _unindex_sso(self, object_id: int) -> None:
        assert self._sso_ranges is not None
        sso = self._ssos.pop(object_id, None)
        if sso is None:
            return
        for r in sso.ranges:
            entries = self._sso_ranges[r.stream_id]
            entries.remove((r.start_offset, r.end_offset, object_id))
            if not entries:
                del self._sso_ranges[r.stream_id]

    # -- changes ---------------------------------------------------------------------------------

    def apply(self, records: Sequence[rec.Record]) -> None:
        """Apply records, in order, that the durable store has persisted."""
        for r in records:
            self._apply(r)

    def _apply(self, r: rec.Record) -> None:
        match r:
            case rec.StreamRecord(stream_id, epoch, state, start_offset, end_offset):
                old = self.streams.get(stream_id)
                if old is None:
                    self.streams[stream_id] = StreamMetadata(
                        stream_id, epoch, state, start_offset, end_offset
                    )
                else:  # built directly: dataclasses.replace costs several times more, and an
                    # upload's commit changes thousands of streams
                    self.streams[stream_id] = StreamMetadata(
                        stream_id,
                        epoch,
                        state,
                        start_offset,
                        end_offset,
                        old.ranges,
                        old.stream_objects,
                    )
            case rec.RemoveStream(stream_id):
                del self.streams[stream_id]
            case rec.RangeRecord(new_range):
                s = self.streams[new_range.stream_id]
                if s.ranges and s.ranges[-1].range_index == new_range.range_index:
                    ranges = (*s.ranges[:-1], new_range)  # the current range grew
                elif not s.ranges or s.ranges[-1].range_index < new_range.range_index:
                    ranges = (*s.ranges, new_range)  # a new range
                else:
                    others = [x for x in s.ranges if x.range_index != new_range.range_index]
                    ranges = tuple(sorted([*others, new_range], key=range_order))
                self.streams[s.stream_id] = StreamMetadata(
                    s.stream_id,
                    s.epoch,
                    s.state,
                    s.start_offset,
                    s.end_offset,
                    ranges,
                    s.stream_objects,
                )
            case rec.RemoveRange(stream_id, range_index):
                s = self.streams[stream_id]
                ranges = tuple(x for x in s.ranges if x.range_index != range_index)
                self.streams[stream_id] = replace(s, ranges=ranges)
            case rec.StreamObjectRecord(so):
                s = self.streams[so.stream_id]
                other_sos = [x for x in s.stream_objects if x.object_id != so.object_id]
                sos = tuple(sorted([*other_sos, so], key=stream_object_order))
                self.streams[s.stream_id] = replace(s, stream_objects=sos)
            case rec.RemoveStreamObject(stream_id, object_id):
                s = self.streams[stream_id]
                left = tuple(x for x in s.stream_objects if x.object_id != object_id)
                self.streams[stream_id] = replace(s, stream_objects=left)
            case rec.StreamSetObjectRecord(sso):
                n = self.nodes[sso.node_id]
                sso = replace(sso, ranges=sorted_ranges(sso.ranges))
                other_ssos = [x for x in n.stream_set_objects if x.object_id != sso.object_id]
                ssos = tuple(sorted([*other_ssos, sso], key=stream_set_object_order))
                self.nodes[n.node_id] = replace(n, stream_set_objects=ssos)
                if self._sso_ranges is not None:
                    self._unindex_sso(sso.object_id)
                    self._index_sso(sso)
            case rec.RemoveStreamSetObject(node_id, object_id):
                n = self.nodes[node_id]
                left_ssos = tuple(x for x in n.stream_set_objects if x.object_id != object_id)
                self.nodes[node_id] = replace(n, stream_set_objects=left_ssos)
                if self._sso_ranges is not None:
                    self._unindex_sso(object_id)
            case rec.S3ObjectRecord(obj):
                self.objects[obj.object_id] = obj
            case rec.RemoveS3Object(object_id):
                self.objects.pop(object_id, None)
            case rec.NodeRecord(node_id, epoch, failover):
                old_node = self.nodes.get(node_id)
                if old_node is None:
                    self.nodes[node_id] = NodeMetadata(node_id, epoch, failover)
                else:
                    self.nodes[node_id] = replace(old_node, epoch=epoch, failover=failover)
            case rec.KVRecord(key, value):
                self.kv[key] = value
            case rec.RemoveKV(key):
                self.kv.pop(key, None)
            case rec.CounterRecord(name, next_value):
                self.counters[name] = next_value
