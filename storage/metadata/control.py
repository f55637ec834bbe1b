"""The controller's checks, as pure functions: image + request -> change records.

Each function validates a request against the image as AutoMQ's ``StreamControlManager`` /
``S3ObjectControlManager`` do (the few deviations are noted where they occur) and returns the
records that carry it out, or raises :class:`MetadataError` (refused by the metadata's rules)
or ``ValueError`` (a malformed request, i.e. a caller bug). Nothing here does I/O or reads a
clock: ``now`` is passed in, so the manager can persist the records before the image sees them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

from storage.metadata import records as rec
from storage.metadata.image import MetadataImage, sorted_ranges
from storage.metadata.model import (
    INIT_EPOCH,
    NOOP_OBJECT_ID,
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    MetadataError,
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

Records = list[rec.Record]

FIRST_NODE_EPOCH = 1


# -- nodes -----------------------------------------------------------------------------------------


def register_node(
    image: MetadataImage,
    node_id: int,
    replacing: int | None = None,
    rejoining: int | None = None,
) -> tuple[Records, int]:
    """A node (re)starts: a new epoch fences whatever its previous life still sends.

    With ``replacing`` (another node's failover of epoch ``replacing``), only while that epoch
    is still the node's latest: a node that registered again since is recovering its own WAL,
    and a new epoch now would fence that recovery, not the dead incarnation
    (``NODE_EPOCH_EXPIRED``). An epoch a failover registers is marked as one. With
    ``rejoining`` (the node itself, still running at that epoch after it was fenced, which
    moved its epoch on by one), only while no failover has taken its epoch further, and with
    it its WAL, over (``NODE_EPOCH_EXPIRED``)."""
    if node_id < 0:
        raise ValueError(f"node id must not be negative, got {node_id}")
    node = image.nodes.get(node_id)
    if replacing is not None and (node is None or node.epoch != replacing):
        raise MetadataError(
            ErrorCode.NODE_EPOCH_EXPIRED,
            f"node {node_id} epoch {replacing} is not its latest"
            f" ({'never registered' if node is None else f'now {node.epoch}'})",
        )
    if rejoining is not None and (node is None or node.epoch > rejoining + 1):
        raise MetadataError(
            ErrorCode.NODE_EPOCH_EXPIRED,
            f"node {node_id} epoch {rejoining} was taken over by a failover"
            f" ({'never registered' if node is None else f'now {node.epoch}'})",
        )
    epoch = FIRST_NODE_EPOCH if node is None else node.epoch + 1
    return [rec.NodeRecord(node_id, epoch, failover=replacing is not None)], epoch


def check_node_epoch(image: MetadataImage, node_id: int, node_epoch: int) -> NodeMetadata:
    """AutoMQ's ``nodeEpochCheck``; an epoch this controller never issued is refused too."""
    node = image.nodes.get(node_id)
    if node is None:
        raise MetadataError(ErrorCode.NODE_EPOCH_NOT_EXIST, f"node {node_id} is not registered")
    if node.epoch > node_epoch:
        raise MetadataError(
            ErrorCode.NODE_EPOCH_EXPIRED,
            f"node {node_id} epoch {node_epoch} is expired (current {node.epoch})",
        )
    if node.epoch < node_epoch:
        raise MetadataError(
            ErrorCode.NODE_EPOCH_NOT_EXIST,
            f"node {node_id} epoch {node_epoch} was never issued (current {node.epoch})",
        )
    return node


# -- streams ---------------------------------------------------------------------------------------


def create_stream(image: MetadataImage, node_id: int, node_epoch: int) -> tuple[Records, int]:
    """A new stream: CLOSED, epoch INIT_EPOCH, no range, offsets 0."""
    check_node_epoch(image, node_id, node_epoch)
    stream_id = image.next_id(rec.STREAM_ID_COUNTER)
    return [
        rec.CounterRecord(rec.STREAM_ID_COUNTER, stream_id + 1),
        rec.StreamRecord(stream_id, INIT_EPOCH, StreamState.CLOSED, 0, 0),
    ], stream_id


def create_open_streams(
    image: MetadataImage, node_id: int, node_epoch: int, epoch: int, count: int
) -> tuple[Records, list[int]]:
    """``count`` new streams, opened on ``node_id`` at ``epoch``, in one change: each
    stream as :func:`create_stream` then :func:`open_stream` would leave it (a new partition's
    streams cost one metadata transaction, not two per stream)."""
    if epoch < 0:
        raise ValueError(f"stream epoch must not be negative, got {epoch}")
    if count < 1:
        raise ValueError(f"stream count must be positive, got {count}")
    check_node_epoch(image, node_id, node_epoch)
    first = image.next_id(rec.STREAM_ID_COUNTER)
    ids = list(range(first, first + count))
    records: Records = [rec.CounterRecord(rec.STREAM_ID_COUNTER, first + count)]
    for stream_id in ids:
        records += [
            # what open_stream makes of a new stream: its epoch, and range 0 from offset 0
            rec.StreamRecord(stream_id, epoch, StreamState.OPENED, 0, 0),
            rec.RangeRecord(RangeMetadata(stream_id, epoch, 0, 0, 0, node_id)),
        ]
    return records, ids


def create_named_stream(
    image: MetadataImage,
    node_id: int,
    node_epoch: int,
    epoch: int,
    key: str,
    value_of: Callable[[int], bytes],
) -> tuple[Records, int | None]:
    """A new stream opened on ``node_id`` at ``epoch`` and named by KV ``key`` (``key`` =
    ``value_of(stream_id)``), in one change, unless ``key`` already names one: then nothing
    changes and the result is None. Two brokers creating a partition's log at once (its
    leadership moved while the first was creating it) so never both name a MetaStream, the
    second one's KV replacing the first's."""
    if key in image.kv:
        return [], None
    records, (stream_id,) = create_open_streams(image, node_id, node_epoch, epoch, 1)
    return [*records, rec.KVRecord(key, bytes(value_of(stream_id)))], stream_id


def open_stream(
    image: MetadataImage, node_id: int, node_epoch: int, stream_id: int, epoch: int
) -> Records:
    """Open ``stream_id`` on ``node_id`` at ``epoch``.

    An older epoch is fenced. The current epoch by the current owner reopens the same range
    (a no-op if still open). A newer epoch takes the stream over with a new range starting at
    the end offset; unlike AutoMQ (STREAM_NOT_CLOSED), this is allowed while the old owner still
    has it open: the newer epoch fences it.
    """
    if epoch < 0:
        raise ValueError(f"stream epoch must not be negative, got {epoch}")
    check_node_epoch(image, node_id, node_epoch)
    stream = _existing_stream(image, stream_id)
    if stream.epoch > epoch:
        raise MetadataError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream_id} is at epoch {stream.epoch}, newer than {epoch}",
        )
    if stream.epoch == epoch:
        owner = _current_range(stream).node_id
        if owner != node_id:
            raise MetadataError(
                ErrorCode.STREAM_FENCED,
                f"stream {stream_id} epoch {epoch} belongs to node {owner}, not {node_id}",
            )
        if stream.state is StreamState.OPENED:
            return []
        return [_stream_record(stream, state=StreamState.OPENED)]
    last = stream.ranges[-1] if stream.ranges else None
    new_range = RangeMetadata(
        stream_id,
        epoch,
        last.range_index + 1 if last is not None else 0,
        stream.end_offset,
        stream.end_offset,
        node_id,
    )
    return [
        _stream_record(stream, epoch=epoch, state=StreamState.OPENED),
        rec.RangeRecord(new_range),
    ]


