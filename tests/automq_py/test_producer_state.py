"""Producer state: Kafka's sequence and epoch rules, the snapshot format, and its persistence in
the ElasticLog across a clean close and a crash."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest

from automq_py.log import meta_stream_record as keys
from automq_py.log.elastic_log import ElasticLog
from automq_py.producer_state import (
    BATCHES_TO_RETAIN,
    INT32_MAX,
    OPEN_TXN_GUARD,
    BatchMetadata,
    InvalidProducerSnapshotError,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    in_sequence,
)
from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.record_batch import RecordBatchHeader, parse_header
from protocol.records import RecordInput, build_batch
from tests.automq_py.log.conftest import open_log, start_storage

PID = 4000
T0 = 1_700_000_000_000


def header(
    seq: int, count: int = 1, *, pid: int = PID, epoch: int = 0, ts: int = T0
) -> RecordBatchHeader:
    """The header of a real idempotent batch of ``count`` records starting at ``seq``."""
    records = [RecordInput(f"v{i}".encode(), None, [], ts) for i in range(count)]
    return parse_header(
        build_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    )


def appended(state: ProducerStateManager, *headers: RecordBatchHeader, at: int = 0) -> int:
    """Check and append ``headers`` one by one from offset ``at``; returns the next offset."""
    for h in headers:
        assert state.check([h]).ok, state.check([h])
        state.update(h, at, h.max_timestamp)
        at += h.last_offset_delta + 1
    return at


def test_in_order_batches_are_accepted_and_remembered() -> None:
    state = ProducerStateManager()
    end = appended(state, header(0, 3), header(3, 2), header(5, 1))
    assert end == 6
    entry = state.entry(PID)
    assert entry is not None and entry.producer_epoch == 0 and entry.last_seq == 5
    assert list(entry.batches) == [
        BatchMetadata(0, 2, 0, 2, T0),
        BatchMetadata(3, 4, 3, 4, T0),
        BatchMetadata(5, 5, 5, 5, T0),
    ]


def test_a_retried_batch_is_a_duplicate_with_its_original_offsets() -> None:
    state = ProducerStateManager()
    appended(state, header(0, 3), header(3, 2), at=100)
    check = state.check([header(0, 3)])
    assert check.error == ErrorCode.NONE and check.duplicate == BatchMetadata(0, 2, 100, 102, T0)
    assert not check.ok
    assert state.check([header(3, 2)]).duplicate == BatchMetadata(3, 4, 103, 104, T0)


def test_a_duplicate_needs_the_same_sequence_range_and_epoch() -> None:
    state = ProducerStateManager()
    appended(state, header(0, 3))
    # same first sequence, other length: not a duplicate, and out of order
    assert state.check([header(0, 2)]).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # same range under a newer epoch: a new batch that starts the epoch
    assert state.check([header(0, 3, epoch=1)]).ok


def test_only_the_last_five_batches_are_recognised() -> None:
    state = ProducerStateManager()
    appended(state, *[header(i) for i in range(7)])
    entry = state.entry(PID)
    assert entry is not None and len(entry.batches) == BATCHES_TO_RETAIN
    for seq in range(2, 7):
        assert state.check([header(seq)]).duplicate is not None
    # older than the window: the gap rule answers, as Kafka's does
    assert state.check([header(1)]).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_sequence_gap_is_out_of_order() -> None:
    state = ProducerStateManager()
    appended(state, header(0, 3))
    check = state.check([header(4)])
    assert check.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert check.message is not None and "expected 3" in check.message


def test_an_older_epoch_is_invalid() -> None:
    state = ProducerStateManager()
    appended(state, header(0, epoch=3))
    assert state.check([header(1, epoch=2)]).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.check([header(0, epoch=2)]).error == ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_new_epoch_must_start_at_zero_and_forgets_the_old_batches() -> None:
    state = ProducerStateManager()
    appended(state, header(0), header(1))
    assert state.check([header(2, epoch=1)]).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    appended(state, header(0, epoch=1), at=2)
    entry = state.entry(PID)
    assert entry is not None and entry.producer_epoch == 1 and len(entry.batches) == 1
    assert state.check([header(1, epoch=0)]).error == ErrorCode.INVALID_PRODUCER_EPOCH


def test_an_unknown_producer_may_start_at_any_sequence() -> None:
    # KIP-360: no state (new, expired or trimmed away) is not UNKNOWN_PRODUCER_ID any more
    state = ProducerStateManager()
    assert state.check([header(42, epoch=7)]).ok


def test_sequences_wrap_after_int32_max() -> None:
    assert in_sequence(INT32_MAX, 0) and not in_sequence(INT32_MAX, 1)
    state = ProducerStateManager()
    wrapping = header(INT32_MAX - 1, 3)  # INT32_MAX - 1, INT32_MAX, 0
    assert wrapping.last_sequence == 0
    appended(state, header(INT32_MAX - 3, 2), wrapping)
    assert state.check([header(1)]).ok
    assert state.check([header(INT32_MAX - 1, 3)]).duplicate == BatchMetadata(
        INT32_MAX - 1, 0, 2, 4, T0
    )
    state2 = ProducerStateManager()
    appended(state2, header(INT32_MAX))
    assert state2.check([header(0)]).ok


def test_the_batches_of_one_request_are_checked_in_order() -> None:
    state = ProducerStateManager()
    appended(state, header(0))
    assert state.check([header(1), header(2, 2), header(4)]).ok
    assert state.check([header(1), header(3)]).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert state.entry(PID) is not None and state.entry(PID).last_seq == 0  # type: ignore[union-attr]


def test_batches_without_a_producer_id_are_not_tracked() -> None:
    state = ProducerStateManager()
    plain = parse_header(build_batch([RecordInput(b"v", None, [], T0)]))
    assert state.check([plain, plain]).ok
    state.update(plain, 0, T0)
    assert len(state) == 0


def test_an_idempotent_batch_without_a_sequence_is_invalid() -> None:
    state = ProducerStateManager()
    assert state.check([header(-1)]).error == ErrorCode.INVALID_RECORD


def test_producers_are_tracked_separately() -> None:
    state = ProducerStateManager()
    appended(state, header(0, pid=1), header(0, pid=2), header(1, pid=1))
    assert state.check([header(1, pid=2)]).ok
    assert state.check([header(0, pid=2)]).duplicate is not None


def test_idle_producers_expire() -> None:
    state = ProducerStateManager()
    appended(state, header(0, pid=1, ts=T0), header(0, pid=2, ts=T0 + 5000))
    assert state.expire(T0 + 1000 + 86_400_000) == 1
    assert state.entry(1) is None and state.entry(2) is not None


def test_a_snapshot_round_trips() -> None:
    state = ProducerStateManager()
    appended(state, *[header(i, 2, pid=7) for i in range(0, 14, 2)], header(0, pid=9, epoch=4))
    raw = state.snapshot(123)
    restored, offset = ProducerStateManager.from_snapshot(raw)
    assert offset == 123
    assert restored.entries() == state.entries()
    assert restored.check([header(12, 2, pid=7)]).duplicate is not None
    assert decode_snapshot(encode_snapshot(0, [])) == (0, [])


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b[:-1],
        lambda b: b + b"\x00",
        lambda b: b"\x00\x03" + b[2:],
        lambda b: b[:10] + bytes([b[10] ^ 1]) + b[11:],
        lambda b: b[:3],
    ],
)
def test_a_damaged_snapshot_is_refused(mangle: object) -> None:
    state = ProducerStateManager()
    appended(state, header(0))
    with pytest.raises(InvalidProducerSnapshotError):
        decode_snapshot(mangle(state.snapshot(1)))  # type: ignore[operator]


# -- persistence in the ElasticLog -----------------------------------------------------------------


async def append(log: ElasticLog, h: RecordBatchHeader, batch: bytearray) -> int:
    """Append ``batch`` at the log end, its base offset assigned as Partition does."""
    base = log.log_end_offset
    record_batch.assign_offsets(batch, base)
    await log.append(
        bytes(batch),
        base_offset=base,
        record_count=h.last_offset_delta + 1,
        max_timestamp=h.max_timestamp,
        first_timestamp=h.base_timestamp,
    )
    return base


def idempotent_batch(
    seq: int, count: int = 3, epoch: int = 0
) -> tuple[RecordBatchHeader, bytearray]:
    records = [RecordInput(b"x" * 100, None, [], T0 + seq) for _ in range(count)]
    batch = build_batch(records, producer_id=PID, producer_epoch=epoch, base_sequence=seq)
    return parse_header(batch), batch


def facts(state: ProducerStateManager) -> list[tuple[int, int, list[BatchMetadata]]]:
    """What dedup depends on: each producer's epoch and cached batches."""
    return [(e.producer_id, e.producer_epoch, list(e.batches)) for e in state.entries()]


