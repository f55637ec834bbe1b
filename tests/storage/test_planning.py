"""Upload planning and the LogCache (pure logic)."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest

from storage import log_cache
from storage.log_cache import CachedRun, LogCache
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
