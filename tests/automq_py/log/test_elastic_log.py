"""ElasticLog over a real S3Storage: layout in the MetaStream, append/read across rolls,
reopen after a clean close and after a crash, truncation and fencing."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import struct
from pathlib import Path
from typing import Any

import crc32c
import pytest

from automq_py.log import log_loader
from automq_py.log import meta_stream_record as keys
from automq_py.log.elastic_log import ElasticLog, LogOffsetOutOfRangeError
from automq_py.log.elastic_log_meta import (
    CLEANED_SUFFIX,
    LOG_STREAM,
    CorruptLogMetaError,
    ElasticLogMeta,
    ElasticPartitionMeta,
)
from automq_py.log.log_loader import LogCreatedElsewhereError, meta_stream_key
from automq_py.log.meta_stream import MetaStream
from automq_py.log.meta_stream_record import LeaderEpochCheckpoint
from protocol.record_batch import parse_header
from storage.errors import StreamFencedError
from storage.metadata.model import StreamState
from storage.s3_storage import S3Storage
from storage.stream import StreamClient
from tests.automq_py.log.conftest import (
    NAMESPACE,
    TOPIC_ID,
    StorageFactory,
    append_batches,
    batches_of,
    kafka_batch,
    open_log,
    start_storage,
)

T0 = 1712451146370


async def read_everything(log: ElasticLog, start: int = 0, max_bytes: int = 1000) -> list[bytes]:
    out: list[bytes] = []
    pos = start
    while pos < log.log_end_offset:
        views = await log.read(pos, max_bytes)
        assert views, f"no progress at {pos}"
        for batch in batches_of(views):
            out.append(batch)
            pos = parse_header(batch).last_offset + 1
    return out


async def test_a_new_partition_writes_what_automq_writes(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    log = await open_log(storage, clock=lambda: 1712450996411)
    raw = storage.metadata.get_kv(meta_stream_key(NAMESPACE, TOPIC_ID, 0))
    assert raw is not None and len(raw) == 8
    assert struct.unpack(">q", raw)[0] == log.meta_stream_id
    # the MetaStream's records, in AutoMQ's order (seed 000)
    records = []
    stream = log.meta_stream.stream
    result = await stream.fetch(0, -1, 1 << 20)
    for batch in result.batches:
        records.append(keys.decode(batch.payload))
    assert [r.key for r in records] == [keys.PARTITION, keys.LOG, keys.LEADER_EPOCH_CHECKPOINT]
    assert records[0].value == b'{"s":0,"c":0,"r":0,"cs":false}'
    log_id, tim_id = log.stream_map["log"], log.stream_map["tim"]
    assert records[1].value == (
        b'{"streamMap":{"log":%d,"tim":%d,"txn":-1},"segmentMetas":[{"bo":0,"ct":1712450996411,'
        b'"lmt":0,"s":"","lsz":0,"ls":{"s":0,"e":-1},"ts":{"s":0,"e":-1},"txs":{"s":0,"e":-1},'
        b'"fbt":0,"tle":{"t":-1,"o":0}}]}' % (log_id, tim_id)
    )
    assert str(LeaderEpochCheckpoint.decode(records[2].value)) == (
        "ElasticLeaderEpochCheckpointMeta{version=0, entries=[]}"
    )
    await log.assign_leader_epoch(0, 0)
    assert log.leader_epoch_cache.entries == ((0, 0),)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    assert await log.read(0, 1000) == []
    assert await log.offset_for_timestamp(0) is None
    assert await log.max_timestamp_offset() == (-1, -1)
    await log.close()


async def test_a_log_created_twice_at_once_keeps_the_first(make_storage: StorageFactory) -> None:
    """Two opens creating the same new partition's log at once (its leadership moved while
    the first broker was creating it): the second is refused, and the KV keeps naming the
    first one's MetaStream (a second log named instead would orphan the first's records)."""
    storage = await make_storage()
    first, second = await asyncio.gather(
        open_log(storage, epoch=0), open_log(storage, epoch=1), return_exceptions=True
    )
    assert isinstance(first, ElasticLog)
    assert isinstance(second, LogCreatedElsewhereError)
    raw = storage.metadata.get_kv(meta_stream_key(NAMESPACE, TOPIC_ID, 0))
    assert raw is not None and struct.unpack(">q", raw)[0] == first.meta_stream_id


async def test_tails_are_uploaded_first_only_when_their_bytes_outweigh_their_streams(
    make_storage: StorageFactory,
) -> None:
    """Before a hand-over the partitions' tails are uploaded while still served, unless they
    average under TAILS_FIRST_MIN_AVERAGE bytes a stream: then the close uploads them."""
    storage = await make_storage()
    small = [await open_log(storage, partition=p) for p in range(3)]
    for log in small:
        await append_batches(log, [1000], size=100)
    puts = storage.store.stats.snapshot()["put"]
    assert await ElasticLog.upload_tails(small) is False
    assert storage.store.stats.snapshot()["put"] == puts
    assert storage.cache.unuploaded([log.meta_stream_id for log in small])[0] > 0

    large = await open_log(storage, partition=3)
    await append_batches(large, list(range(1000, 1040)), size=2000)
    assert await ElasticLog.upload_tails([large]) is True
    streams = [large.meta_stream_id, *large.stream_map.values()]
    assert storage.cache.unuploaded([s for s in streams if s >= 0]) == (0, 0)


async def test_append_and_read_across_segment_rolls(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    log = await open_log(storage, segment_bytes=1000, index_interval_bytes=300)
    batches = await append_batches(log, [T0 + i for i in range(40)], count=3, size=100)
    assert log.log_end_offset == 120
    segments = log.segments
    assert len(segments) == 7  # six batches of 161 bytes fit in 1000
    assert [s.base_offset for s in segments] == [18 * i for i in range(7)]
    for prev, nxt in itertools.pairwise(segments):
        assert prev.log.end == nxt.log.start == nxt.base_offset
        assert prev.time.end == nxt.time.start and prev.time.end % 12 == 0
        assert prev.log_size == 6 * 161 and prev.first_batch_timestamp == T0 + prev.base_offset // 3
        # a sealed segment's last index entry is its largest timestamp
        assert prev.time_index_last_entry.timestamp == T0 + nxt.base_offset // 3 - 1
    assert segments[-1].log.end == -1 and segments[-1].log_size == 4 * 161
    # the LOG record describes the same segments
    logged = ElasticLogMeta.decode(log.meta_stream.get(keys.LOG) or b"")
    assert [s.base_offset for s in logged.segment_metas] == [s.base_offset for s in segments]
    # read at every offset: the first batch holds it
    for offset in range(120):
        views = await log.read(offset, 1)
        assert batches_of(views) == [batches[offset // 3]]
    assert await read_everything(log, max_bytes=500) == batches
    # max_bytes is honoured across segments, whole batches only
    views = await log.read(10, 161 * 10)
    assert batches_of(views) == batches[3:13]
    views = await log.read(10, 161 * 10, max_offset=21)
    assert batches_of(views) == batches[3:7]
    assert await log.read(120, 1000) == []
    with pytest.raises(LogOffsetOutOfRangeError):
        await log.read(121, 1000)
    with pytest.raises(ValueError, match="log end offset"):
        await log.append(
            batches[0], base_offset=0, record_count=3, max_timestamp=0, first_timestamp=0
        )
    await log.close()


async def test_segment_ms_rolls_on_record_time(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    log = await open_log(storage, segment_ms=1000)
    await append_batches(log, [T0, T0 + 500, T0 + 1001, T0 + 1500, T0 + 2002])
    assert [s.base_offset for s in log.segments] == [0, 6, 12]
    assert [s.first_batch_timestamp for s in log.segments] == [T0, T0 + 1001, T0 + 2002]
    await log.close()


async def test_timestamps_and_max_timestamp(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    log = await open_log(storage, segment_bytes=700, index_interval_bytes=0)
    timestamps = [T0 + t for t in (5, 3, 9, 9, 20, 1, 15, 30, 2, 30)]
    await append_batches(log, timestamps)
    assert len(log.segments) > 2
    assert await log.offset_for_timestamp(T0) == (0, T0 + 5)
    assert await log.offset_for_timestamp(T0 + 6) == (6, T0 + 9)
    assert await log.offset_for_timestamp(T0 + 10) == (12, T0 + 20)
    assert await log.offset_for_timestamp(T0 + 21) == (21, T0 + 30)
    assert await log.offset_for_timestamp(T0 + 31) is None
    assert await log.max_timestamp_offset() == (21, T0 + 30)
    await log.close()


async def test_reopen_after_close_gives_the_same_log(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    log = await open_log(storage, segment_bytes=1000, index_interval_bytes=200)
    await log.assign_leader_epoch(0, 0)
    batches = await append_batches(log, [T0 + i * 10 for i in range(20)])
    found = await log.offset_for_timestamp(T0 + 95)
    await log.close()
    segments = log.segments  # close indexed the active segment's largest timestamp
    assert segments[-1].time_index_last_entry.timestamp == T0 + 190
    partition = ElasticPartitionMeta.decode(log.meta_stream.get(keys.PARTITION) or b"")
    assert partition.cleaned_shutdown and partition.recover_offset == 60

    reopened = await open_log(storage, epoch=1, segment_bytes=1000, index_interval_bytes=200)
    assert reopened.log_end_offset == 60 and reopened.segments == segments
    assert reopened.leader_epoch_cache.entries == ((0, 0),)
    assert await read_everything(reopened) == batches
    assert await reopened.offset_for_timestamp(T0 + 95) == found == (30, T0 + 100)
    more = await append_batches(reopened, [T0 + 1000 + i for i in range(10)])
    assert await read_everything(reopened) == batches + more
    await reopened.close()


async def test_reopen_after_a_crash_recovers_acknowledged_batches(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    log = await open_log(storage, segment_bytes=1000, index_interval_bytes=200)
    await log.assign_leader_epoch(0, 0)
    batches = await append_batches(log, [T0 + i * 10 for i in range(20)])
    expected_segments = [
        (s.base_offset, s.log, s.log_size, s.first_batch_timestamp) for s in log.segments
    ]
    expected_times = [await log.offset_for_timestamp(T0 + t) for t in range(0, 200, 7)]
    await storage.abort()  # no close(): the last batches exist only in the WAL

    storage = await start_storage(tmp_path)
    try:
        reopened = await open_log(storage, epoch=1, segment_bytes=1000, index_interval_bytes=200)
        assert reopened.log_end_offset == 60
        assert [
            (s.base_offset, s.log, s.log_size, s.first_batch_timestamp) for s in reopened.segments
        ] == expected_segments
        storage.drop_cache()
        assert await read_everything(reopened) == batches
        assert [await reopened.offset_for_timestamp(T0 + t) for t in range(0, 200, 7)] == (
            expected_times
        )
        assert await reopened.max_timestamp_offset() == (57, T0 + 190)
        await append_batches(reopened, [T0 + 500])
        assert reopened.log_end_offset == 63
        await reopened.close()
    finally:
        await storage.close()


async def closed_log(storage: S3Storage, **options: Any) -> tuple[ElasticLog, list[int]]:
    """A log holding a batch, closed; its streams' ids, the MetaStream's first."""
    log = await open_log(storage, **options)
    await append_batches(log, [T0])
    await log.close()
    return log, [log.meta_stream_id, *(sid for sid in log.stream_map.values() if sid >= 0)]


def assert_closed(storage: S3Storage, ids: list[int], epoch: int) -> None:
    """The streams are closed at ``epoch`` and no longer open here."""
    for sid in ids:
        meta = storage.metadata.stream(sid)
        assert meta is not None and meta.state is StreamState.CLOSED and meta.epoch == epoch
        assert not storage.is_open_here(sid)


async def test_a_log_that_fails_to_open_leaves_no_stream_open(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage()
    log, ids = await closed_log(storage)
    # LOG names a segment whose streams the stream map lacks: the open fails after it has
    # opened the MetaStream and the data streams
    client = StreamClient(storage)
    meta_stream = MetaStream(await client.open(log.meta_stream_id, 1))
    await meta_stream.replay()
    decoded = ElasticLogMeta.decode(meta_stream.get(keys.LOG) or b"")
    bad = dataclasses.replace(decoded.segment_metas[0], stream_suffix=CLEANED_SUFFIX)
    await meta_stream.put(keys.LOG, ElasticLogMeta(decoded.stream_map, (bad,)).encode())
    await meta_stream.close()

    with pytest.raises(CorruptLogMetaError, match=r"needs streams 'log\.cleaned'"):
        await open_log(storage, epoch=2)
    assert_closed(storage, ids, 2)  # the next owner opens them as after a handover


async def test_a_cancelled_open_leaves_no_stream_open(
    make_storage: StorageFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = await make_storage()
    _, ids = await closed_log(storage)
    replaying = asyncio.Event()

    async def slow_replay(*args: Any) -> None:  # a replay from object storage that lasts
        replaying.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(log_loader, "_load_producer_state", slow_replay)
    opening = asyncio.create_task(open_log(storage, epoch=1))
    await replaying.wait()
    assert all(storage.is_open_here(sid) for sid in ids)
    opening.cancel()  # as a stopping broker cancels the opens that outlast it
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert_closed(storage, ids, 1)


async def test_a_deleted_topics_log_is_destroyed_from_an_older_epoch(
    make_storage: StorageFactory,
) -> None:
    # a cluster's partition is opened at its leader epoch, which moves past the node epochs of
    # the brokers that delete its topic's logs
    storage = await make_storage()
    _, ids = await closed_log(storage, epoch=5)
    key = meta_stream_key(NAMESPACE, TOPIC_ID, 0)
    assert await log_loader.destroy_log(StreamClient(storage), storage.metadata, key, 1) == 3
    assert storage.metadata.get_kv(key) is None
    assert all(storage.metadata.stream(sid) is None for sid in ids)


async def test_a_log_another_node_closed_is_destroyed(
    make_storage: StorageFactory, tmp_path: Path
) -> None:
    storage = await make_storage()
    other = await S3Storage.start(
        dataclasses.replace(
            storage.config, node_id=storage.config.node_id + 1, wal_path=str(tmp_path / "other")
        ),
        store=storage.store,
        metadata=storage.metadata,
    )
    try:  # the other node led the partition at epoch 1, and closed it as its topic went
        _, ids = await closed_log(other, epoch=1)
    finally:
        await other.close()
    key = meta_stream_key(NAMESPACE, TOPIC_ID, 0)
    assert await log_loader.destroy_log(StreamClient(storage), storage.metadata, key, 1) == 3
    assert all(storage.metadata.stream(sid) is None for sid in ids)


async def test_truncate_start_drops_whole_segments(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    log = await open_log(storage, segment_bytes=700)
    await log.assign_leader_epoch(0, 0)
    await log.assign_leader_epoch(1, 9)
    batches = await append_batches(log, [T0 + i for i in range(12)])
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 12, 24]
    await log.truncate_start(13)
    assert log.log_start_offset == 13
    assert [s.base_offset for s in log.segments] == [12, 24]
    assert log.leader_epoch_cache.entries == ((1, 13),)
    log_stream = log.meta_stream.stream.storage.metadata.stream(log.stream_map["log"])
    assert log_stream is not None and log_stream.start_offset == 12
    with pytest.raises(LogOffsetOutOfRangeError):
        await log.read(12, 1000)
    views = await log.read(13, 1)
    assert bytes(views[0]) == batches[4]  # the batch [12, 15) holds 13
    assert await log.offset_for_timestamp(0) == (13, T0 + 4)
    with pytest.raises(LogOffsetOutOfRangeError):
        await log.truncate_start(37)
    await log.truncate_start(36)  # the active segment stays, empty to read
    assert [s.base_offset for s in log.segments] == [24]
    assert await log.read(36, 1000) == []
    await log.close()
    reopened = await open_log(storage, epoch=1, segment_bytes=700)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (36, 36)
    await reopened.close()


async def test_a_higher_epoch_fences_the_first_owner(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    first = await open_log(storage, epoch=0)
    await append_batches(first, [T0])
    second = await open_log(storage, epoch=1)
    assert second.log_end_offset == 3
    with pytest.raises(StreamFencedError):
        await append_batches(first, [T0 + 1])
    await append_batches(second, [T0 + 2])
    assert second.log_end_offset == 6
    await second.close()


async def test_partitions_have_their_own_meta_streams(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    a = await open_log(storage, partition=0)
    b = await open_log(storage, partition=1)
    assert a.meta_stream_id != b.meta_stream_id
    await append_batches(a, [T0])
    assert b.log_end_offset == 0
    await a.close()
    await b.close()


async def test_a_meta_stream_without_log_is_initialised(make_storage: StorageFactory) -> None:
    # a crash between storing the KV and writing LOG leaves an empty MetaStream
    storage = await make_storage()
    client = StreamClient(storage)
    stream = await client.create_and_open()
    key = meta_stream_key(NAMESPACE, TOPIC_ID, 0)
    await storage.metadata.put_kv(key, struct.pack(">q", stream.stream_id))
    log = await open_log(storage)
    assert log.meta_stream_id == stream.stream_id
    await append_batches(log, [T0])
    await log.close()
    replayed = await MetaStream(await client.open(stream.stream_id, 0)).replay()
    # the test batches carry a producer id, so producer state is saved too
    assert set(replayed) == {
        keys.PARTITION,
        keys.LOG,
        keys.LEADER_EPOCH_CHECKPOINT,
        keys.PRODUCER_SNAPSHOTS,
    }


async def test_kafka_batch_helper_builds_valid_batches() -> None:
    from protocol.record_batch import crc_is_valid

    data = kafka_batch(30, 3, T0 + 7)
    h = parse_header(data)
    assert (h.base_offset, h.records_count, h.max_timestamp) == (30, 3, T0 + 7)
    assert crc_is_valid(data, h)


def batch_without_producer(base_offset: int, count: int, timestamp: int) -> bytes:
    """A batch from a producer that is not idempotent: producer id, epoch and sequence -1."""
    batch = bytearray(kafka_batch(base_offset, count, timestamp))
    struct.pack_into(">qhi", batch, 43, -1, -1, -1)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


async def test_a_clean_reopen_without_producer_state_reads_no_batches(
    make_storage: StorageFactory,
) -> None:
    # a clean close writes PRODUCER_SNAPSHOTS whenever it has producer state: without one there
    # is nothing to rebuild, and the first fetch after a restart must not wait for the whole
    # active segment to be read back from object storage
    storage = await make_storage()
    log = await open_log(storage)
    batches = []
    for i in range(20):
        base = log.log_end_offset
        batch = batch_without_producer(base, 3, T0 + i)
        await log.append(
            batch, base_offset=base, record_count=3, max_timestamp=T0 + i, first_timestamp=T0 + i
        )
        batches.append(batch)
    log_stream = log.stream_map[LOG_STREAM]
    await log.close()
    assert log.meta_stream.get(keys.PRODUCER_SNAPSHOTS) is None
    storage.drop_cache()
    read_streams = []
    real_read = storage.read

    async def spy(stream_id: int, start: int, end: int, max_bytes: int) -> list[Any]:
        read_streams.append(stream_id)
        return await real_read(stream_id, start, end, max_bytes)

    storage.read = spy  # type: ignore[method-assign]
    reopened = await open_log(storage, epoch=1)
    assert log_stream not in read_streams
    assert len(reopened.producer_state) == 0
    assert await read_everything(reopened) == batches
    await reopened.close()