def close_stream(
    image: MetadataImage, node_id: int, node_epoch: int, stream_id: int, epoch: int
) -> Records:
    """Close a stream its owner has open; closing a closed stream is a no-op."""
    check_node_epoch(image, node_id, node_epoch)
    stream = _check_ownership(image, stream_id, epoch, node_id)
    if stream.state is StreamState.CLOSED:
        return []
    return [_stream_record(stream, state=StreamState.CLOSED)]


def close_streams(
    image: MetadataImage, node_id: int, node_epoch: int, streams: Sequence[tuple[int, int]]
) -> Records:
    """Close several streams this node owns, each at its epoch ``(stream_id, epoch)``, in one
    change (a broker handing many partitions over at once). Streams already closed, deleted or
    taken over by a newer epoch are skipped: they are not this node's to close any more."""
    check_node_epoch(image, node_id, node_epoch)
    records: Records = []
    for stream_id, epoch in streams:
        try:
            stream = _check_ownership(image, stream_id, epoch, node_id)
        except MetadataError:
            continue
        if stream.state is not StreamState.CLOSED:
            records.append(_stream_record(stream, state=StreamState.CLOSED))
    return records


def close_node_streams(image: MetadataImage, node_id: int, node_epoch: int) -> Records:
    """Close every stream ``node_id`` still has open, in one change: a broker of a cluster that
    restarted has recovered its WAL into objects, and whoever leads those partitions now may
    take them over (a partition it still leads is opened again at the same epoch)."""
    check_node_epoch(image, node_id, node_epoch)
    return [
        _stream_record(stream, state=StreamState.CLOSED)
        for stream in image.streams_opened_by(node_id)
    ]


