"""Opening a partition's log (Kafka's ``LogLoader``): the MetaStream found or created, its
records read, the streams opened at the partition's epoch, an unclean stop repaired and the
producer state rebuilt; and a deleted topic's log destroyed.

The metadata KV maps ``<namespace>/<topicId>/<partition>`` (:func:`meta_stream_key`) to the
MetaStream id, an 8-byte big-endian long. A log without a ``LOG`` record is new: its ``log``
and ``tim`` streams are created and its first records written in AutoMQ's order (``PARTITION``,
``LOG``, ``LEADER_EPOCH_CHECKPOINT``). Otherwise the records describe it; ``PARTITION``'s
clean-shutdown flag says whether its active segment must be scanned again, and it is written
false before the log is used, so that a crash is noticed on the next open.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import struct
import time
from collections.abc import Callable, Sequence

from automq_py.log import meta_stream_record as keys
from automq_py.log.elastic_log import ElasticLog, batch_marker
from automq_py.log.elastic_log_meta import (
    LOG_STREAM,
    NO_STREAM,
    TIME_STREAM,
    TXN_STREAM,
    CorruptLogMetaError,
    ElasticLogMeta,
    ElasticPartitionMeta,
    ElasticStreamSegmentMeta,
)
from automq_py.log.elastic_log_segment import ElasticLogSegment
from automq_py.log.leader_epoch_cache import LeaderEpochCache
from automq_py.log.log_config import LogConfig
from automq_py.log.meta_stream import MetaStream
from automq_py.log.meta_stream_record import LeaderEpochCheckpoint
from automq_py.producer_state import InvalidProducerSnapshotError, ProducerStateManager
from storage.errors import StreamFencedError
from storage.metadata.manager import MetadataManager
from storage.stream import S3Stream, StreamClient, close_streams

log = logging.getLogger(__name__)

STREAM_ID = struct.Struct(">q")


class LogCreatedElsewhereError(RuntimeError):
    """The partition's log was created by another broker while this one was creating it (its
    leadership moved meanwhile): open it again once that broker has handed it over."""


def meta_stream_key(namespace: str, topic_id: str, partition: int) -> str:
    """The metadata KV key holding a partition's MetaStream id."""
    return f"{namespace}/{topic_id}/{partition}"


def _meta_stream_id(metadata: MetadataManager, key: str) -> int | None:
    """The MetaStream id KV ``key`` holds, None if it holds none."""
    raw = metadata.get_kv(key)
    if raw is None:
        return None
    if len(raw) != STREAM_ID.size:
        raise CorruptLogMetaError(f"KV {key!r} holds {len(raw)} bytes, not an 8-byte id")
    (stream_id,) = STREAM_ID.unpack(raw)
    return int(stream_id)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


async def open_log(
    client: StreamClient,
    metadata: MetadataManager,
    namespace: str,
    topic_id: str,
    partition: int,
    epoch: int,
    config: LogConfig,
    *,
    clock: Callable[[], int] | None = None,
    lead: bool = False,
) -> ElasticLog:
    """Open (or create) the partition's log at ``epoch``, fencing any previous owner. ``lead``:
    the opener leads the partition, and its leader epoch ``epoch`` starts at the log end (as
    Kafka's makeLeader assigns it), recorded in the same append as the open's own records. An
    open that fails or is cancelled once it has opened streams closes them again before it
    raises."""
    clock = clock or _wall_clock_ms
    key = meta_stream_key(namespace, topic_id, partition)
    stream_id = _meta_stream_id(metadata, key)
    if stream_id is None:
        # created and named in one change: a retry after a crash reuses it instead of leaking
        # it, and a broker that named one first keeps it
        created = await client.create_and_open_named(key, STREAM_ID.pack, epoch)
        if created is None:
            raise LogCreatedElsewhereError(
                f"partition {topic_id}-{partition}: another broker created its log meanwhile"
            )
        stream = created
    else:
        stream = await client.open(stream_id, epoch)
    meta_stream = MetaStream(stream)
    opened = [stream]  # the streams this open has opened so far
    try:
        await meta_stream.replay()
        if meta_stream.get(keys.LOG) is None:
            return await _create(client, meta_stream, epoch, config, clock, opened, lead)
        return await _load(client, meta_stream, epoch, config, clock, opened, lead)
    except BaseException:
        # closed again (what the open wrote uploaded first), as a log that closes: the
        # partition is not left open here at this epoch, and its next owner, here or on
        # another broker (which waits for the MetaStream to close), opens it as after a
        # handover. Cancelled too (a broker stopping cancels the opens that outlast it).
        await _close_after_failure(opened, f"{topic_id}-{partition}")
        raise


