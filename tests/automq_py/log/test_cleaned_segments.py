"""Cleaned segments (AutoMQ's ``.cleaned``): sealed segments replaced by what key compaction
kept, in the ``log.cleaned`` stream, offsets unchanged and holes skipped by reads; across a
close, and a second cleaning that takes the first one's output in."""

from __future__ import annotations

from pathlib import Path

import pytest

from automq_py.log.elastic_log import CleanedBatch, CleanedSegmentError, ElasticLog
from protocol import record_batch
from protocol.records import RecordInput, build_batch, parse_records
from tests.automq_py.log.conftest import batches_of, open_log, start_storage

T0 = 1_700_000_000_000
BATCHES = 20
END = 2 * BATCHES  # the log end offset


async def append_batches(log: ElasticLog, count: int) -> list[bytearray]:
    """``count`` batches of 2 records, key ``k<i % 3>``, value ``v<i>``; the log rolls every
    few batches."""
    out = []
    for i in range(count):
        base = log.log_end_offset
        batch = build_batch(
            [RecordInput(f"v{i}".encode(), f"k{i % 3}".encode(), [], T0 + i)] * 2,
            base_offset=base,
        )
        await log.append(
            batch, base_offset=base, record_count=2, max_timestamp=T0 + i, first_timestamp=T0 + i
        )
        out.append(batch)
    return out


def bases(views: list[memoryview]) -> list[int]:
    return [h.base_offset for v in views for h, _ in record_batch.iter_batches(v)]


def kept(batches: list[bytearray], keep: list[int], start: int) -> list[CleanedBatch]:
    """The batches at indexes ``keep`` (batch ``i`` holds offsets ``2i, 2i + 1``), each
    covering the hole since the previous one's end (``start`` for the first)."""
    out, prev = [], start
    for i in keep:
        end = 2 * i + 2
        out.append(CleanedBatch(bytes(batches[i]), end - prev))
        prev = end
    return out