def trim_stream(
    image: MetadataImage,
    node_id: int,
    node_epoch: int,
    stream_id: int,
    epoch: int,
    new_start_offset: int,
    now: int,
) -> Records:
    """Move the start offset up to ``new_start_offset`` and free what lies wholly below it.

    Ranges below are removed and the one holding the new start begins there (AutoMQ); Stream
    Objects below are removed and MARK_DESTROYED; the stream's ranges below are removed from
    Stream Set Objects, and an SSO left with none is removed and MARK_DESTROYED.
    """
    check_node_epoch(image, node_id, node_epoch)
    stream = _check_ownership(image, stream_id, epoch, node_id)
    if stream.state is not StreamState.OPENED:
        raise MetadataError(ErrorCode.STREAM_NOT_OPENED, f"stream {stream_id} is closed")
    if new_start_offset > stream.end_offset:
        raise MetadataError(
            ErrorCode.OFFSET_NOT_MATCHED,
            f"stream {stream_id}: trim offset {new_start_offset} is past the end "
            f"{stream.end_offset}",
        )
    if new_start_offset <= stream.start_offset:
        return []
    out: Records = [_stream_record(stream, start_offset=new_start_offset)]
    current = stream.ranges[-1].range_index
    for r in stream.ranges:
        if new_start_offset <= r.start_offset:
            continue
        if r.range_index == current:
            out.append(
                rec.RangeRecord(replace(r, start_offset=min(new_start_offset, r.end_offset)))
            )
        elif new_start_offset >= r.end_offset:
            out.append(rec.RemoveRange(stream_id, r.range_index))
        else:
            out.append(rec.RangeRecord(replace(r, start_offset=new_start_offset)))
    for so in stream.stream_objects:
        if so.end_offset <= new_start_offset:
            out.append(rec.RemoveStreamObject(stream_id, so.object_id))
            out.append(_mark_destroyed(image, so.object_id, now))
    out += _prune_stream_set_objects(
        image,
        lambda r: r.stream_id == stream_id and r.end_offset <= new_start_offset,
        now,
    )
    return out


def delete_stream(
    image: MetadataImage, node_id: int, node_epoch: int, stream_id: int, epoch: int, now: int
) -> Records:
    """Delete a closed stream: its Stream Objects are MARK_DESTROYED and it leaves every SSO.

    Deleting a stream that does not exist succeeds (AutoMQ), so retries are safe.
    """
    check_node_epoch(image, node_id, node_epoch)
    stream = image.streams.get(stream_id)
    if stream is None:
        return []
    _check_epoch(stream, epoch)
    if stream.state is not StreamState.CLOSED:
        raise MetadataError(ErrorCode.STREAM_NOT_CLOSED, f"stream {stream_id} is still open")
    out: Records = [rec.RemoveStream(stream_id)]
    out += [_mark_destroyed(image, so.object_id, now) for so in stream.stream_objects]
    out += _prune_stream_set_objects(image, lambda r: r.stream_id == stream_id, now)
    return out


# -- objects ---------------------------------------------------------------------------------------


