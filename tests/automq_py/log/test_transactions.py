"""Transactions in one partition: the producer state's open transactions, markers, the last
stable offset and the aborted-transaction index, across a clean close and a crash."""

from __future__ import annotations

import asyncio
from pathlib import Path

from automq_py.log.elastic_log import ElasticLog
from automq_py.log.txn_index import AbortedTxn
from automq_py.partition import AppendResult, Partition
from protocol import control_records, record_batch
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch
from tests.automq_py.log.conftest import batches_of, open_log, start_storage

T0 = 1_700_000_000_000


def batch(pid: int, seq: int, count: int = 2, *, txn: bool = True, epoch: int = 0) -> memoryview:
    records = [RecordInput(f"{pid}-{seq + i}".encode(), None, [], T0) for i in range(count)]
    return memoryview(
        build_batch(
            records,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=txn,
        )
    )


async def append(partition: Partition, records: memoryview) -> int:
    result = await partition.append_records(records)
    assert result.error == ErrorCode.NONE, result
    return result.base_offset


async def mark(partition: Partition, pid: int, commit: bool, *, epoch: int = 0) -> int:
    started = await partition.append_marker(pid, epoch, 0, commit)
    assert not isinstance(started, AppendResult), started
    await started.durable
    return started.base_offset


def offsets_read(views: list[memoryview]) -> list[tuple[int, bool]]:
    """(base offset, is_control) of every batch read."""
    return [(h.base_offset, h.is_control) for v in views for h, _ in record_batch.iter_batches(v)]


def new_partition(log: ElasticLog) -> Partition:
    return Partition("t", 0, log, 0, 1 << 20)


