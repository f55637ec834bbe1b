"""The time index: entry format, lookup, and ElasticLog.offset_for_timestamp against a brute-force
scan of random timestamps."""

from __future__ import annotations

import asyncio
import tempfile
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automq_py.log.elastic_log_meta import TimestampOffset
from automq_py.log.time_index import (
    ENTRY_SIZE,
    FLUSH_ENTRIES,
    TimeIndexError,
    decode_entries,
    encode_entry,
    lookup_entry,
)
from tests.automq_py.log.conftest import append_batches, open_log, start_storage

T0 = 1712451146370


def test_entry_layout_is_kafkas() -> None:
    data = encode_entry(T0, 17)
    assert len(data) == ENTRY_SIZE == 12
    assert data == T0.to_bytes(8, "big") + (17).to_bytes(4, "big")
    assert decode_entries(data + encode_entry(T0 + 1, 20)) == [(T0, 17), (T0 + 1, 20)]
    with pytest.raises(TimeIndexError):
        decode_entries(data[:-1])
    with pytest.raises(TimeIndexError):
        encode_entry(T0, 1 << 31)


@given(st.lists(st.integers(0, 50), max_size=20, unique=True), st.integers(-5, 60))
def test_lookup_is_the_last_entry_at_or_below(stamps: list[int], target: int) -> None:
    stamps.sort()
    timestamps = array("q", stamps)
    offsets = array("q", [100 + 2 * i for i in range(len(stamps))])
    below = [i for i, t in enumerate(stamps) if t <= target]
    expected = (
        TimestampOffset(stamps[below[-1]], offsets[below[-1]]) if below else TimestampOffset(-1, 90)
    )
    assert lookup_entry(timestamps, offsets, target, 90) == expected


def brute_force(timestamps: list[int], count: int, target: int) -> tuple[int, int] | None:
    for i, ts in enumerate(timestamps):
        if ts >= target:
            return i * count, ts
    return None


async def scenario(path: Path, timestamps: list[int], targets: list[int], interval: int) -> None:
    storage = await start_storage(path)
    try:
        log = await open_log(storage, segment_bytes=1500, index_interval_bytes=interval)
        await append_batches(log, [T0 + t for t in timestamps], count=2)
        for target in targets:
            assert await log.offset_for_timestamp(T0 + target) == brute_force(
                [T0 + t for t in timestamps], 2, T0 + target
            ), target
        best = max(timestamps)
        assert await log.max_timestamp_offset() == (timestamps.index(best) * 2, T0 + best)
        await log.close()
        # again after reopening: the index entries come from the tim stream
        reopened = await open_log(
            storage, epoch=1, segment_bytes=1500, index_interval_bytes=interval
        )
        storage.drop_cache()
        for target in targets:
            assert await reopened.offset_for_timestamp(T0 + target) == brute_force(
                [T0 + t for t in timestamps], 2, T0 + target
            ), target
        await reopened.close()
    finally:
        await storage.close()


@settings(max_examples=25)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=40),
    st.lists(st.integers(-10, 1010), min_size=1, max_size=15),
    st.sampled_from([0, 150, 400]),
)
def test_offset_for_timestamp_matches_a_brute_force_scan(
    timestamps: list[int], targets: list[int], interval: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(Path(tmp), timestamps, targets, interval))


async def test_entries_are_appended_together_and_rebuilt_after_a_crash(tmp_path: Path) -> None:
    """An active segment's entries reach the tim stream FLUSH_ENTRIES at a time; those not
    appended when the broker dies are rebuilt from the log's batches on recovery, and every
    lookup answers as before."""
    n = FLUSH_ENTRIES * 2 + 10  # two records of entries, ten entries only in memory
    timestamps = [T0 + 10 * i for i in range(n)]
    storage = await start_storage(tmp_path)
    log = await open_log(storage, segment_bytes=1 << 20, index_interval_bytes=0)
    await append_batches(log, timestamps, count=2)
    active = log._segments[-1].time_index  # the active segment's own index
    # an entry per batch but the first (none is due before a batch is in): whole records in
    # the stream, the rest in memory
    assert active.entries == n - 1
    assert active.stream.next_offset - active.slice_start == 2 * FLUSH_ENTRIES * ENTRY_SIZE
    expected = [await log.offset_for_timestamp(T0 + t) for t in range(-5, 10 * n, 37)]
    assert expected == [brute_force(timestamps, 2, T0 + t) for t in range(-5, 10 * n, 37)]
    await storage.abort()  # no close(): the last entries were only in memory

    storage = await start_storage(tmp_path)
    try:
        reopened = await open_log(storage, epoch=1, segment_bytes=1 << 20, index_interval_bytes=0)
        storage.drop_cache()
        assert [await reopened.offset_for_timestamp(T0 + t) for t in range(-5, 10 * n, 37)] == (
            expected
        )
        assert reopened._segments[-1].time_index.entries >= n - 1
        await reopened.close()  # appends what is unwritten: the stream holds every entry
        again = await open_log(storage, epoch=2, segment_bytes=1 << 20, index_interval_bytes=0)
        index = again._segments[-1].time_index
        assert index.stream.next_offset - index.slice_start == index.entries * ENTRY_SIZE
        assert [await again.offset_for_timestamp(T0 + t) for t in range(-5, 10 * n, 37)] == (
            expected
        )
        await again.close()
    finally:
        await storage.close()