def prepare_object(image: MetadataImage, count: int, ttl_ms: int, now: int) -> tuple[Records, int]:
    """Reserve ``count`` consecutive object ids, PREPARED until ``now + ttl_ms``."""
    if count < 1:
        raise ValueError(f"count must be positive, got {count}")
    if ttl_ms < 0:
        raise ValueError(f"ttl must not be negative, got {ttl_ms}")
    first = image.next_id(rec.OBJECT_ID_COUNTER)
    out: Records = [rec.CounterRecord(rec.OBJECT_ID_COUNTER, first + count)]
    for object_id in range(first, first + count):
        out.append(
            rec.S3ObjectRecord(S3Object(object_id, ObjectState.PREPARED, 0, now, now + ttl_ms))
        )
    return out, first


def commit_stream_set_object(
    image: MetadataImage,
    node_id: int,
    node_epoch: int,
    object_id: int,
    order_id: int,
    object_size: int,
    stream_ranges: Sequence[CommitRange],
    stream_objects: Sequence[CommitStreamObject],
    compacted_object_ids: Sequence[int],
    now: int,
) -> Records:
    """Commit an upload (no ``compacted_object_ids``) or a compaction of this node's SSOs.

    Order of checks, as AutoMQ: node epoch; the new objects (missing, expired or destroyed ->
    OBJECT_NOT_EXIST; all already committed with the same sizes -> success, nothing changes, so
    retries are safe); for a compaction, the compacted SSOs; for an upload, each stream's
    epoch, state, owner and offsets (each stream continues exactly at its end offset).

    An upload advances the streams' end offsets and records its SSO with ``order_id`` and data
    time ``now``. A compaction advances nothing; its SSO takes the smallest order_id and data
    time of the SSOs it replaces (so SSO order still follows data order), and these are removed
    and MARK_DESTROYED. Compacted data of streams deleted or trimmed meanwhile is dropped: a
    Stream Object (or an SSO) left with nothing is MARK_DESTROYED at once.
    """
    check_node_epoch(image, node_id, node_epoch)
    _validate_commit(object_id, object_size, stream_ranges, stream_objects, compacted_object_ids)
    sizes = {so.object_id: so.object_size for so in stream_objects}
    if object_id != NOOP_OBJECT_ID:
        sizes[object_id] = object_size
    if _already_committed(image, sizes, now):
        return []
    if compacted_object_ids:
        return _commit_compaction(
            image,
            node_id,
            object_id,
            object_size,
            stream_ranges,
            stream_objects,
            compacted_object_ids,
            now,
        )
    return _commit_upload(
        image, node_id, object_id, order_id, object_size, stream_ranges, stream_objects, now
    )


def commit_stream_object(
    image: MetadataImage,
    object_id: int,
    stream_id: int,
    stream_epoch: int,
    start_offset: int,
    end_offset: int,
    object_size: int,
    source_object_ids: Sequence[int],
    now: int,
) -> Records:
    """Replace Stream Objects of one stream by one merged Stream Object (SO compaction).

    ``stream_epoch`` -1 skips the epoch check (AutoMQ, for compactions run off the owner).
    ``object_id`` -1 only destroys the sources (e.g. all of them were trimmed). The new object
    must lie within the sources' span and overlap no other Stream Object of the stream.
    """
    if not source_object_ids:
        raise ValueError("a stream object compaction needs source objects")
    if len(set(source_object_ids)) != len(source_object_ids) or object_id in source_object_ids:
        raise ValueError(f"object ids repeat: {object_id}, sources {list(source_object_ids)}")
    if object_id != NOOP_OBJECT_ID and (start_offset >= end_offset or object_size < 0):
        raise ValueError(
            f"bad stream object {object_id}: [{start_offset}, {end_offset}) size {object_size}"
        )
    stream = _existing_stream(image, stream_id)
    if stream_epoch != INIT_EPOCH:
        _check_epoch(stream, stream_epoch)
    if object_id != NOOP_OBJECT_ID and _already_committed(image, {object_id: object_size}, now):
        return []
    by_id = {so.object_id: so for so in stream.stream_objects}
    missing = [i for i in source_object_ids if i not in by_id]
    if missing:
        raise MetadataError(
            ErrorCode.COMPACTED_OBJECTS_NOT_FOUND,
            f"objects {missing} are not stream objects of stream {stream_id}",
        )
    sources = [by_id[i] for i in source_object_ids]
    out: Records = []
    if object_id != NOOP_OBJECT_ID:
        span = (min(s.start_offset for s in sources), max(s.end_offset for s in sources))
        if start_offset < span[0] or end_offset > span[1]:
            raise MetadataError(
                ErrorCode.OFFSET_NOT_MATCHED,
                f"stream object [{start_offset}, {end_offset}) lies outside its sources' "
                f"[{span[0]}, {span[1]})",
            )
        others = [so for so in stream.stream_objects if so.object_id not in source_object_ids]
        new = StreamObject(object_id, stream_id, start_offset, end_offset, object_size)
        _check_no_overlap(stream, others, [new])
        out += _commit_stream_object(image, stream, new, now)
    for so in sources:
        out.append(rec.RemoveStreamObject(stream_id, so.object_id))
        out.append(_mark_destroyed(image, so.object_id, now))
    return out