async def test_open_transactions_hold_back_the_stable_offset(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    try:
        p = new_partition(await open_log(storage))
        await append(p, batch(7, 0, txn=False))  # 0-1: idempotent, outside transactions
        assert await append(p, batch(1, 0)) == 2  # 2-3: producer 1's transaction opens
        await append(p, batch(2, 0))  # 4-5: producer 2's
        assert (p.high_watermark, p.last_stable_offset) == (6, 2)
        # read_committed reads stop at the LSO
        assert offsets_read(await p.read(0, 1 << 20, p.last_stable_offset)) == [(0, False)]

        assert await mark(p, 1, commit=True) == 6
        assert p.last_stable_offset == 4  # producer 2 still open
        assert await mark(p, 2, commit=False) == 7
        assert p.last_stable_offset == p.high_watermark == 8
        assert await p.log.aborted_transactions(0, 8) == [AbortedTxn(2, 4, 7, 8)]
        assert await p.log.aborted_transactions(8, 100) == []  # ends before the range
        views = await p.read(6, 1 << 20)
        markers = [control_records.parse_marker(b) for b in batches_of(views)]
        assert [m.is_commit for m in markers] == [True, False]
    finally:
        await storage.close()


async def test_a_marker_for_no_transaction_is_written_but_indexes_nothing(
    tmp_path: Path,
) -> None:
    storage = await start_storage(tmp_path)
    try:
        p = new_partition(await open_log(storage))
        assert await mark(p, 5, commit=False) == 0
        assert await p.log.aborted_transactions(0, 10) == []
        assert p.log.stream_map["txn"] == -1  # no Txn stream for nothing
    finally:
        await storage.close()


async def test_fenced_markers_and_plain_writes_inside_a_transaction_are_refused(
    tmp_path: Path,
) -> None:
    storage = await start_storage(tmp_path)
    try:
        p = new_partition(await open_log(storage))
        await append(p, batch(1, 0, epoch=3))
        refused = await p.append_records(batch(1, 2, txn=False, epoch=3))
        assert refused.error == ErrorCode.INVALID_TXN_STATE
        old = await p.append_marker(1, 2, 0, True)
        assert isinstance(old, AppendResult) and old.error == ErrorCode.INVALID_PRODUCER_EPOCH
        await mark(p, 1, commit=True, epoch=3)
        stale = await p.append_marker(1, 3, -1, True)
        assert isinstance(stale, AppendResult)
        assert stale.error == ErrorCode.TRANSACTION_COORDINATOR_FENCED
        # a client's own control batch is refused
        forged = control_records.build_marker_batch(True, 1, 3, 0, T0)
        assert (await p.append_records(memoryview(forged))).error == ErrorCode.INVALID_RECORD
    finally:
        await storage.close()


async def test_a_produce_whose_verification_a_marker_ended_appends_nothing(
    tmp_path: Path,
) -> None:
    """A Produce verified its transactional batch (it holds the producer's guard), then the
    transaction's ABORT marker landed before its append: the batch, which would open a
    transaction nothing closes (and hold the stable offset back for good), is refused, on
    either append path (the partition idle, or another append holding it)."""
    storage = await start_storage(tmp_path)
    try:
        p = new_partition(await open_log(storage))
        await append(p, batch(1, 0))  # producer 1's transaction opens ...
        guard = p.log.producer_state.verification_guard(1, T0)  # (open: no guard needed)
        await mark(p, 1, commit=False)  # ... and is aborted before the late append
        end = p.log.log_end_offset
        late = await p.start_append(batch(1, 2), guard=guard)
        assert isinstance(late, AppendResult) and late.error == ErrorCode.INVALID_TXN_STATE
        verifying = p.log.producer_state.verification_guard(2, T0)
        await mark(p, 2, commit=False)  # (a marker for a transaction with nothing here)
        async with p._append_lock:  # another append holds the partition: the locked path
            waiting = asyncio.ensure_future(p.start_append(batch(2, 0), guard=verifying))
            await asyncio.sleep(0)
        late = await waiting
        assert isinstance(late, AppendResult) and late.error == ErrorCode.INVALID_TXN_STATE
        assert p.log.log_end_offset == end + 1  # producer 2's marker only
        assert p.last_stable_offset == p.high_watermark
        # verified anew after the marker: taken
        fresh = p.log.producer_state.verification_guard(2, T0)
        started = await p.start_append(batch(2, 0), guard=fresh)
        assert not isinstance(started, AppendResult), started
        await started.durable
    finally:
        await storage.close()


async def test_transactions_and_the_index_survive_a_close(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    try:
        p = new_partition(await open_log(storage, segment_bytes=300))
        await append(p, batch(1, 0))  # 0-1
        await mark(p, 1, commit=False)  # 2
        await append(p, batch(2, 0))  # 3-4, left open
        await p.log.close()
        reopened = new_partition(await open_log(storage, epoch=1, segment_bytes=300))
        assert reopened.last_stable_offset == 3
        assert await reopened.log.aborted_transactions(0, 5) == [AbortedTxn(1, 0, 2, 3)]
        await mark(reopened, 2, commit=False)
        assert await reopened.log.aborted_transactions(0, 6) == [
            AbortedTxn(1, 0, 2, 3),
            AbortedTxn(2, 3, 5, 6),
        ]
        await reopened.log.close()
    finally:
        await storage.close()


async def test_transactions_and_the_index_survive_a_crash(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    p = new_partition(await open_log(storage))
    await append(p, batch(1, 0))  # 0-1
    await mark(p, 1, commit=False)  # 2
    await append(p, batch(2, 0))  # 3-4, left open
    await storage.abort()  # kill -9: no close, no snapshot since the start

    storage = await start_storage(tmp_path)
    try:
        reopened = new_partition(await open_log(storage, epoch=1))
        assert reopened.high_watermark == 5
        assert reopened.last_stable_offset == 3
        assert await reopened.log.aborted_transactions(0, 5) == [AbortedTxn(1, 0, 2, 3)]
        refused = await reopened.append_records(batch(2, 2, txn=False))
        assert refused.error == ErrorCode.INVALID_TXN_STATE
    finally:
        await storage.close()