async def _close_after_failure(streams: list[S3Stream], partition: str) -> None:
    try:
        await close_streams(streams[0].storage, streams)
    except Exception as e:  # the failure that ended the open is what the caller hears of
        # (fenced: another broker has the partition now, nothing here to close)
        level = logging.DEBUG if isinstance(e, StreamFencedError) else logging.WARNING
        log.log(level, "partition %s: closing the streams of a failed open: %r", partition, e)


async def destroy_log(client: StreamClient, metadata: MetadataManager, key: str, epoch: int) -> int:
    """Delete the streams of the (closed) log whose MetaStream id KV ``key`` holds, then the
    key: its topic was deleted. Returns how many streams were deleted. Safe to repeat after a
    crash: the key goes last, so whatever is left is found again."""
    meta_id = _meta_stream_id(metadata, key)
    if meta_id is None:
        return 0
    streams: list[int] = []
    meta = metadata.stream(meta_id)
    if meta is not None:
        # its epoch is the partition's last leader epoch, which may be past ``epoch`` (a
        # cluster's leaders move), and at its own another node's: read at a newer one
        meta_stream = MetaStream(await client.open(meta_id, max(epoch, meta.epoch + 1)))
        await meta_stream.replay()
        log_meta = meta_stream.get(keys.LOG)
        await meta_stream.close()
        if log_meta is not None:
            decoded = ElasticLogMeta.decode(log_meta)
            streams = [sid for sid in decoded.stream_map.values() if sid >= 0]
        streams.append(meta_id)  # the MetaStream last: it names the others
    for stream_id in streams:
        await client.destroy(stream_id, epoch)
    await metadata.delete_kv(key)
    return len(streams)


async def _create(
    client: StreamClient,
    meta_stream: MetaStream,
    epoch: int,
    config: LogConfig,
    clock: Callable[[], int],
    opened: list[S3Stream],
    lead: bool,
) -> ElasticLog:
    log_stream, time_stream = await client.create_and_open_many(2, epoch)
    opened += (log_stream, time_stream)
    streams = {LOG_STREAM: log_stream, TIME_STREAM: time_stream}
    stream_map = {
        LOG_STREAM: log_stream.stream_id,
        TIME_STREAM: time_stream.stream_id,
        TXN_STREAM: NO_STREAM,
    }
    first = ElasticLogSegment.of(
        ElasticStreamSegmentMeta.new_active(
            0, clock(), log_stream.next_offset, time_stream.next_offset, 0
        ),
        streams,
        config,
    )
    partition_meta = ElasticPartitionMeta()
    leader_epochs = LeaderEpochCache()
    if lead:
        leader_epochs.assign(epoch, 0)
    # the records AutoMQ writes for a new partition, in its order
    await meta_stream.put_many(
        [
            (keys.PARTITION, partition_meta.encode()),
            (keys.LOG, ElasticLogMeta(dict(stream_map), (first.meta(),)).encode()),
            (keys.LEADER_EPOCH_CHECKPOINT, leader_epochs.checkpoint().encode()),
        ]
    )
    log.info("created log with MetaStream %d, streams %s", meta_stream.stream_id, stream_map)
    return ElasticLog(
        client=client,
        meta_stream=meta_stream,
        streams=streams,
        stream_map=stream_map,
        segments=[first],
        partition_meta=partition_meta,
        leader_epochs=leader_epochs,
        producer_state=ProducerStateManager(),
        config=config,
        epoch=epoch,
        clock=clock,
    )