def mark_destroyed_done(image: MetadataImage, object_ids: Sequence[int]) -> Records:
    """Forget MARK_DESTROYED objects once they are deleted from object storage (AutoMQ's
    ``RemoveS3ObjectRecord``), so metadata shrinks as objects go. Idempotent: an id handed out
    before and already forgotten is done; an id never handed out is OBJECT_NOT_EXIST."""
    out: Records = []
    for object_id in dict.fromkeys(object_ids):
        obj = image.objects.get(object_id)
        if obj is None:
            if 0 <= object_id < image.next_id(rec.OBJECT_ID_COUNTER):
                continue
            raise MetadataError(ErrorCode.OBJECT_NOT_EXIST, f"object {object_id} does not exist")
        if obj.state not in (ObjectState.MARK_DESTROYED, ObjectState.DESTROYED):
            raise MetadataError(
                ErrorCode.STREAM_INNER_ERROR,
                f"object {object_id} is {obj.state.name}, not marked for deletion",
            )
        out.append(rec.RemoveS3Object(object_id))
    return out


def expire_prepared(image: MetadataImage, now: int) -> tuple[Records, list[int]]:
    """PREPARED objects whose deadline has come are MARK_DESTROYED (a failed upload's leftovers)."""
    expired = sorted(
        o.object_id
        for o in image.objects.values()
        if o.state is ObjectState.PREPARED and o.expires_ms <= now
    )
    return [_mark_destroyed(image, i, now) for i in expired], expired


# -- kv --------------------------------------------------------------------------------------------


def put_kv(key: str, value: bytes) -> Records:
    """Set ``key`` (AutoMQ's KV: e.g. a partition's MetaStream id)."""
    return [rec.KVRecord(key, bytes(value))]


def delete_kv(image: MetadataImage, key: str) -> Records:
    """Drop ``key``; dropping a missing key changes nothing."""
    return [rec.RemoveKV(key)] if key in image.kv else []


# -- helpers ---------------------------------------------------------------------------------------


def _existing_stream(image: MetadataImage, stream_id: int) -> StreamMetadata:
    stream = image.streams.get(stream_id)
    if stream is None:
        raise MetadataError(ErrorCode.STREAM_NOT_EXIST, f"stream {stream_id} does not exist")
    return stream


def _current_range(stream: StreamMetadata) -> RangeMetadata:
    if not stream.ranges:
        # An epoch >= 0 is only ever set together with a range: this is a broken image.
        raise MetadataError(
            ErrorCode.STREAM_INNER_ERROR, f"stream {stream.stream_id} has no current range"
        )
    return stream.ranges[-1]


def _check_epoch(stream: StreamMetadata, epoch: int) -> None:
    if stream.epoch > epoch:
        raise MetadataError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream.stream_id} is at epoch {stream.epoch}, newer than {epoch}",
        )
    if stream.epoch < epoch:
        # The caller claims an epoch no open ever granted (AutoMQ: "should not happen").
        raise MetadataError(
            ErrorCode.STREAM_INNER_ERROR,
            f"stream {stream.stream_id} is at epoch {stream.epoch}, older than {epoch}",
        )


