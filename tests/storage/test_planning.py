"""Upload planning and the LogCache (pure logic)."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import log_cache
from storage.log_cache import JOINED_CHUNK, JOINED_PAYLOAD, CachedRun, LogCache
from storage.stream_record_batch import StreamRecordBatch
from storage.upload import plan_upload


def run(stream: int, n: int, size: int, start: int = 0) -> list[StreamRecordBatch]:
    return [StreamRecordBatch(stream, 0, start + i, 1, b"x" * (size - 33)) for i in range(n)]


def test_large_streams_become_stream_objects_and_the_rest_one_stream_set_object() -> None:
    records = {7: run(7, 10, 100), 3: run(3, 100, 100), 5: run(5, 2, 100)}
    plan = plan_upload(records, split_size=5000)
    assert [r[0].stream_id for r in plan.stream_objects] == [3]
    assert [r[0].stream_id for r in plan.stream_set] == [5, 7]
    assert plan.object_count == 2


def test_object_count_does_not_grow_with_stream_count() -> None:
    few = plan_upload({s: run(s, 100, 1000) for s in range(10)}, split_size=8 << 20)
    many = plan_upload({s: run(s, 1, 1000) for s in range(1000)}, split_size=8 << 20)
    assert few.object_count == many.object_count == 1


def test_log_cache_reads_across_blocks_and_reports_the_wal_trim_point() -> None:
    cache = LogCache(max_size=10_000)
    for i, b in enumerate(run(1, 4, 100)):
        cache.put(b, i * 200, i * 200 + 150)
    sealed = cache.seal()
    assert sealed is not None
    for i, b in enumerate(run(1, 4, 100, start=4)):
        cache.put(b, 800 + i * 200, 800 + i * 200 + 150)
    got = cache.get(1, 2, 100, 10_000)
    assert [b.base_offset for b in got] == [2, 3, 4, 5, 6, 7]
    assert [b.base_offset for b in cache.get(1, 2, 100, 150)] == [2, 3]
    assert cache.get(1, 8, 100, 10_000) == []
    assert cache.wal_trim_offset(fallback=-1) == 0
    cache.mark_uploaded(sealed)
    assert cache.wal_trim_offset(fallback=-1) == 800
    cache.drop_uploaded()
    got = cache.get(1, 0, 100, 10_000)
    assert got[0].base_offset == 4  # the caller reads 0..4 from object storage


def test_log_cache_evicts_only_uploaded_blocks() -> None:
    cache = LogCache(max_size=500)
    for b in run(1, 4, 100):
        cache.put(b, 0, 1)
    first = cache.seal()
    for b in run(1, 4, 100, start=4):
        cache.put(b, 1, 2)
    assert cache.size == 800  # over the limit, but nothing is uploaded yet: keep it all
    cache.evict()
    assert cache.size == 800
    assert first is not None
    cache.mark_uploaded(first)
    assert cache.size == 400 and cache.unuploaded_size == 400


def fill(cache: LogCache, streams: list[int], offsets: range, size: int, wal: int = 0) -> int:
    """Put a record of ``size`` bytes at each of ``offsets`` for each stream, interleaved as a
    WAL lays them out (a 16-byte frame each); the WAL offset after them."""
    for offset in offsets:
        for stream in streams:
            record = StreamRecordBatch(stream, 0, offset, 1, b"x" * (size - 33))
            cache.put(record, wal, wal + size + 16)
            wal += size + 16
    return wal


def test_eviction_keeps_the_newest_records_up_to_the_limit_not_whole_blocks() -> None:
    cache = LogCache(max_size=10_000)
    wal = fill(cache, [1, 2], range(40), 100)  # 8,000 bytes in the first block
    first = cache.seal()
    fill(cache, [1, 2], range(40, 60), 100, wal)  # 4,000 more: 2,000 over the limit once uploaded
    assert first is not None
    cache.mark_uploaded(first)
    # about the oldest 2,000 bytes are gone (a record or two more: the WAL's framing), not the
    # whole 8,000-byte block
    assert 8_000 <= cache.size <= 10_000
    for stream in (1, 2):
        got = cache.get(stream, 0, 1_000, 1 << 20)
        # each stream lost its oldest records alike; the rest reads on without a gap
        assert 8 <= got[0].base_offset <= 11
        assert [r.base_offset for r in got] == list(range(got[0].base_offset, 60))
    assert first.size == sum(first.stream_sizes.values()) == cache.size - 4_000
    # the block's record count, sizes and WAL positions stay in step after the trim
    for stream, run_ in first.records.items():
        assert len(first.wal_positions[stream]) == 2 * len(run_)
        assert first.stream_sizes[stream] == sum(r.size for r in run_)


def test_eviction_drops_a_whole_block_when_all_of_it_is_over() -> None:
    cache = LogCache(max_size=3_000)
    wal = fill(cache, [1], range(20), 100)
    first = cache.seal()
    wal = fill(cache, [1], range(20, 40), 100, wal)
    second = cache.seal()
    assert first is not None and second is not None
    cache.mark_uploaded(first)
    cache.mark_uploaded(second)
    fill(cache, [1], range(40, 60), 100, wal)  # the active block, not uploaded: kept
    cache.evict()
    assert cache.size == 3_000  # the first block whole, then 1,000 bytes of the second
    assert cache.get(1, 0, 1_000, 1 << 20)[0].base_offset == 30
    assert not first.records


def test_eviction_trims_until_under_the_limit_and_reads_stay_contiguous() -> None:
    cache = LogCache(max_size=5_000)
    wal = 0
    for i in range(6):
        wal = fill(cache, [1, 2, 3], range(7 * i, 7 * i + 7), 100, wal)  # 2,100 bytes a block
        block = cache.seal()
        assert block is not None
        cache.mark_uploaded(block)
        assert cache.size <= 5_000
    assert cache.size >= 5_000 - 3 * 116  # at most a record per stream beyond the limit
    for stream in (1, 2, 3):
        got = cache.get(stream, 0, 1_000, 1 << 20)
        assert [r.base_offset for r in got] == list(range(got[0].base_offset, 42))


async def test_an_evicted_block_is_freed_a_slice_at_a_time_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_cache, "RELEASE_STEP", 10)
    cache = LogCache(max_size=100)
    records = run(1, 30, 100) + run(2, 5, 100)
    for b in records:
        cache.put(b, 0, 1)
    block = cache.seal()
    assert block is not None
    # the payloads the cache holds: bytes of their own, no one else's
    first, last = block.records[1].payloads[0], block.records[2].payloads[4]
    refs = sys.getrefcount(first)
    assert sys.getrefcount(last) == refs
    cache.mark_uploaded(block)
    assert cache.get(1, 0, 100, 10_000) == [] and not block.records  # gone at once
    await asyncio.sleep(0)  # one slice: the last ten
    assert sys.getrefcount(first) == refs and sys.getrefcount(last) == refs - 1
    steps = 1
    while sys.getrefcount(first) == refs:
        await asyncio.sleep(0)
        steps += 1
    assert steps == 4  # 35 payloads, 10 per loop iteration, the first of them last


def test_an_evicted_block_is_freed_at_once_without_a_loop() -> None:
    cache = LogCache(max_size=100)
    for b in run(1, 3, 100):
        cache.put(b, 0, 1)
    block = cache.seal()
    assert block is not None
    first = next(iter(block.records.values())).payloads[0]
    refs = sys.getrefcount(first)
    cache.mark_uploaded(block)
    assert sys.getrefcount(first) == refs - 1


def test_a_cached_run_reads_back_what_was_put_and_refuses_a_gap() -> None:
    cached = CachedRun(4)
    records = [
        StreamRecordBatch(4, 1, 0, 3, b"abc"),
        StreamRecordBatch(4, 2, 3, 1, memoryview(bytearray(b"d"))),
        StreamRecordBatch(4, 2, 4, 2, b"ef"),
    ]
    for r in records:
        cached.append(r)
    assert len(cached) == 3
    assert cached[-1] == records[-1] and cached[0] == records[0]
    assert cached[1].payload == b"d" and type(cached[1].payload) is bytes
    # nothing the collector would walk: the payloads' dict is untracked
    assert not gc.is_tracked(cached.payloads)
    assert list(cached) == [cached[0], cached[1], cached[2]] and cached[1:] == [
        cached[1],
        cached[2],
    ]
    assert [r.base_offset for r in cached.get(3, 100, 1 << 20)] == [3, 4]
    assert [r.base_offset for r in cached.get(2, 4, 1 << 20)] == [0, 3]
    assert [r.base_offset for r in cached.get(0, 100, 1)] == [0]  # at least one record
    assert cached.get(6, 100, 1 << 20) == []
    with pytest.raises(IndexError):
        cached[3]
    with pytest.raises(ValueError, match="does not follow 6"):
        cached.append(StreamRecordBatch(4, 2, 7, 1, b"g"))


def test_cached_records_add_no_object_the_garbage_collector_tracks() -> None:
    """A cache full of records must not make every collection walk them: before, each
    record was a StreamRecordBatch, a memoryview and its buffer, all tracked."""
    cache = LogCache(max_size=1 << 30)
    frame = memoryview(bytearray(1000 * 100))  # a request's memory, records arrive in it
    gc.collect()
    before = len(gc.get_objects())
    for i in range(1000):
        for s in (1, 2):
            cache.put(StreamRecordBatch(s, 0, i, 1, frame[i * 100 : (i + 1) * 100]), i, i + 1)
    gc.collect()
    assert len(gc.get_objects()) - before < 50
    assert [b.base_offset for b in cache.get(2, 998, 2000, 1 << 20)] == [998, 999]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(40, 400), st.booleans()), min_size=1, max_size=80
    ),
    st.integers(0, 6_000),
)
def test_eviction_keeps_sizes_in_step_and_every_stream_contiguous(
    puts: list[tuple[int, int, bool]], max_size: int
) -> None:
    cache = LogCache(max_size=max_size)
    nexts: dict[int, int] = {}
    wal = 0
    for stream, size, upload in puts:
        offset = nexts.get(stream, 0)
        cache.put(StreamRecordBatch(stream, 0, offset, 1, b"x" * (size - 33)), wal, wal + size + 16)
        nexts[stream] = offset + 1
        wal += size + 16
        if upload:
            block = cache.seal()
            assert block is not None
            cache.mark_uploaded(block)
            # evicted down to the limit, or to what is not uploaded yet if that is more
            assert cache.size <= max(max_size, cache.unuploaded_size)
    blocks = list(cache._blocks)
    assert cache.size == sum(b.size for b in blocks)
    unuploaded = sum(b.size for b in blocks if not b.uploaded)
    assert cache.unuploaded_size == unuploaded
    for b in blocks:
        assert b.size == sum(b.stream_sizes.values())
        for stream, run_ in b.records.items():
            assert b.stream_sizes[stream] == sum(r.size for r in run_)
            assert len(b.wal_positions[stream]) == 2 * len(run_)
    for stream, end in nexts.items():
        got = cache.get(stream, 0, end, 1 << 30)
        if got:  # the newest records, each stream's to its end, without a gap
            assert [r.base_offset for r in got] == list(range(got[0].base_offset, end))


def whole_reference(
    cache: LogCache, stream: int, start: int, end: int, max_bytes: int, min_one: bool
) -> tuple[list[bytes], int] | None:
    """What a fetch reads, from ``get``'s records: whole batches from the one holding
    ``start``, none at or after ``end``, within ``max_bytes`` (the first regardless with
    ``min_one``); None if the cache does not hold ``start``."""
    got = cache.get(stream, start, end, 1 << 40)
    if not got or got[0].base_offset > start:
        return None
    sizes = [len(record.payload) for record in got]
    count = 0  # the longest prefix within the budget; one however large with min_one
    while count < len(got) and (sum(sizes[: count + 1]) <= max_bytes or (min_one and not count)):
        count += 1
    taken = got[:count]
    return [bytes(r.payload) for r in taken], (taken[-1].last_offset if taken else start)


def read_whole(
    cache: LogCache, stream: int, start: int, end: int, max_bytes: int, min_one: bool
) -> tuple[list[memoryview], int] | None:
    """``cache.read_whole``'s payloads and stop; the bytes it says it took are theirs, and a
    miss appends nothing."""
    out: list[memoryview] = []
    got = cache.read_whole(stream, start, end, max_bytes, min_one, out)
    if got is None:
        assert out == []
        return None
    taken, stop = got
    assert taken == sum(len(v) for v in out)
    return out, stop


def test_a_whole_batch_read_stops_at_the_budget_and_crosses_blocks() -> None:
    cache = LogCache(max_size=1 << 20)
    wal = fill(cache, [1, 2], range(0, 5), 100)
    cache.seal()
    fill(cache, [1, 2], range(5, 10), 100, wal)
    views, stop = read_whole(cache, 1, 3, 100, 4 * 67, True) or ([], -1)
    # records 3-6, from two blocks: each block's small payloads joined
    assert [len(v) for v in views] == [2 * 67, 2 * 67] and stop == 7
    views, stop = read_whole(cache, 1, 3, 5, 1 << 20, True) or ([], -1)
    assert [len(v) for v in views] == [2 * 67] and stop == 5  # none starting at or after ``end``
    # the first record however large, or none when the fetch may return nothing
    assert [len(v) for v in (read_whole(cache, 1, 3, 100, 10, True) or ([], 0))[0]] == [67]
    assert read_whole(cache, 1, 3, 100, 10, False) == ([], 3)
    assert read_whole(cache, 3, 0, 100, 1 << 20, True) is None  # a stream it does not hold


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(34, 400), st.booleans()), min_size=1, max_size=60),
    st.integers(0, 70),
    st.integers(0, 70),
    st.integers(0, 5_000),
    st.booleans(),
    st.integers(0, 20_000),
)
def test_a_whole_batch_read_is_what_get_and_the_fetch_budget_give(
    puts: list[tuple[int, bool]],
    start: int,
    length: int,
    max_bytes: int,
    min_one: bool,
    max_size: int,
) -> None:
    cache = LogCache(max_size=max_size)
    wal = 0
    for offset, (size, upload) in enumerate(puts):
        cache.put(
            StreamRecordBatch(1, 0, offset, 1, bytes([offset % 251]) * (size - 33)),
            wal,
            wal + size + 16,
        )
        wal += size + 16
        if upload:
            block = cache.seal()
            assert block is not None
            cache.mark_uploaded(block)  # evicts the oldest records over max_size
    end = min(start + length, len(puts))
    if start >= end:
        return
    got = read_whole(cache, 1, start, end, max_bytes, min_one)
    expected = whole_reference(cache, 1, start, end, max_bytes, min_one)
    # (compared joined: small payloads come joined)
    assert (None if got is None else (b"".join(got[0]), got[1])) == (
        None if expected is None else (b"".join(expected[0]), expected[1])
    )


def test_a_whole_batch_read_joins_small_payloads_and_leaves_large_ones_as_they_are() -> None:
    cache = LogCache(max_size=1 << 30)
    small = JOINED_PAYLOAD - 1
    sizes = [100, 200, JOINED_PAYLOAD, 300] + [small] * 9 + [50]
    wal = 0
    for offset, size in enumerate(sizes):
        cache.put(StreamRecordBatch(1, 0, offset, 1, bytes([offset]) * size), wal, wal + size)
        wal += size
    payloads = [bytes([offset]) * size for offset, size in enumerate(sizes)]
    views, stop = read_whole(cache, 1, 0, len(sizes), 1 << 30, True) or ([], -1)
    # the first two joined; the large one alone; then chunks of about JOINED_CHUNK
    first_chunk = 300 + small * (JOINED_CHUNK // small)
    assert first_chunk >= JOINED_CHUNK > first_chunk - small
    assert [len(v) for v in views] == [300, JOINED_PAYLOAD, first_chunk, small + 50]
    assert b"".join(views) == b"".join(payloads) and stop == len(sizes)
    # the budget ends a read inside a run of small payloads: what was taken is appended
    views, stop = read_whole(cache, 1, 3, len(sizes), 300 + 2 * small, False) or ([], -1)
    assert [bytes(v) for v in views] == [b"".join(payloads[3:6])] and stop == 6