async def _load(
    client: StreamClient,
    meta_stream: MetaStream,
    epoch: int,
    config: LogConfig,
    clock: Callable[[], int],
    opened: list[S3Stream],
    lead: bool,
) -> ElasticLog:
    log_meta = ElasticLogMeta.decode(meta_stream.get(keys.LOG) or b"")
    raw_partition = meta_stream.get(keys.PARTITION)
    partition_meta = (
        ElasticPartitionMeta.decode(raw_partition) if raw_partition else ElasticPartitionMeta()
    )
    raw_epochs = meta_stream.get(keys.LEADER_EPOCH_CHECKPOINT)
    leader_epochs = LeaderEpochCache(
        LeaderEpochCheckpoint.decode(raw_epochs).entries if raw_epochs else ()
    )
    if not log_meta.segment_metas:
        raise CorruptLogMetaError(f"MetaStream {meta_stream.stream_id}: LOG has no segments")
    names = [name for name, sid in log_meta.stream_map.items() if sid != NO_STREAM]
    # together: opens of the same moment share one metadata change
    outcomes = await asyncio.gather(
        *(client.open(log_meta.stream_map[name], epoch) for name in names),
        return_exceptions=True,
    )
    streams = {n: s for n, s in zip(names, outcomes, strict=True) if isinstance(s, S3Stream)}
    opened += streams.values()
    failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
    if failed is not None:
        raise failed
    segments = [ElasticLogSegment.of(m, streams, config) for m in log_meta.segment_metas]
    clean = partition_meta.cleaned_shutdown
    start_offset = max(partition_meta.start_offset, segments[0].base_offset)
    if not clean and await _recover(segments[-1], leader_epochs):
        await meta_stream.put(keys.LEADER_EPOCH_CHECKPOINT, leader_epochs.checkpoint().encode())
    producer_state = await _load_producer_state(meta_stream, segments, start_offset, clean, clock)
    # from now on a crash must be noticed on the next open
    partition_meta = dataclasses.replace(
        partition_meta, start_offset=start_offset, cleaned_shutdown=False
    )
    writes = [(keys.PARTITION, partition_meta.encode())]
    if lead and leader_epochs.assign(epoch, segments[-1].assigned_end):
        writes.append((keys.LEADER_EPOCH_CHECKPOINT, leader_epochs.checkpoint().encode()))
    await meta_stream.put_many(writes)
    # the partition's opening is logged by its owner; a recovery is worth a line of its own
    (log.debug if clean else log.info)(
        "opened log with MetaStream %d at epoch %d: [%d, %d), %d segments%s",
        meta_stream.stream_id,
        epoch,
        start_offset,
        segments[-1].assigned_end,
        len(segments),
        "" if clean else ", recovered after an unclean stop",
    )
    return ElasticLog(
        client=client,
        meta_stream=meta_stream,
        streams=streams,
        stream_map=dict(log_meta.stream_map),
        segments=segments,
        partition_meta=partition_meta,
        leader_epochs=leader_epochs,
        producer_state=producer_state,
        config=config,
        epoch=epoch,
        clock=clock,
    )


async def _recover(active: ElasticLogSegment, leader_epochs: LeaderEpochCache) -> bool:
    """After an unclean stop: rebuild the active segment's state from its batches, and record
    the leader epochs they start. Whether the epochs changed."""
    if active.log_stream.confirmed_offset < active.log_slice.start:
        raise CorruptLogMetaError(
            f"log stream {active.log_stream.stream_id} ends at "
            f"{active.log_stream.confirmed_offset}, before the active segment's slice "
            f"{active.log_slice}"
        )
    changed = False
    for epoch, offset in await active.recover():
        latest = leader_epochs.latest_epoch
        if latest is None or epoch > latest:
            changed |= leader_epochs.assign(epoch, offset)
    return changed


async def _load_producer_state(
    meta_stream: MetaStream,
    segments: Sequence[ElasticLogSegment],
    start_offset: int,
    clean: bool,
    clock: Callable[[], int],
) -> ProducerStateManager:
    """Restore ``PRODUCER_SNAPSHOTS``, then replay the batches appended after it.

    Without a usable snapshot only the active segment is replayed: every roll writes a
    snapshot, so only a log from before snapshots existed lacks one, and reading all of its
    segments back from object storage on open would cost more than the state is worth. After
    a ``clean`` close there is nothing to replay without one: the close writes a snapshot
    whenever it holds producer state (and replaying would read the whole active segment back
    from object storage on the first fetch after a restart).
    """
    state = ProducerStateManager()
    start = segments[-1].base_offset
    raw = meta_stream.get(keys.PRODUCER_SNAPSHOTS)
    if raw is None and clean:
        return state
    if raw is not None:
        log_end = segments[-1].assigned_end
        try:
            snapshot, offset = ProducerStateManager.from_snapshot(raw)
        except InvalidProducerSnapshotError as e:
            log.error("MetaStream %d: ignoring PRODUCER_SNAPSHOTS: %s", meta_stream.stream_id, e)
        else:
            if offset <= log_end:
                state, start = snapshot, offset
            else:  # a snapshot past the log end describes batches this log does not have
                log.warning(
                    "MetaStream %d: producer snapshot at %d is past the log end %d",
                    meta_stream.stream_id,
                    offset,
                    log_end,
                )
    start = max(start, start_offset)
    replayed = 0
    now = clock()  # replayed producers count as seen now: expiry only errs late
    for segment in segments:
        if segment.next_offset <= start:
            continue
        async for view in segment.batches(start):
            if view.header.last_offset >= start:
                state.update(
                    view.header, view.header.base_offset, now, batch_marker(view.header, view.data)
                )
                replayed += 1
    if replayed:
        log.info(
            "MetaStream %d: producer state rebuilt from %d batches after offset %d",
            meta_stream.stream_id,
            replayed,
            start,
        )
    return state
