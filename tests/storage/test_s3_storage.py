"""S3Storage and the Stream API over a real file WAL, SQLite metadata and a local object store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from storage.config import S3StreamConfig
from storage.errors import OffsetOutOfRangeError, StreamClosedError, StreamFencedError
from storage.metadata.manager import MetadataManager
from storage.metadata.model import StreamState
from storage.s3_storage import COPY_AHEAD_MAX, S3Storage
from storage.stream import S3Stream, StreamClient
from tests.storage.conftest import StorageFactory, storage_properties
from tests.storage.crash_writer import payload_for

MB = 1_000_000


async def fill(stream: S3Stream, n: int, size: int = 1000, count: int = 3) -> list[bytes]:
    payloads = []
    for _ in range(n):
        p = payload_for(stream.stream_id, stream.next_offset, size)
        await stream.append(p, count)
        payloads.append(p)
    return payloads


async def read_all(stream: S3Stream, start: int = 0, max_bytes: int = 1 << 20) -> list[bytes]:
    out: list[bytes] = []
    pos = start
    while pos < stream.confirmed_offset:
        result = await stream.fetch(pos, -1, max_bytes)
        assert result.batches, f"no progress at {pos}"
        assert result.batches[0].base_offset <= pos < result.batches[0].last_offset
        for b in result.batches:
            assert b.base_offset == pos
            out.append(bytes(b.payload))
            pos = b.last_offset
    return out


async def test_append_fetch_hot_then_cold(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    a, b = await client.create_and_open(), await client.create_and_open()
    pa, pb = await fill(a, 50), await fill(b, 20, size=300)
    assert await read_all(a) == pa and await read_all(b) == pb
    await storage.force_upload()
    storage.drop_cache()
    puts_before = storage.store.stats.snapshot()["get"]
    assert await read_all(a) == pa and await read_all(b) == pb
    assert storage.store.stats.snapshot()["get"] > puts_before  # really read from objects
    # more appends: the read crosses from objects into the cache
    pa += await fill(a, 10)
    assert await read_all(a) == pa
    assert await read_all(a, start=148 - 148 % 3) == pa[49:]


async def test_a_failed_close_is_tried_again_and_one_in_progress_is_not_joined(
    make_storage: StorageFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = await make_storage()
    stream = await StreamClient(storage).create_and_open()
    await fill(stream, 3)
    real = storage.upload_streams
    calls: list[list[int]] = []
    release = asyncio.Event()

    async def upload(ids: list[int]) -> None:
        calls.append(ids)
        if len(calls) == 1:
            raise OSError("object store unreachable")
        await release.wait()
        await real(ids)

    monkeypatch.setattr(storage, "upload_streams", upload)
    with pytest.raises(OSError):
        await stream.close()
    assert storage.is_open_here(stream.stream_id)  # not closed: the next close tries again
    closing = asyncio.create_task(stream.close())
    await asyncio.sleep(0.01)
    await stream.close()  # while that one is in progress: nothing of its own
    assert len(calls) == 2
    release.set()
    await closing
    meta = storage.metadata.stream(stream.stream_id)
    assert meta is not None and meta.state is StreamState.CLOSED
    assert not storage.is_open_here(stream.stream_id)
    await stream.close()  # closed: nothing to do
    assert len(calls) == 2


async def test_fetch_bounds_and_max_bytes(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    await fill(s, 10, size=1000, count=2)
    one = await s.fetch(0, -1, 1)
    assert len(one.batches) == 1  # at least one batch, even over max_bytes
    assert len((await s.fetch(0, -1, 2500)).batches) == 3
    assert [b.base_offset for b in (await s.fetch(3, 7)).batches] == [2, 4, 6]
    assert (await s.fetch(20)).batches == []
    with pytest.raises(OffsetOutOfRangeError):
        await s.fetch(21)
    await s.trim(6)
    with pytest.raises(OffsetOutOfRangeError):
        await s.fetch(4)
    assert (await s.fetch(6)).batches[0].base_offset == 6


async def test_large_stream_becomes_stream_object(make_storage: StorageFactory) -> None:
    storage = await make_storage(**{"s3.stream.object.split.size": 100_000})
    client = StreamClient(storage)
    big, small = await client.create_and_open(), await client.create_and_open()
    await fill(big, 200, size=1000)
    await fill(small, 5)
    await storage.force_upload()
    meta = storage.metadata.stream(big.stream_id)
    assert meta is not None and len(meta.stream_objects) == 1
    assert storage.store.stats.snapshot()["put"] == 2  # one SO + one SSO


async def test_clean_restart_keeps_data_and_bumps_the_epoch(
    tmp_path: Path, make_storage: StorageFactory
) -> None:
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    payloads = await fill(s, 30)
    await storage.close()
    storage = await make_storage()
    reopened = await StreamClient(storage).open(s.stream_id, s.epoch + 1)
    assert reopened.next_offset == 90
    assert await read_all(reopened) == payloads
    with pytest.raises(StreamFencedError):
        await StreamClient(storage).open(s.stream_id, s.epoch)


async def test_stale_epoch_writer_is_fenced(tmp_path: Path) -> None:
    metadata = await MetadataManager.open(f"sqlite:///{tmp_path}/metadata.db")
    nodes = []
    for node in (1, 2):
        props = storage_properties(tmp_path / f"n{node}", f"file://{tmp_path}/objects")
        props["node.id"] = str(node)
        nodes.append(
            await S3Storage.start(S3StreamConfig.from_properties(props), metadata=metadata)
        )
    try:
        old = await StreamClient(nodes[0]).create_and_open()
        kept = await fill(old, 5)
        await nodes[0].force_upload()
        unuploaded = await fill(old, 2)
        new = await StreamClient(nodes[1]).open(old.stream_id, old.epoch + 1)
        with pytest.raises(StreamFencedError):
            await old.append(b"late", 1)
        with pytest.raises(StreamClosedError):
            await old.append(b"later", 1)
        # the old owner's upload of its last records is refused; the new owner goes on
        await nodes[0].force_upload()
        assert new.next_offset == 15
        more = await fill(new, 3)
        await nodes[1].force_upload()
        nodes[1].drop_cache()
        assert await read_all(new) == kept + more
        assert unuploaded  # acknowledged before the fence, then lost with the old owner
    finally:
        for n in nodes:
            await n.close()
        await metadata.close()


async def test_restart_after_unclean_stop_replays_the_wal(
    tmp_path: Path, make_storage: StorageFactory
) -> None:
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    payloads = await fill(s, 40)
    await storage.abort()  # as after a crash, the data exists only in the WAL
    storage = await make_storage()
    meta = storage.metadata.stream(s.stream_id)
    assert meta is not None and meta.end_offset == 120  # uploaded during recovery
    reopened = await StreamClient(storage).open(s.stream_id, s.epoch + 1)
    storage.drop_cache()
    assert await read_all(reopened) == payloads


async def test_corrupt_wal_tail_is_cut_and_the_rest_recovers(
    tmp_path: Path, make_storage: StorageFactory
) -> None:
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    payloads = await fill(s, 10)
    await storage.abort()
    path = tmp_path / "wal" / "wal.log"
    data = path.read_bytes()
    # flip a byte inside the last record's body: that record fails its CRC
    pos = data.rindex(payloads[-1]) + 10
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(bytes([data[pos] ^ 0xFF]))
    storage = await make_storage()
    reopened = await StreamClient(storage).open(s.stream_id, 1)
    assert reopened.next_offset == 27  # the last append of 3 offsets was cut
    assert await read_all(reopened) == payloads[:9]


async def _put_times(storage: S3Storage) -> list[float]:
    """Record when each object of ``storage`` starts to be written."""
    times: list[float] = []
    real_put = storage.uploader._put

    async def put(*args: Any) -> None:
        times.append(time.monotonic())
        await real_put(*args)

    storage.uploader._put = put  # type: ignore[method-assign]
    return times


async def _fill_slowly(streams: list[S3Stream], rounds: int, seconds: float) -> None:
    for _ in range(rounds):
        for s in streams:
            await s.append(payload_for(s.stream_id, s.next_offset, 64 << 10), 1)
        await asyncio.sleep(seconds / rounds)


async def test_uploads_are_paced_at_the_rate_their_block_filled(
    make_storage: StorageFactory,
) -> None:
    # four streams of 256 KiB each become four Stream Objects; the block fills in about 1 s,
    # so its four PUTs are spread over about 3/4 s (AutoMQ's pacing), not sent in one burst
    storage = await make_storage(
        **{"s3.wal.upload.threshold": 1 << 20, "s3.stream.object.split.size": 150_000}
    )
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(4)]
    times = await _put_times(storage)
    await _fill_slowly(streams, 4, 1.0)
    async with asyncio.timeout(30):
        while storage.uploads == 0:
            await asyncio.sleep(0.05)
    assert len(times) == 4
    assert times[-1] - times[0] >= 0.55  # 3/4 of the block's ~0.75 s fill time, at least

    # a forced upload is not paced: a close, or a caller that needs the data in objects now
    times.clear()
    await _fill_slowly(streams, 3, 1.0)  # under the threshold: nothing uploads by itself
    assert times == []
    await storage.force_upload()
    assert len(times) == 4
    assert times[-1] - times[0] < 0.4


async def _slow_block_uploading(storage: S3Storage, stream: S3Stream) -> float:
    """Fill one block of ~3 MiB over ~3 s (one object, which the upload worker writes paced
    at ~1 MB/s, ~3 s); returns once its upload started, with the time it was sealed."""
    for _ in range(12):
        await stream.append(payload_for(stream.stream_id, stream.next_offset, 256 << 10), 1)
        await asyncio.sleep(0.25)
    async with asyncio.timeout(10):
        while not storage.uploader._paced_puts:
            await asyncio.sleep(0.01)
    return time.monotonic()


async def test_a_paced_upload_speeds_up_once_the_appends_leave_it_behind(
    make_storage: StorageFactory,
) -> None:
    """A block of one large object, paced at the slow rate its data came at, goes on at full
    speed when a burst of appends fills half the LogCache: paced to the end, it would hold the
    blocks after it, and then the appends, once the cache is full."""
    storage = await make_storage(
        **{"s3.wal.upload.threshold": 3 << 20, "s3.wal.cache.size": 16 << 20}
    )
    stream = await StreamClient(storage).create_and_open()
    sealed = await _slow_block_uploading(storage, stream)
    for _ in range(24):  # 6 MiB at once: half the cache waits for upload
        await stream.append(payload_for(stream.stream_id, stream.next_offset, 256 << 10), 1)
    async with asyncio.timeout(10):
        while storage.uploads == 0:
            await asyncio.sleep(0.01)
    # paced to the end it takes ~3 s; lifted, the rest goes in ~0.1 s
    assert time.monotonic() - sealed < 1.5


async def test_a_forced_upload_lifts_the_pacing_of_the_one_in_progress(
    make_storage: StorageFactory,
) -> None:
    """``force_upload`` (a close, a partition handed over) does not wait for a paced upload
    already in progress to go at its pace."""
    storage = await make_storage(**{"s3.wal.upload.threshold": 3 << 20})
    stream = await StreamClient(storage).create_and_open()
    sealed = await _slow_block_uploading(storage, stream)
    await storage.force_upload()
    assert storage.uploads >= 1
    assert time.monotonic() - sealed < 1.5


async def test_a_burst_does_not_set_the_pace_for_good(make_storage: StorageFactory) -> None:
    """A block is paced at its own fill rate: right after a burst the pace is the rate data
    arrives at again (AutoMQ keeps its fastest ever; falling behind lifts the pacing)."""
    storage = await make_storage()
    blocks = [
        SimpleNamespace(block_id=i, size=100 * MB, first_put_at=0.0, sealed_at=seconds)
        for i, seconds in enumerate((0.5, 5.0, 50.0, 0.05))
    ]
    rates = [storage.uploader._upload_rate(b) for b in blocks]  # type: ignore[arg-type]
    assert rates[0] == pytest.approx(200 * MB)  # the burst
    assert rates[1] == pytest.approx(20 * MB)  # the block after it: its own rate
    assert rates[2] == pytest.approx(20 * MB)  # the rate of its last 5 s at most
    assert rates[3] is None  # a block sealed within 0.1 s of its first record: full speed


async def test_a_closed_stream_uploads_its_own_tail_only(
    tmp_path: Path, make_storage: StorageFactory
) -> None:
    """Closing a stream uploads what the cache holds of it, not the rest of the cache; the
    others upload later without it, and a crash before then loses and doubles nothing."""
    storage = await make_storage()
    client = StreamClient(storage)
    moving, staying = await client.create_and_open(), await client.create_and_open()
    pm, ps = await fill(moving, 20), await fill(staying, 30)
    storage.cache.seal()  # one block sealed, one active: the stream is taken out of both
    pm += await fill(moving, 5)
    ps += await fill(staying, 5)
    await moving.close()
    meta = storage.metadata
    assert meta.stream(moving.stream_id).end_offset == 75  # type: ignore[union-attr]
    assert meta.stream(staying.stream_id).end_offset == 0  # type: ignore[union-attr]
    blocks = [*storage.cache.sealed_blocks(), storage.cache.active]
    assert all(moving.stream_id not in b.records for b in blocks)
    assert storage.cache.unuploaded_size == sum(b.size for b in blocks) > sum(map(len, ps))
    await storage.abort()  # the staying stream's records are in the WAL only
    storage = await make_storage()
    assert storage.metadata.stream(staying.stream_id).end_offset == 105  # type: ignore[union-attr]
    reopened = [await StreamClient(storage).open(s.stream_id, 1) for s in (moving, staying)]
    storage.drop_cache()
    assert await read_all(reopened[0]) == pm
    assert await read_all(reopened[1]) == ps


async def test_a_block_being_uploaded_gives_up_a_stream_closed_meanwhile(
    make_storage: StorageFactory,
) -> None:
    """A block whose objects were built with a stream that then closed on its own builds them
    again without it: each offset committed once."""
    storage = await make_storage()
    client = StreamClient(storage)
    moving, staying = await client.create_and_open(), await client.create_and_open()
    pm, ps = await fill(moving, 20), await fill(staying, 20)
    real_stage = storage.uploader._stage
    staged = asyncio.Event()
    go_on = asyncio.Event()

    async def slow_stage(block):  # type: ignore[no-untyped-def]
        result = await real_stage(block)
        if block.block_id >= 0:
            staged.set()
            await go_on.wait()
        return result

    storage.uploader._stage = slow_stage  # type: ignore[method-assign]
    upload = asyncio.create_task(storage.force_upload())
    await staged.wait()  # the block's objects are written, not committed
    await moving.close()
    go_on.set()
    await upload
    assert storage.metadata.stream(moving.stream_id).end_offset == 60  # type: ignore[union-attr]
    assert storage.metadata.stream(staying.stream_id).end_offset == 60  # type: ignore[union-attr]
    storage.drop_cache()
    reopened = await StreamClient(storage).open(moving.stream_id, 1)
    assert await read_all(reopened) == pm
    assert await read_all(staying) == ps


async def test_a_stream_closed_while_its_block_is_paced_out_is_left_out_quietly(
    make_storage: StorageFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A block's objects go out one at a time at the block's pace; a stream that leaves the
    block between two of them (a topic deleted, a partition handed over) has the block staged
    again without it, not an upload failure and its retry."""
    storage = await make_storage(
        **{"s3.wal.upload.threshold": 3 << 20, "s3.stream.object.split.size": 1 << 20}
    )
    client = StreamClient(storage)
    first, second = await client.create_and_open(), await client.create_and_open()
    written: dict[int, list[bytes]] = {first.stream_id: [], second.stream_id: []}
    for i in range(12):  # ~3 MiB over ~3 s: a Stream Object each, paced at ~1 MB/s
        stream = (first, second)[i % 2]
        payload = payload_for(stream.stream_id, stream.next_offset, 256 << 10)
        await stream.append(payload, 1)
        written[stream.stream_id].append(payload)
        await asyncio.sleep(0.25)
    async with asyncio.timeout(10):
        while not storage.uploader._paced_puts:  # the first object is on its way
            await asyncio.sleep(0.01)
    await second.close()  # its own tail uploaded at once; the block goes on without it
    async with asyncio.timeout(20):
        while storage.uploads == 0:
            await asyncio.sleep(0.05)
    assert not [r for r in caplog.records if "failed, retrying" in r.getMessage()]
    for stream in (first, second):
        meta = storage.metadata.stream(stream.stream_id)
        assert meta is not None and meta.end_offset == 6
    storage.drop_cache()
    reopened = await StreamClient(storage).open(second.stream_id, 1)
    assert await read_all(first) == written[first.stream_id]
    assert await read_all(reopened) == written[second.stream_id]