async def test_a_cleaned_segment_keeps_offsets_and_skips_holes(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    try:
        log = await open_log(storage, segment_bytes=400)
        batches = await append_batches(log, BATCHES)
        sealed = [s for s in log.segments if s.log.end != -1]
        assert len(sealed) >= 2
        end = sealed[1].log.end - sealed[1].log.start + sealed[1].base_offset
        n = end // 2  # batches in the first two segments
        keep = [n - 3, n - 2, n - 1]  # the last batch of each key
        replaced = await log.replace_with_cleaned(0, end, kept(batches, keep, 0))
        assert replaced == 2
        first = log.segments[0]
        assert (first.base_offset, first.stream_suffix) == (0, ".cleaned")
        assert first.log.end - first.log.start == end  # the offset span, holes included
        assert log.stream_map["log.cleaned"] >= 0 and log.stream_map["tim.cleaned"] >= 0
        assert bases(await log.read(0, 1 << 20)) == [2 * i for i in keep] + list(range(end, END, 2))
        # a read inside a hole starts at the next kept batch
        assert bases(await log.read(1, 1 << 20))[0] == 2 * keep[0]
        values = [
            r.value
            for batch in batches_of(await log.read(0, 1 << 20, max_offset=end))
            for r in parse_records(batch)
        ]
        assert values == [f"v{i}".encode() for i in keep for _ in range(2)]
        await log.close()

        reopened = await open_log(storage, epoch=1, segment_bytes=400)
        assert bases(await reopened.read(0, 1 << 20))[:3] == [2 * i for i in keep]
        assert reopened.log_end_offset == END
        # cleaning again: the cleaned segment and the next sealed one, into one
        sealed = [s for s in reopened.segments if s.log.end != -1]
        end2 = sealed[1].log.end - sealed[1].log.start + sealed[1].base_offset
        n2 = end2 // 2
        again = kept(batches, [n2 - 3, n2 - 2, n2 - 1], 0)
        assert await reopened.replace_with_cleaned(0, end2, again) == 2
        assert bases(await reopened.read(0, 1 << 20, max_offset=end2)) == [
            2 * i for i in (n2 - 3, n2 - 2, n2 - 1)
        ]
        await reopened.close()
    finally:
        await storage.close()


async def test_a_cleaning_that_does_not_fit_is_refused(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    try:
        log = await open_log(storage, segment_bytes=400)
        batches = await append_batches(log, BATCHES)
        sealed = [s for s in log.segments if s.log.end != -1]
        end = sealed[0].log.end - sealed[0].log.start
        with pytest.raises(CleanedSegmentError):  # the counts miss the range
            await log.replace_with_cleaned(0, end, [CleanedBatch(bytes(batches[0]), 2)])
        with pytest.raises(CleanedSegmentError):  # not a segment boundary
            await log.replace_with_cleaned(
                0,
                end - 2,
                kept(batches, [0], 0)[:1] * 0 + [CleanedBatch(bytes(batches[0]), end - 2)],
            )
        with pytest.raises(CleanedSegmentError):  # the active segment is never cleaned
            await log.replace_with_cleaned(0, END, [CleanedBatch(bytes(batches[0]), END)])
        assert bases(await log.read(0, 1 << 20))[:2] == [0, 2]  # nothing changed
        await log.close()
    finally:
        await storage.close()


async def test_a_cleaned_segment_has_its_own_transaction_index(tmp_path: Path) -> None:
    from automq_py.log.txn_index import AbortedTxn
    from automq_py.partition import AppendResult, Partition

    storage = await start_storage(tmp_path)
    try:
        log = await open_log(storage, segment_bytes=400)
        p = Partition("t", 0, log, 0, 1 << 20)
        # two aborted transactions of producer 7, then plain batches until they are sealed
        for seq in (0, 2):
            txn = build_batch(
                [RecordInput(b"t", b"k", [], T0)] * 2,
                producer_id=7,
                producer_epoch=0,
                base_sequence=seq,
                is_transactional=True,
            )
            assert (await p.append_records(memoryview(txn))).error.name == "NONE"
            marker = await p.append_marker(7, 0, 0, commit=False)
            assert not isinstance(marker, AppendResult)
            await marker.durable
        await append_batches(log, BATCHES)
        assert [(t.first_offset, t.last_offset) for t in await log.aborted_transactions(0, 6)] == [
            (0, 2),
            (3, 5),
        ]
        sealed = [s for s in log.segments if s.log.end != -1]
        end = sealed[1].log.end - sealed[1].log.start + sealed[1].base_offset
        views = await log.read(0, 1 << 20, max_offset=end)
        batches = batches_of(views)
        kept = []
        covered = 0
        for data in batches:  # keep everything but the first transaction and its marker
            h = record_batch.parse_header(data)
            if h.base_offset < 3:
                continue
            for header, one in record_batch.iter_batches(data):
                kept.append(CleanedBatch(bytes(one), header.last_offset + 1 - covered))
                covered = header.last_offset + 1
        # the cleaning kept only the second transaction's ABORT
        await log.replace_with_cleaned(0, end, kept, [AbortedTxn(7, 3, 5, -1)])
        assert [(t.first_offset, t.last_offset) for t in await log.aborted_transactions(0, 6)] == [
            (3, 5)
        ]
        await log.close()
        reopened = await open_log(storage, epoch=1, segment_bytes=400)
        entries = await reopened.aborted_transactions(0, 6)
        assert [(t.first_offset, t.last_offset) for t in entries] == [(3, 5)]
        await reopened.close()
    finally:
        await storage.close()


async def test_an_abort_that_waited_for_a_cleaning_is_in_the_index_it_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaning drops the aborted-transaction index (read again from the new segments);
    an ABORT whose index entry waited for the cleaning's lock is appended meanwhile, and the
    next read of the index, once the entry is durable, has it."""
    import asyncio

    from automq_py.partition import AppendResult, Partition

    storage = await start_storage(tmp_path)
    try:
        log = await open_log(storage, segment_bytes=400)
        p = Partition("t", 0, log, 0, 1 << 20)
        batches = await append_batches(log, BATCHES)
        txn = build_batch(
            [RecordInput(b"t", b"k", [], T0)] * 2,
            producer_id=8,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
        assert (await p.append_records(memoryview(txn))).error.name == "NONE"  # 40-41
        assert await log.aborted_transactions(0, END + 2) == []  # the index loaded
        sealed = [s for s in log.segments if s.log.end != -1]
        end = sealed[0].log.end - sealed[0].log.start + sealed[0].base_offset

        holding, release = asyncio.Event(), asyncio.Event()
        trim = log._trim_streams

        async def held_trim() -> None:  # inside the cleaning's lock, before the index drops
            holding.set()
            await release.wait()
            await trim()

        monkeypatch.setattr(log, "_trim_streams", held_trim)
        cleaning = asyncio.create_task(
            log.replace_with_cleaned(0, end, kept(batches, list(range(end // 2)), 0))
        )
        await holding.wait()
        abort = asyncio.create_task(p.append_marker(8, 0, 0, commit=False))
        await asyncio.sleep(0.05)  # its index entry waits for the log's lock
        release.set()
        await cleaning
        marker = await abort
        assert not isinstance(marker, AppendResult), marker
        await marker.durable
        entries = await log.aborted_transactions(0, END + 3)
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in entries] == [
            (8, END, END + 2)
        ]
    finally:
        await storage.close()
