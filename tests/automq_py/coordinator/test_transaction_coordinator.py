"""The transaction coordinator in a real broker (in-process, embedded file store): a commit
whose markers were never written (the broker stopped between the two phases) is completed when
``__transaction_state`` is loaded again, and the partitions' stable offsets move on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from automq_py import replica_manager
from automq_py.broker import Broker
from automq_py.coordinator.transaction_coordinator import TransactionCoordinator
from automq_py.coordinator.transaction_metadata import TransactionMetadata, TransactionState
from automq_py.partition import Partition
from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.records import RecordInput, build_batch
from tests.automq_py.coordinator.test_group_coordinator import _config
from tests.support.broker import SettableSession


def _txns(broker: Broker) -> TransactionCoordinator:
    assert broker.transactions is not None
    return broker.transactions


async def _partition(broker: Broker, topic: str, index: int) -> Partition:
    assert broker.server is not None
    ctx = broker.server.apis.ctx
    info = ctx.topics.get(topic)
    assert info is not None
    return await ctx.replicas.partition(info, index)


async def test_a_prepared_commit_is_completed_when_the_log_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    broker = Broker(_config(data, **{"transaction.state.log.num.partitions": "3"}))
    await broker.start()
    try:
        assert broker.server is not None
        await broker.server.apis.ctx.topics.create("t", 2)
        txns = _txns(broker)
        error, pid, epoch = await txns.init_producer_id("tx", 60_000)
        assert error == ErrorCode.NONE
        assert await txns.add_partitions("tx", pid, epoch, [("t", 0), ("t", 1)]) == ErrorCode.NONE
        for index in (0, 1):
            batch = build_batch(
                [RecordInput(b"v", b"k", [], 1_700_000_000_000)] * 3,
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                is_transactional=True,
            )
            p = await _partition(broker, "t", index)
            assert (await p.append_records(memoryview(batch))).error == ErrorCode.NONE
        # the second phase never starts: as if the broker died right after PrepareCommit
        started: list[TransactionMetadata] = []
        monkeypatch.setattr(
            TransactionCoordinator, "_start_completion", lambda self, m: started.append(m)
        )
        assert await txns.end_txn("tx", pid, epoch, commit=True) == ErrorCode.NONE
        assert [m.state for m in started] == [TransactionState.PREPARE_COMMIT]
        for index in (0, 1):
            p = await _partition(broker, "t", index)
            assert (p.last_stable_offset, p.high_watermark) == (0, 3)
    finally:
        await broker.stop()
    monkeypatch.undo()

    again = Broker(_config(data, **{"transaction.state.log.num.partitions": "3"}))
    await again.start()
    try:
        txns = _txns(again)
        for _ in range(100):  # loading runs in the background
            m = txns.transactions.get("tx")
            if m is not None and m.state is TransactionState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0.1)
        m = txns.transactions.get("tx")
        assert m is not None and m.state is TransactionState.COMPLETE_COMMIT
        assert m.partitions == frozenset()
        for index in (0, 1):
            p = await _partition(again, "t", index)
            assert (p.last_stable_offset, p.high_watermark) == (4, 4)
            (view,) = await p.read(3, 1 << 20)
            (header, _), *_ = record_batch.iter_batches(view)
            assert header.is_control and header.producer_id == pid
        # the id goes on: a bumped epoch for the next producer
        error, pid2, epoch2 = await txns.init_producer_id("tx", 60_000)
        assert (error, pid2, epoch2) == (ErrorCode.NONE, pid, epoch + 1)
    finally:
        await again.stop()


async def test_a_coordinator_write_is_acknowledged_only_in_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator's record made durable while its broker may have been fenced (no heartbeat
    through for nearly a session) is not acknowledged: the broker now leading the partition
    may not have it. Its requester retries (COORDINATOR_NOT_AVAILABLE while it is not known,
    NOT_COORDINATOR once the fence is seen), as a deposed Kafka coordinator's write that never
    gathers its in-sync replicas is never answered NONE."""
    monkeypatch.setattr(replica_manager, "SESSION_WAIT_S", 0.3)
    broker = Broker(_config(tmp_path / "data", **{"transaction.state.log.num.partitions": "1"}))
    await broker.start()
    try:
        txns = _txns(broker)
        session = SettableSession()
        assert broker.replicas is not None
        broker.replicas.session = session
        assert (await txns.init_producer_id("tx", 60_000))[0] == ErrorCode.NONE
        session.current = False  # frozen, or cut off from the metadata, nearly a session
        error, _, _ = await txns.init_producer_id("tx", 60_000)
        assert error == ErrorCode.COORDINATOR_NOT_AVAILABLE
        held = asyncio.create_task(txns.init_producer_id("tx", 60_000))
        await asyncio.sleep(0.1)
        assert not held.done()  # held until the session is known again
        session.fenced = True
        assert (await held)[0] == ErrorCode.NOT_COORDINATOR
    finally:
        await broker.stop()


async def test_a_completion_stops_once_its_coordinator_is_deposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Markers that cannot be written are retried, but only while this broker coordinates the
    id: once its ``__transaction_state`` partition is led elsewhere, the new coordinator
    completes the transaction from the log, and this one neither retries on (its markers would
    carry on after the new coordinator's) nor puts the id back once unloaded."""
    broker = Broker(_config(tmp_path / "data", **{"transaction.state.log.num.partitions": "1"}))
    await broker.start()
    try:
        assert broker.server is not None
        await broker.server.apis.ctx.topics.create("t", 1)
        txns = _txns(broker)
        error, pid, epoch = await txns.init_producer_id("tx", 60_000)
        assert error == ErrorCode.NONE
        assert await txns.add_partitions("tx", pid, epoch, [("t", 0)]) == ErrorCode.NONE

        async def unwritable(self: Partition, *args: object) -> object:
            raise OSError("injected: the partition cannot take its marker")

        monkeypatch.setattr(Partition, "append_marker", unwritable)
        assert await txns.end_txn("tx", pid, epoch, commit=True) == ErrorCode.NONE
        await asyncio.sleep(0.2)
        assert "tx" in txns._completing  # retrying
        monkeypatch.setattr(txns.runtime, "leads", lambda index: False)
        txns.partition_unloaded(0)
        async with asyncio.timeout(5):
            while "tx" in txns._completing:
                await asyncio.sleep(0.05)
        assert "tx" not in txns.transactions
    finally:
        monkeypatch.undo()
        await broker.stop()