async def test_a_streams_own_upload_is_never_paced(make_storage: StorageFactory) -> None:
    """A block of streams taken out of the cache (a hand-over) uploads at full speed, however
    long taking them out took."""
    storage = await make_storage()
    extracted = SimpleNamespace(block_id=-1, size=100 * MB, first_put_at=0.0, sealed_at=5.0)
    assert storage.uploader._upload_rate(extracted) is None  # type: ignore[arg-type]


async def test_payloads_read_from_requests_are_copied_while_their_write_is_in_flight(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage()
    stream = await StreamClient(storage).create_and_open()
    payloads = [payload_for(stream.stream_id, 3 * i, 1000) for i in range(4)]
    # views of a request's memory, as a Produce request's batches are
    durable = [stream.append_now(memoryview(bytearray(p)), 3)[1] for p in payloads]
    storage.commit_now()  # a connection about to wait: the commit, then the copies
    state = storage._streams[stream.stream_id]
    assert sorted(state.copied) == [0, 3, 6, 9]
    assert all(type(b.payload) is bytes for b in state.copied.values())
    await asyncio.gather(*durable)
    assert not state.copied  # each one went into the cache as its append became durable
    assert await read_all(stream) == payloads
    # with no commit_now, as many wait to be copied as COPY_AHEAD_MAX; the rest are copied
    # as they become durable
    more = [payload_for(stream.stream_id, 12 + i, 100) for i in range(300)]
    await asyncio.gather(*(stream.append_now(memoryview(bytearray(p)), 1)[1] for p in more))
    assert len(storage._uncopied) == COPY_AHEAD_MAX
    storage.commit_now()  # (all durable by now: nothing to copy)
    assert not storage._uncopied and not state.copied
    assert await read_all(stream) == payloads + more


async def test_a_wal_filled_with_dropped_streams_records_is_freed_without_waiting(
    make_storage: StorageFactory,
) -> None:
    """Records of a stream dropped from the cache (a deleted topic's) keep their room in the
    WAL ring until a block after them is committed. When they fill it while the active block
    stays small, the block is sealed and uploaded then (as AutoMQ forces an upload when its WAL
    is over capacity), not after ``s3.wal.upload.interval.ms``: the appends waiting for room go
    on within moments."""
    storage = await make_storage(
        s3_wal_capacity=16 << 20, s3_wal_upload_threshold=8 << 20, s3_wal_upload_interval_ms=60_000
    )
    client = StreamClient(storage)
    live = await client.create_and_open()
    for _ in range(2):  # each under the threshold, so no block is sealed
        dead = await client.create_and_open()
        await fill(dead, 6, size=1 << 20, count=1)
        storage.drop_stream(dead.stream_id)
    assert storage.wal.free_space < 5 << 20 and storage.cache.active.size == 0
    started = time.monotonic()
    written = await asyncio.wait_for(fill(live, 6, size=1 << 20, count=1), 30)
    # the live stream's records among dropped ones: the block holding them is uploaded early
    dead = await client.create_and_open()
    for _ in range(5):
        await fill(dead, 1, size=1 << 20, count=1)
        written += await fill(live, 1, size=200_000, count=1)
    storage.drop_stream(dead.stream_id)
    written += await asyncio.wait_for(fill(live, 12, size=1 << 19, count=1), 30)
    assert time.monotonic() - started < 20  # (the upload interval is 60 s)
    assert await read_all(live) == written