def _check_ownership(
    image: MetadataImage, stream_id: int, epoch: int, node_id: int
) -> StreamMetadata:
    """AutoMQ's ``streamOwnershipCheck``: the stream exists, at ``epoch``, owned by the node."""
    stream = _existing_stream(image, stream_id)
    _check_epoch(stream, epoch)
    owner = _current_range(stream).node_id
    if owner != node_id:
        raise MetadataError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream_id}'s current range belongs to node {owner}, not {node_id}",
        )
    return stream


def _stream_record(
    stream: StreamMetadata,
    *,
    epoch: int | None = None,
    state: StreamState | None = None,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> rec.StreamRecord:
    return rec.StreamRecord(
        stream.stream_id,
        stream.epoch if epoch is None else epoch,
        stream.state if state is None else state,
        stream.start_offset if start_offset is None else start_offset,
        stream.end_offset if end_offset is None else end_offset,
    )


def _mark_destroyed(image: MetadataImage, object_id: int, now: int) -> rec.S3ObjectRecord:
    obj = image.objects.get(object_id)
    if obj is None:
        raise MetadataError(
            ErrorCode.STREAM_INNER_ERROR, f"object {object_id} is referenced but unknown"
        )
    return rec.S3ObjectRecord(replace(obj, state=ObjectState.MARK_DESTROYED, mark_destroyed_ms=now))


def _committed(image: MetadataImage, object_id: int, size: int, now: int) -> rec.S3ObjectRecord:
    obj = image.objects[object_id]
    return rec.S3ObjectRecord(
        replace(obj, state=ObjectState.COMMITTED, object_size=size, committed_ms=now)
    )


def _destroyed_at_once(
    image: MetadataImage, object_id: int, size: int, now: int
) -> rec.S3ObjectRecord:
    """A new object whose data is all gone already (stream deleted or trimmed meanwhile)."""
    obj = image.objects[object_id]
    return rec.S3ObjectRecord(
        replace(
            obj,
            state=ObjectState.MARK_DESTROYED,
            object_size=size,
            committed_ms=now,
            mark_destroyed_ms=now,
        )
    )


def _prune_stream_set_objects(
    image: MetadataImage, drop: Callable[[StreamOffsetRange], bool], now: int
) -> Records:
    """Remove the ranges ``drop`` picks from every SSO; an SSO left empty is destroyed."""
    out: Records = []
    for _, node in sorted(image.nodes.items()):
        for sso in node.stream_set_objects:
            kept = tuple(r for r in sso.ranges if not drop(r))
            if len(kept) == len(sso.ranges):
                continue
            if kept:
                out.append(rec.StreamSetObjectRecord(replace(sso, ranges=kept)))
            else:
                out.append(rec.RemoveStreamSetObject(node.node_id, sso.object_id))
                out.append(_mark_destroyed(image, sso.object_id, now))
    return out


def _validate_commit(
    object_id: int,
    object_size: int,
    stream_ranges: Sequence[CommitRange],
    stream_objects: Sequence[CommitStreamObject],
    compacted_object_ids: Sequence[int],
) -> None:
    ids = [so.object_id for so in stream_objects] + list(compacted_object_ids)
    if object_id != NOOP_OBJECT_ID:
        ids.append(object_id)
    if len(set(ids)) != len(ids) or NOOP_OBJECT_ID in ids[: len(stream_objects)]:
        raise ValueError(f"object ids repeat or are missing in the commit: {ids}")
    if object_id == NOOP_OBJECT_ID and stream_ranges:
        raise ValueError("stream ranges given without a stream set object")
    if object_id == NOOP_OBJECT_ID and not stream_objects and not compacted_object_ids:
        raise ValueError("nothing to commit")
    if object_size < 0 or any(so.object_size < 0 for so in stream_objects):
        raise ValueError("object sizes must not be negative")
    pieces: list[CommitRange | CommitStreamObject] = [*stream_ranges, *stream_objects]
    for piece in pieces:
        if not 0 <= piece.start_offset < piece.end_offset:
            raise ValueError(f"bad offsets in commit: {piece}")


def _already_committed(image: MetadataImage, sizes: dict[int, int], now: int) -> bool:
    """True if every object is COMMITTED with these sizes (a retry); raise if not all PREPARED.

    An object that does not exist, was destroyed or whose PREPARED deadline has passed is
    OBJECT_NOT_EXIST; a mix of committed and prepared objects, or a committed one of another
    size, is REDUNDANT_OPERATION: that is not a retry of the same commit.
    """
    committed = []
    for object_id in sorted(sizes):
        obj = image.objects.get(object_id)
        if obj is None or obj.state in (ObjectState.MARK_DESTROYED, ObjectState.DESTROYED):
            raise MetadataError(ErrorCode.OBJECT_NOT_EXIST, f"object {object_id} does not exist")
        if obj.state is ObjectState.PREPARED and now >= obj.expires_ms:
            raise MetadataError(
                ErrorCode.OBJECT_NOT_EXIST, f"object {object_id} expired at {obj.expires_ms}"
            )
        if obj.state is ObjectState.COMMITTED:
            committed.append(obj)
    if not committed:
        return False
    if len(committed) == len(sizes) and all(o.object_size == sizes[o.object_id] for o in committed):
        return True
    raise MetadataError(
        ErrorCode.REDUNDANT_OPERATION,
        f"objects {[o.object_id for o in committed]} were already committed by another commit",
    )


def _commit_upload(
    image: MetadataImage,
    node_id: int,
    object_id: int,
    order_id: int,
    object_size: int,
    stream_ranges: Sequence[CommitRange],
    stream_objects: Sequence[CommitStreamObject],
    now: int,
) -> Records:
    pieces: dict[int, list[CommitRange | CommitStreamObject]] = {}
    all_pieces: list[CommitRange | CommitStreamObject] = [*stream_ranges, *stream_objects]
    for piece in all_pieces:
        pieces.setdefault(piece.stream_id, []).append(piece)
    new_ends: dict[int, int] = {}
    for stream_id, stream_pieces in sorted(pieces.items()):
        stream = _existing_stream(image, stream_id)
        for piece in stream_pieces:
            if isinstance(piece, CommitRange):
                _check_epoch(stream, piece.epoch)
        if stream.state is not StreamState.OPENED:
            raise MetadataError(ErrorCode.STREAM_NOT_OPENED, f"stream {stream_id} is closed")
        owner = _current_range(stream).node_id
        if owner != node_id:
            raise MetadataError(
                ErrorCode.STREAM_FENCED,
                f"stream {stream_id}'s current range belongs to node {owner}, not {node_id}",
            )
        end = stream.end_offset
        for piece in sorted(stream_pieces, key=lambda p: p.start_offset):
            if piece.start_offset != end:
                raise MetadataError(
                    ErrorCode.OFFSET_NOT_MATCHED,
                    f"stream {stream_id}: commit starts at {piece.start_offset}, "
                    f"the stream ends at {end}",
                )
            end = piece.end_offset
        new_ends[stream_id] = end

    out: Records = []
    for so in stream_objects:
        out.append(_committed(image, so.object_id, so.object_size, now))
    for stream_id, end in sorted(new_ends.items()):
        stream = image.streams[stream_id]
        out.append(_stream_record(stream, end_offset=end))
        r = stream.ranges[-1]  # built directly: an upload's commit names thousands of streams
        out.append(
            rec.RangeRecord(
                RangeMetadata(r.stream_id, r.epoch, r.range_index, r.start_offset, end, r.node_id)
            )
        )
    for so in stream_objects:
        out.append(
            rec.StreamObjectRecord(
                StreamObject(
                    so.object_id, so.stream_id, so.start_offset, so.end_offset, so.object_size
                )
            )
        )
    if object_id != NOOP_OBJECT_ID:
        out.append(_committed(image, object_id, object_size, now))
        ranges = sorted_ranges(
            StreamOffsetRange(r.stream_id, r.start_offset, r.end_offset) for r in stream_ranges
        )
        out.append(
            rec.StreamSetObjectRecord(
                StreamSetObject(object_id, node_id, order_id, now, object_size, ranges)
            )
        )
    return out


def _commit_compaction(
    image: MetadataImage,
    node_id: int,
    object_id: int,
    object_size: int,
    stream_ranges: Sequence[CommitRange],
    stream_objects: Sequence[CommitStreamObject],
    compacted_object_ids: Sequence[int],
    now: int,
) -> Records:
    node = image.nodes[node_id]
    ssos = {sso.object_id: sso for sso in node.stream_set_objects}
    missing = [
        i
        for i in compacted_object_ids
        if i not in ssos or image.objects[i].state is not ObjectState.COMMITTED
    ]
    if missing:
        raise MetadataError(
            ErrorCode.COMPACTED_OBJECTS_NOT_FOUND,
            f"objects {missing} are not committed stream set objects of node {node_id}",
        )
    compacted = [ssos[i] for i in compacted_object_ids]
    # Check everything before producing records, so a refusal leaves no half-made plan.
    new_sos: dict[int, list[StreamObject]] = {}
    for so in stream_objects:
        new_sos.setdefault(so.stream_id, []).append(
            StreamObject(so.object_id, so.stream_id, so.start_offset, so.end_offset, so.object_size)
        )
    for stream_id, sos in new_sos.items():
        stream = image.streams.get(stream_id)
        if stream is not None:
            _check_no_overlap(stream, stream.stream_objects, sos)
    for r in stream_ranges:
        stream = image.streams.get(r.stream_id)
        if stream is not None and r.end_offset > stream.end_offset:
            raise MetadataError(
                ErrorCode.OFFSET_NOT_MATCHED,
                f"stream {r.stream_id}: compacted range ends at {r.end_offset}, past the "
                f"stream's end {stream.end_offset}",
            )

    out: Records = []
    for sos in new_sos.values():
        for new_so in sos:
            stream = image.streams.get(new_so.stream_id)
            if stream is None:
                out.append(_destroyed_at_once(image, new_so.object_id, new_so.object_size, now))
            else:
                out += _commit_stream_object(image, stream, new_so, now)
    if object_id != NOOP_OBJECT_ID:
        kept = sorted_ranges(
            StreamOffsetRange(r.stream_id, r.start_offset, r.end_offset)
            for r in stream_ranges
            if _live(image.streams.get(r.stream_id), r.end_offset)
        )
        if kept:
            out.append(_committed(image, object_id, object_size, now))
            out.append(
                rec.StreamSetObjectRecord(
                    StreamSetObject(
                        object_id,
                        node_id,
                        min(s.order_id for s in compacted),
                        min(s.data_time_ms for s in compacted),
                        object_size,
                        kept,
                    )
                )
            )
        else:
            out.append(_destroyed_at_once(image, object_id, object_size, now))
    for sso in compacted:
        out.append(rec.RemoveStreamSetObject(node_id, sso.object_id))
        out.append(_mark_destroyed(image, sso.object_id, now))
    return out


def _live(stream: StreamMetadata | None, end_offset: int) -> bool:
    """Whether data ending at ``end_offset`` is still part of the stream (not trimmed away)."""
    return stream is not None and end_offset > stream.start_offset


def _commit_stream_object(
    image: MetadataImage, stream: StreamMetadata, so: StreamObject, now: int
) -> Records:
    if not _live(stream, so.end_offset):
        return [_destroyed_at_once(image, so.object_id, so.object_size, now)]
    return [
        _committed(image, so.object_id, so.object_size, now),
        rec.StreamObjectRecord(so),
    ]


def _check_no_overlap(
    stream: StreamMetadata, existing: Sequence[StreamObject], new: Sequence[StreamObject]
) -> None:
    """New Stream Objects must end by the stream's end and overlap no other Stream Object."""
    placed = sorted([*existing, *new], key=lambda so: so.start_offset)
    for so in new:
        if so.end_offset > stream.end_offset:
            raise MetadataError(
                ErrorCode.OFFSET_NOT_MATCHED,
                f"stream {stream.stream_id}: stream object {so.object_id} ends at "
                f"{so.end_offset}, past the stream's end {stream.end_offset}",
            )
    for a, b in itertools.pairwise(placed):
        if a.end_offset > b.start_offset:
            raise MetadataError(
                ErrorCode.OFFSET_NOT_MATCHED,
                f"stream {stream.stream_id}: stream objects {a.object_id} and {b.object_id} "
                f"overlap",
            )