async def fill(log: ElasticLog, first_seq: int, batches: int) -> int:
    seq = first_seq
    for _ in range(batches):
        h, batch = idempotent_batch(seq)
        await append(log, h, batch)
        seq += 3
    return seq


async def test_state_survives_a_close_and_rolls(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    try:
        log = await open_log(storage, segment_bytes=1000)
        seq = await fill(log, 0, 20)
        assert len(log.segments) > 1  # rolled, so snapshots were written on the way
        expected = facts(log.producer_state)
        await log.close()
        offset, _ = decode_snapshot(log.meta_stream.get(keys.PRODUCER_SNAPSHOTS) or b"")
        assert offset == 60

        reopened = await open_log(storage, epoch=1, segment_bytes=1000)
        assert facts(reopened.producer_state) == expected
        assert reopened.producer_state.check([idempotent_batch(seq - 3)[0]]).duplicate == (
            BatchMetadata(seq - 3, seq - 1, 57, 59, T0 + seq - 3)
        )
        assert reopened.producer_state.check([idempotent_batch(seq)[0]]).ok
        await reopened.close()
    finally:
        await storage.close()


async def test_state_is_rebuilt_after_a_crash(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    log = await open_log(storage, segment_bytes=1000)
    seq = await fill(log, 0, 20)
    expected = facts(log.producer_state)
    snapshot = log.meta_stream.get(keys.PRODUCER_SNAPSHOTS)
    assert snapshot is not None and decode_snapshot(snapshot)[0] < log.log_end_offset
    await storage.abort()  # no close: the batches after the last roll's snapshot are replayed

    storage = await start_storage(tmp_path)
    try:
        reopened = await open_log(storage, epoch=1, segment_bytes=1000)
        assert facts(reopened.producer_state) == expected
        for first in range(seq - 15, seq, 3):
            assert reopened.producer_state.check([idempotent_batch(first)[0]]).duplicate
        await reopened.close()
    finally:
        await storage.close()


async def test_state_is_rebuilt_after_a_crash_without_any_snapshot(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    log = await open_log(storage)
    await fill(log, 0, 3)
    assert log.meta_stream.get(keys.PRODUCER_SNAPSHOTS) is None
    await storage.abort()

    storage = await start_storage(tmp_path)
    try:
        reopened = await open_log(storage, epoch=1)
        assert reopened.producer_state.check([idempotent_batch(3)[0]]).duplicate == (
            BatchMetadata(3, 5, 3, 5, T0 + 3)
        )
        await reopened.close()
    finally:
        await storage.close()


async def test_a_log_without_idempotent_producers_writes_no_snapshot(tmp_path: Path) -> None:
    storage = await start_storage(tmp_path)
    try:
        log = await open_log(storage, segment_bytes=1000)
        for _ in range(20):
            base = log.log_end_offset
            batch = build_batch([RecordInput(b"x" * 100, None, [], T0)] * 3, base_offset=base)
            await log.append(
                bytes(batch), base_offset=base, record_count=3, max_timestamp=T0, first_timestamp=T0
            )
        await log.close()
        assert log.meta_stream.get(keys.PRODUCER_SNAPSHOTS) is None
    finally:
        await storage.close()


# -- transactions ---------------------------------------------------------------------------------


def txn_header(seq: int, count: int = 1, *, pid: int = PID, epoch: int = 0) -> RecordBatchHeader:
    """The header of a transactional batch."""
    records = [RecordInput(f"t{i}".encode(), None, [], T0) for i in range(count)]
    return parse_header(
        build_batch(
            records,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=True,
        )
    )


def marker_header(*, pid: int = PID, epoch: int = 0) -> RecordBatchHeader:
    """The header of a control batch (its record's bytes do not matter to the state)."""
    return parse_header(
        build_batch(
            [RecordInput(b"\x00\x00\x00\x00\x00\x00", b"\x00\x00\x00\x00", [], T0)],
            producer_id=pid,
            producer_epoch=epoch,
            is_transactional=True,
            is_control=True,
        )
    )


def test_a_transactional_batch_opens_a_transaction_that_its_marker_closes() -> None:
    state = ProducerStateManager()
    end = appended(state, header(0, 2), txn_header(2, 3), txn_header(5, 1), at=10)
    assert state.ongoing_txn_first_offset(PID) == 12
    assert state.first_unstable_offset(0) == 12
    completed = state.update(marker_header(), end, T0, marker=(False, 3))
    assert completed is not None
    assert (completed.first_offset, completed.last_offset, completed.is_aborted) == (12, 16, True)
    assert state.ongoing_txn_first_offset(PID) == -1
    # decided, but the marker is not durable until the high watermark passes it
    assert state.first_unstable_offset(16) == 12
    assert state.first_unstable_offset(17) is None
    entry = state.entry(PID)
    assert entry is not None and entry.coordinator_epoch == 3


def test_the_oldest_open_transaction_bounds_the_stable_offset() -> None:
    state = ProducerStateManager()
    at = appended(state, txn_header(0, pid=1), at=5)
    at = appended(state, txn_header(0, pid=2), at=at)
    assert state.first_unstable_offset(100) == 5
    state.update(marker_header(pid=1), at, T0, marker=(True, 0))
    assert state.first_unstable_offset(at) == 5  # marker at `at` not durable yet
    assert state.first_unstable_offset(at + 1) == 6


def test_a_marker_without_data_completes_nothing() -> None:
    state = ProducerStateManager()
    appended(state, header(0))
    assert state.update(marker_header(), 1, T0, marker=(True, 0)) is None
    assert state.first_unstable_offset(0) is None


def test_a_plain_batch_inside_a_transaction_is_invalid_txn_state() -> None:
    state = ProducerStateManager()
    appended(state, txn_header(0, 2))
    assert state.check([header(2)]).error == ErrorCode.INVALID_TXN_STATE
    # and within one request, after the batch that opens it
    fresh = ProducerStateManager()
    assert fresh.check([txn_header(0), header(1)]).error == ErrorCode.INVALID_TXN_STATE
    assert fresh.check([header(0), txn_header(1)]).ok


def test_a_verified_batch_is_refused_once_a_marker_ended_its_verification() -> None:
    """Kafka's verification guard: a Produce takes the producer's guard before asking the
    coordinator whether the partition is in the transaction. A marker that lands meanwhile
    (the transaction was aborted, say on its timeout) ends it, and the batch that would open
    a transaction nobody will close is refused INVALID_TXN_STATE; once the batch opened the
    transaction, the guard is done."""
    state = ProducerStateManager()
    appended(state, header(0))  # (known to the partition)
    guard = state.verification_guard(PID, T0)
    assert state.verification_guard(PID, T0) is guard  # concurrent Produces share it
    assert state.check([txn_header(1)], guard=guard).ok
    state.update(marker_header(), 1, T0, marker=(False, 0))
    late = state.check([txn_header(1)], guard=guard)
    assert (late.error, late.message) == (
        ErrorCode.INVALID_TXN_STATE,
        "Record was not part of an ongoing transaction",
    )
    # verified again after the marker: a new guard, which the append opening the
    # transaction ends; while the transaction is open the Produce needs none
    again = state.verification_guard(PID, T0)
    assert again is not guard and state.check([txn_header(1)], guard=again).ok
    state.update(txn_header(1), 2, T0)
    open_guard = state.verification_guard(PID, T0)
    assert open_guard is OPEN_TXN_GUARD
    assert state.check([txn_header(2)], guard=open_guard).ok
    # the transaction ended before the append: the open transaction's guard matches nothing
    state.update(marker_header(), 3, T0, marker=(True, 0))
    assert state.check([txn_header(2)], guard=open_guard).error == ErrorCode.INVALID_TXN_STATE
    # an unverified check (no guard: a coordinator's, or nothing asked) is as before
    assert state.check([txn_header(2)]).ok


def test_an_unused_verification_is_forgotten_with_idle_producers() -> None:
    state = ProducerStateManager()
    guard = state.verification_guard(PID, T0)
    state.expire(T0 + 10, max_age_ms=10)
    assert state.check([txn_header(0)], guard=guard).error == ErrorCode.INVALID_TXN_STATE


def test_clients_cannot_write_control_batches() -> None:
    assert ProducerStateManager().check([marker_header()]).error == ErrorCode.INVALID_RECORD


def test_markers_from_an_old_epoch_or_an_old_coordinator_are_fenced() -> None:
    state = ProducerStateManager()
    appended(state, txn_header(0, epoch=5))
    state.update(marker_header(epoch=5), 1, T0, marker=(True, 7))
    assert state.check_marker(PID, 4, 7).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.check_marker(PID, 5, 6).error == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert state.check_marker(PID, 6, 7).ok
    assert state.check_marker(PID + 1, 0, 0).ok  # unknown producer


def test_a_marker_with_a_bumped_epoch_restarts_the_sequence() -> None:
    state = ProducerStateManager()
    end = appended(state, txn_header(0, 3, epoch=1))
    state.update(marker_header(epoch=2), end, T0, marker=(False, 0))  # aborted on timeout
    assert state.check([txn_header(3, epoch=1)]).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.check([txn_header(0, epoch=2)]).ok


def test_a_producer_with_an_open_transaction_does_not_expire() -> None:
    state = ProducerStateManager()
    appended(state, txn_header(0))
    assert state.expire(T0 + 10 * 86_400_000) == 0
    state.update(marker_header(), 1, T0, marker=(True, 0))
    assert state.expire(T0 + 10 * 86_400_000) == 1


def test_open_transactions_survive_a_snapshot() -> None:
    state = ProducerStateManager()
    appended(state, txn_header(0, 2), at=40)
    state.update(marker_header(pid=9), 50, T0, marker=(True, 4))
    restored, _ = ProducerStateManager.from_snapshot(state.snapshot(60))
    assert restored.ongoing_txn_first_offset(PID) == 40
    assert restored.first_unstable_offset(60) == 40
    assert restored.check([header(2)]).error == ErrorCode.INVALID_TXN_STATE
    entry = restored.entry(9)
    assert entry is not None and entry.coordinator_epoch == 4


def test_a_version_1_snapshot_is_still_read() -> None:
    # version 1: no transaction fields per producer
    body = struct.pack(">qi", 77, 1) + struct.pack(">qhqb", PID, 3, T0, 1)
    body += struct.pack(">iiqqq", 0, 4, 10, 14, T0)
    raw = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    offset, entries = decode_snapshot(raw)
    assert offset == 77 and len(entries) == 1
    entry = entries[0]
    assert (entry.producer_epoch, entry.last_seq, entry.current_txn_first_offset) == (3, 4, -1)
    assert entry.coordinator_epoch == -1
