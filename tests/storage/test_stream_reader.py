"""The cold read path: read-ahead rule, block selection, merged GETs, block parsing and the block
cache (pure), then StreamReaders over a real S3Storage with a local object store."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import object_format
from storage.block_cache import BlockCache, SharedBuffer
from storage.object_format import CorruptObjectError, DataBlockIndex
from storage.object_reader import merge_runs
from storage.object_writer import ObjectWriter
from storage.operator.base import ObjectNotFoundError
from storage.stream import StreamClient
from storage.stream_reader import MIN_READAHEAD, LocatedBlock, Readahead, select_blocks
from storage.stream_record_batch import StreamRecordBatch
from tests.storage.conftest import StorageFactory
from tests.storage.test_s3_storage import fill, read_all

MiB = 1 << 20

# -- Readahead (pure) ----------------------------------------------------------------------------


def test_first_read_plans_the_smallest_read_ahead_from_its_end() -> None:
    ra = Readahead()
    assert ra.plan(100, ahead=0, cap=64 * MiB) == (100, MIN_READAHEAD)
    assert ra.size == 2 * MIN_READAHEAD  # the next one is twice as large


def test_no_read_ahead_while_enough_is_ahead() -> None:
    ra = Readahead()
    ra.plan(100, ahead=0, cap=64 * MiB)
    ra.advanced(300)
    # the next read-ahead is 2 * MIN: a reader with that much ahead waits
    assert ra.plan(150, ahead=2 * MIN_READAHEAD, cap=64 * MiB) is None
    assert ra.plan(200, ahead=2 * MIN_READAHEAD - 1, cap=64 * MiB) == (300, 2 * MIN_READAHEAD)


def test_a_reader_that_caught_up_reads_ahead_from_where_it_is() -> None:
    ra = Readahead()
    ra.plan(100, ahead=0, cap=64 * MiB)
    ra.advanced(300)
    assert ra.plan(450, ahead=0, cap=64 * MiB) == (450, 2 * MIN_READAHEAD)


def test_read_ahead_doubles_up_to_the_cap_and_the_cap_has_a_floor() -> None:
    ra = Readahead()
    sizes = []
    end = 0
    for read_end in range(0, 10_000, 100):
        plan = ra.plan(read_end, ahead=0, cap=4 * MIN_READAHEAD)
        if plan is not None:
            sizes.append(plan[1])
            end = plan[0] + 50
            ra.advanced(end)
    assert sizes[:4] == [MIN_READAHEAD, 2 * MIN_READAHEAD, 4 * MIN_READAHEAD, 4 * MIN_READAHEAD]
    assert Readahead().plan(0, ahead=0, cap=0) == (0, MIN_READAHEAD)


def test_reset_starts_small_again() -> None:
    ra = Readahead()
    for i in range(5):
        ra.plan(i * 10, ahead=0, cap=64 * MiB)
    ra.reset()
    assert ra.plan(1000, ahead=0, cap=64 * MiB) == (1000, MIN_READAHEAD)


@given(
    reads=st.lists(st.integers(1, 4 * MiB), min_size=1, max_size=300),
    cap=st.integers(MIN_READAHEAD, 32 * MiB),
)
def test_a_sequential_reader_stays_ahead_with_few_large_read_aheads(
    reads: list[int], cap: int
) -> None:
    """A model where one offset is one byte and read-ahead lands at once: the reader never has
    more than two read-aheads in front of it, and the read-aheads number about total / cap."""
    ra = Readahead()
    pos = end = 0
    plans = 0
    for n in reads:
        if pos + n > end:  # reading beyond the read-ahead: the reader waits for object storage
            end = pos + n
        pos += n
        plan = ra.plan(pos, ahead=max(end - pos, 0), cap=cap)
        if plan is not None:
            start, size = plan
            assert start == max(pos, end)
            assert size <= cap
            end = start + size
            ra.advanced(end)
            plans += 1
        assert end - pos <= 2 * cap
    doublings = math.ceil(math.log2(cap / MIN_READAHEAD)) + 1
    assert plans <= len(reads) and plans <= sum(reads) // cap + doublings + len(reads) // 2 + 1


# -- select_blocks (pure) ------------------------------------------------------------------------


def located(*ranges: tuple[int, int, int]) -> list[LocatedBlock]:
    """Blocks of stream 1 as (start offset, end offset, size), laid out one after another in
    object 7."""
    out = []
    position = 0
    for start, end, size in ranges:
        index = DataBlockIndex(1, start, end - start, 1, position, size)
        out.append(LocatedBlock(7, 1 << 30, index))
        position += size
    return out


def test_select_blocks_fills_the_budget_and_the_first_partial_block_is_free() -> None:
    blocks = located((0, 10, 100), (10, 20, 100), (20, 30, 100), (30, 40, 100))
    chosen, enough = select_blocks(blocks, 5, -1, 150)
    # the block holding 5 is read from its middle: it does not count; two more fill 150
    assert [b.index.start_offset for b in chosen] == [0, 10, 20] and enough
    chosen, enough = select_blocks(blocks, 10, -1, 150)
    assert [b.index.start_offset for b in chosen] == [10, 20] and enough


def test_select_blocks_stops_at_the_end_offset_and_says_when_blocks_ran_out() -> None:
    blocks = located((0, 10, 100), (10, 20, 100), (20, 30, 100))
    assert select_blocks(blocks, 0, 15, 10_000) == (blocks[:2], True)
    assert select_blocks(blocks, 0, -1, 10_000) == (blocks, False)
    assert select_blocks(blocks, 30, -1, 100) == ([], False)
    assert select_blocks([], 0, -1, 100) == ([], False)


# -- merge_runs (pure) ---------------------------------------------------------------------------


def blocks_at(*spans: tuple[int, int]) -> list[DataBlockIndex]:
    return [DataBlockIndex(1, i, 1, 1, start, size) for i, (start, size) in enumerate(spans)]


def test_adjacent_blocks_merge_into_one_get_up_to_the_limit() -> None:
    blocks = blocks_at((0, 100), (100, 100), (200, 100), (400, 100), (500, 100))
    runs = merge_runs(list(reversed(blocks)), 1000)
    assert [[b.start_position for b in run] for run in runs] == [[0, 100, 200], [400, 500]]
    runs = merge_runs(blocks, 200)
    assert [[b.start_position for b in run] for run in runs] == [[0, 100], [200], [400, 500]]
    (single,) = merge_runs(blocks_at((0, 5000)), 1000)  # larger than the limit: alone
    assert len(single) == 1


# -- block parsing (pure) ------------------------------------------------------------------------


def one_block(count: int = 10, size: int = 50) -> tuple[bytes, DataBlockIndex]:
    writer = ObjectWriter(1 << 20)
    writer.add_all([StreamRecordBatch(1, 0, 2 * i, 2, bytes([i]) * size) for i in range(count)])
    built = writer.finish()
    (entry,) = built.index
    data = built.to_bytes()
    return data[entry.start_position : entry.end_position], entry


def test_block_batches_starts_inside_the_block_and_honours_end_and_max_bytes() -> None:
    block, entry = one_block()
    object_format.check_block(block, entry)
    got = object_format.block_batches(block, 5, -1, 1 << 20)
    assert [b.base_offset for b in got] == [4, 6, 8, 10, 12, 14, 16, 18]  # 4 holds offset 5
    bounded = object_format.block_batches(block, 0, 7, 1 << 20)
    assert [b.base_offset for b in bounded] == [0, 2, 4, 6]
    size = got[0].size
    assert len(object_format.block_batches(block, 0, -1, 2 * size)) == 2
    assert len(object_format.block_batches(block, 0, -1, 1)) == 1  # at least one
    assert bytes(got[0].payload) == bytes([2]) * 50  # views of the block


def test_a_block_that_mismatches_its_index_entry_is_corrupt() -> None:
    block, entry = one_block()
    with pytest.raises(CorruptObjectError, match="index says"):
        object_format.check_block(block[:-1], entry)
    other_stream = DataBlockIndex(2, 0, 20, 10, 0, len(block))
    with pytest.raises(CorruptObjectError, match="holds stream 1"):
        object_format.check_block(block, other_stream)
    damaged = bytearray(block)
    damaged[10] = 0x11  # the first batch's magic
    with pytest.raises(CorruptObjectError, match="corrupt StreamRecordBatch"):
        object_format.block_batches(bytes(damaged), 0, -1, 1 << 20)


# -- BlockCache (pure) ---------------------------------------------------------------------------


def test_blocks_already_read_are_evicted_before_unread_read_ahead() -> None:
    cache = BlockCache(300)
    cache.put(1, 0, b"a" * 100, unread=True)
    cache.put(1, 100, b"b" * 100)
    cache.put(1, 200, b"c" * 100, unread=True)
    assert cache.unread_size == 200
    cache.put(2, 0, b"d" * 100)  # evicts the read block, though it is more recent
    assert (1, 100) not in cache and (1, 0) in cache and (1, 200) in cache
    cache.mark_read(1, 0)  # now a read block, the most recently used one
    assert cache.unread_size == 100
    cache.put(2, 100, b"e" * 100)
    assert (2, 0) not in cache and (1, 0) in cache
    cache.put(2, 200, b"f" * 100)
    assert (1, 0) not in cache and (1, 200) in cache and cache.evicted_unread == 0
    cache.put(3, 0, b"g" * 300, unread=True)  # evicts everything, unread ones last
    assert cache.evicted_unread == 1 and cache.size <= 300
    cache.put(4, 0, b"h" * 301)  # larger than the cache: not kept
    assert (4, 0) not in cache


def test_views_of_one_get_count_their_buffer_once_until_the_last_leaves() -> None:
    cache = BlockCache(1000)
    data = memoryview(b"x" * 600)
    buffer = SharedBuffer(len(data))
    for position in (0, 200, 400):
        cache.put(9, position, data[position : position + 200], buffer=buffer)
    assert cache.size == 600 and len(cache) == 3
    cache.put(1, 0, b"y" * 300)
    assert cache.size == 900
    cache.put(1, 300, b"z" * 200)  # 1100 > 1000: evicts the oldest blocks until it fits
    assert cache.size <= 1000 and (9, 0) not in cache
    # the buffer is freed only with its last view
    assert all((9, p) not in cache for p in (0, 200, 400)) and cache.size == 500
    cache.clear()
    assert cache.size == 0 and buffer.cached == 0


# -- StreamReaders over a real storage -----------------------------------------------------------


SMALL_OBJECTS = {
    "s3.wal.upload.threshold": 200_000,
    "s3.object.block.size": 16_384,
    "s3.stream.object.split.size": 100_000,
    "s3.block.cache.size": 8 * MiB,
}


async def test_a_sequential_read_crosses_objects_with_merged_gets_and_read_ahead(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage(**SMALL_OBJECTS)
    s = await StreamClient(storage).create_and_open()
    payloads = []
    for _ in range(10):  # ten uploads: ten objects or more
        payloads += await fill(s, 60, size=3000)
        await storage.force_upload()
    objects = storage.metadata.get_objects(s.stream_id, 0, -1, 100)
    assert len(objects) >= 10
    blocks = 0
    for obj in objects:
        index = await storage.reader.index(obj.object_id, obj.object_size)
        blocks += len(object_format.find_blocks(index, s.stream_id, 0, -1))
    storage.drop_cache()
    before = storage.store.stats.snapshot()["get"]
    assert await read_all(s, max_bytes=32_768) == payloads
    gets = storage.store.stats.snapshot()["get"] - before
    # one GET per object index, and the data in far fewer GETs than one per block
    assert gets < len(objects) + blocks / 3, (gets, len(objects), blocks)
    assert storage.reader.waited < len(objects)  # most reads found their blocks read ahead
    assert len(storage.readers) == 1  # one reader followed the consumer throughout
    assert storage.block_cache.evicted_unread == 0


async def test_read_ahead_reaches_into_the_next_object(make_storage: StorageFactory) -> None:
    storage = await make_storage(**SMALL_OBJECTS)
    s = await StreamClient(storage).create_and_open()
    for _ in range(3):
        await fill(s, 60, size=3000)
        await storage.force_upload()
    first, second, *_ = storage.metadata.get_objects(s.stream_id, 0, -1, 10)
    storage.drop_cache()
    pos = 0
    while pos < first.end_offset - 30:  # read most of the first object only
        pos = (await s.fetch(pos, -1, 32_768)).batches[-1].last_offset
    await asyncio.sleep(0.1)  # let the read-ahead land
    assert any(oid == second.object_id for oid, _ in storage.block_cache._unread)


async def test_read_ahead_stops_where_the_log_cache_takes_over(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage(**SMALL_OBJECTS)
    s = await StreamClient(storage).create_and_open()
    for _ in range(3):
        await fill(s, 60, size=3000)
        await storage.force_upload()
    objects = storage.metadata.get_objects(s.stream_id, 0, -1, 100)
    storage.cache.evict(keep=storage.cache.size - 1)  # the oldest uploaded block only
    hot = storage.cache.get(s.stream_id, 0, s.confirmed_offset, 1)
    assert hot and hot[0].base_offset > 0
    hot_start = hot[0].base_offset
    assert any(o.start_offset >= hot_start for o in objects)
    pos = 0
    while pos < hot_start:  # the cold part, in fetches that read ahead
        pos = (await s.fetch(pos, -1, 32_768)).batches[-1].last_offset
    await asyncio.sleep(0.1)  # let any read-ahead land
    hot_objects = {o.object_id for o in objects if o.start_offset >= hot_start}
    cached = [*storage.block_cache._read, *storage.block_cache._unread]
    assert cached and not [key for key in cached if key[0] in hot_objects]


async def test_a_read_that_repeats_the_tail_of_the_last_one_continues_its_reader(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage(**SMALL_OBJECTS)
    s = await StreamClient(storage).create_and_open()
    await fill(s, 100, size=3000)
    await storage.force_upload()
    storage.drop_cache()
    first = await s.fetch(0, -1, 20_000)
    # Kafka returns whole batches up to its limit and asks again from the last one it dropped
    again = first.batches[-1].base_offset
    second = await s.fetch(again, -1, 20_000)
    assert second.batches[0].base_offset == again
    assert len(storage.readers) == 1
    await s.fetch(0, -1, 20_000)  # a second consumer from the start: a reader of its own
    assert len(storage.readers) == 2


async def test_concurrent_catch_up_readers_share_the_cache_without_evicting_read_ahead(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage(**{**SMALL_OBJECTS, "s3.block.cache.size": 2 * MiB})
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(6)]
    expected = {}
    for _ in range(4):
        for s in streams:
            expected.setdefault(s.stream_id, []).extend(await fill(s, 40, size=3000))
        await storage.force_upload()
    storage.drop_cache()

    async def consume(index: int) -> None:
        s = streams[index]
        assert await read_all(s, max_bytes=32_768) == expected[s.stream_id]

    await asyncio.gather(*(consume(i) for i in range(len(streams))))
    assert storage.block_cache.size <= 2 * MiB
    assert storage.block_cache.evicted_unread == 0


async def test_a_deleted_object_is_located_again(make_storage: StorageFactory) -> None:
    storage = await make_storage(**SMALL_OBJECTS)
    s = await StreamClient(storage).create_and_open()
    payloads = await fill(s, 60, size=3000)
    await storage.force_upload()
    storage.drop_cache()
    real_get_view = storage.store.get_view
    failed = []

    async def get_once_missing(key: str, start: int, end: int) -> bytes | memoryview:
        if not failed:  # a data block, after the index was read
            failed.append(key)
            raise ObjectNotFoundError(key)
        return await real_get_view(key, start, end)

    storage.store.get_view = get_once_missing  # type: ignore[method-assign]
    assert await read_all(s) == payloads
    assert failed


async def test_readers_at_the_end_of_their_stream_take_no_share_of_the_read_ahead_room(
    make_storage: StorageFactory,
) -> None:
    # a partition's open reads its MetaStream to the end: fifty of those (the group
    # coordinator's partitions at a restart) must not shrink a catch-up reader's read-ahead
    storage = await make_storage(**{**SMALL_OBJECTS, "s3.block.cache.readahead.size": 64 * MiB})
    client = StreamClient(storage)
    big = await client.create_and_open()
    small = [await client.create_and_open() for _ in range(6)]
    for _ in range(3):
        await fill(big, 60, size=3000)
        await storage.force_upload()
    for s in small:
        await fill(s, 2, size=100)
    await storage.force_upload()
    storage.drop_cache()
    for s in small:
        await read_all(s)
    await big.fetch(0, -1, 32_768)
    await asyncio.sleep(0.05)  # the small streams' read-ahead looks for objects and finds none
    budget = int(storage.block_cache.max_bytes * 0.75)
    share = budget // 2  # the catch-up reader alone
    room = budget - storage.block_cache.unread_size - storage.reader.prefetching
    assert len(storage.readers) == 7
    assert storage.readers.readahead_cap() == min(share, room)
    assert min(share, room) > budget // (2 * 7)


async def test_a_reader_dropped_during_its_read_neither_reads_ahead_nor_keeps_a_share(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage(**SMALL_OBJECTS)
    s = await StreamClient(storage).create_and_open()
    for _ in range(10):  # more than a read-ahead: one would not reach the stream's end
        await fill(s, 60, size=3000)
        await storage.force_upload()
    storage.drop_cache()
    fetch = asyncio.ensure_future(s.fetch(0, -1, 32_768))
    for _ in range(1000):  # until the read waits for object storage
        await asyncio.sleep(0)
        if any(r.busy for rs in storage.readers._readers.values() for r in rs):
            break
    else:
        pytest.fail("the read never started")
    storage.readers.clear()  # as when its stream is unregistered mid-read
    assert (await fetch).batches
    await asyncio.sleep(0.05)
    assert not storage.readers._sharing
    assert storage.reader.prefetching == 0


async def test_streams_about_to_be_read_whole_come_from_one_get_per_object(
    make_storage: StorageFactory,
) -> None:
    """A broker taking many partitions over replays each one's MetaStream: prefetch_streams
    reads the objects holding several of them whole, once, and the reads find their blocks."""
    storage = await make_storage()
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(20)]
    payloads = {s.stream_id: await fill(s, 3, size=200) for s in streams}
    alone = await client.create_and_open()  # in an object of its own: left to its own read
    await storage.force_upload()
    payloads[alone.stream_id] = await fill(alone, 3, size=200)
    await storage.force_upload()
    storage.drop_cache()
    before = storage.store.stats.snapshot()["get"]

    assert await storage.prefetch_streams([s.stream_id for s in streams] + [alone.stream_id]) == 1
    assert storage.store.stats.snapshot()["get"] - before == 1
    for s in streams:
        assert await read_all(s) == payloads[s.stream_id]
    assert storage.store.stats.snapshot()["get"] - before == 1
    assert await read_all(alone) == payloads[alone.stream_id]  # its own object's GETs
