"""The transaction coordinator's decision rules, one test per Kafka 3.9 rule, and random
sequences of InitProducerId / AddPartitionsToTxn / EndTxn / timeouts from two producers of the
same transactional id that must keep the coordinator's invariants (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from automq_py.coordinator.transaction_metadata import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    OFFSETS_TOPIC,
    IllegalTransitionError,
    NeedProducerId,
    Reply,
    TransactionDescription,
    TransactionListing,
    TransactionMetadata,
    TransactionResult,
    TransactionState,
    Transition,
    WriteMarkers,
    _transition,
    abort_timed_out_transaction,
    add_offsets_to_txn,
    add_partitions_to_txn,
    as_loaded,
    complete_transaction,
    coordinator_error_for_append,
    describe_transaction,
    end_txn,
    epoch_fence_failed,
    error_for_version,
    expired_transactional_ids,
    init_producer_id,
    list_transactions,
    offset_commit_error_for_unverified,
    produce_error_for_unverified,
    timed_out_transactions,
    verification_error_for_client,
    verify_partitions_in_txn,
)
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode

S = TransactionState
E = ErrorCode
TID = "txn-1"
PID = 1000
TIMEOUT = 60_000
NOW = 1_700_000_000_000
TP0 = ("orders", 0)
TP1 = ("orders", 1)
TP2 = ("payments", 0)
COMMIT = TransactionResult.COMMIT
ABORT = TransactionResult.ABORT


def meta(
    state: TransactionState = S.EMPTY,
    *,
    producer_id: int = PID,
    epoch: int = 5,
    last_producer_id: int = PID,
    last_epoch: int = NO_PRODUCER_EPOCH,
    partitions: frozenset[tuple[str, int]] | None = None,
    start: int | None = None,
    last_update: int = NOW - 1000,
    timeout: int = TIMEOUT,
) -> TransactionMetadata:
    """A transaction in ``state``: Ongoing and Prepare* hold TP0 and started at NOW - 5000,
    Complete* started then too, Empty has no start."""
    open_or_closed = state is not S.EMPTY
    if partitions is None:
        partitions = frozenset({TP0}) if state in (S.ONGOING, *PREPARE) else frozenset()
    if start is None:
        start = NOW - 5000 if open_or_closed else -1
    return TransactionMetadata(
        transactional_id=TID,
        producer_id=producer_id,
        last_producer_id=last_producer_id,
        producer_epoch=epoch,
        last_producer_epoch=last_epoch,
        txn_timeout_ms=timeout,
        state=state,
        partitions=partitions,
        txn_start_timestamp_ms=start,
        txn_last_update_timestamp_ms=last_update,
    )


PREPARE = (S.PREPARE_COMMIT, S.PREPARE_ABORT)
COMPLETE = (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
IDLE = (S.EMPTY, *COMPLETE)


def init(current: TransactionMetadata | None, **kw: Any) -> Reply | NeedProducerId | Transition:
    args: dict[str, Any] = {"txn_timeout_ms": TIMEOUT, "now_ms": NOW, **kw}
    return init_producer_id(current, TID, **args)


def written(decision: Reply | NeedProducerId | Transition) -> TransactionMetadata:
    assert isinstance(decision, Transition), decision
    return decision.metadata


# -- TransactionState ------------------------------------------------------------------------


def test_state_ids_are_kafkas_transaction_status_bytes() -> None:
    assert {s.name: int(s) for s in S} == {
        "EMPTY": 0,
        "ONGOING": 1,
        "PREPARE_COMMIT": 2,
        "PREPARE_ABORT": 3,
        "COMPLETE_COMMIT": 4,
        "COMPLETE_ABORT": 5,
        "DEAD": 6,
        "PREPARE_EPOCH_FENCE": 7,
    }


def test_state_names_are_what_describe_and_list_transactions_report() -> None:
    names = [s.kafka_name for s in S]
    assert names == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ]
    assert all(S.from_kafka_name(n) is s for n, s in zip(names, S, strict=True))
    assert S.from_kafka_name("ONGOING") is None
    assert S.from_kafka_name("ongoing") is None


# Kafka 3.9's TransactionMetadata.scala, written out again so that a change to the table in the
# module is caught here
KAFKA_VALID_PREVIOUS_STATES = {
    S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
    S.PREPARE_COMMIT: {S.ONGOING},
    S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE},
    S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
    S.COMPLETE_ABORT: {S.PREPARE_ABORT},
    S.DEAD: {S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT},
    S.PREPARE_EPOCH_FENCE: {S.ONGOING},
}


def test_valid_previous_states_are_kafkas() -> None:
    assert {s: set(s.valid_previous_states) for s in S} == KAFKA_VALID_PREVIOUS_STATES


@pytest.mark.parametrize("target", list(S))
@pytest.mark.parametrize("source", list(S))
def test_a_transition_is_refused_unless_from_a_valid_previous_state(
    source: TransactionState, target: TransactionState
) -> None:
    current = meta(source)
    if source in KAFKA_VALID_PREVIOUS_STATES[target]:
        moved = _transition(current, target, producer_epoch=6)
        assert (moved.state, moved.producer_epoch, moved.last_producer_id) == (target, 6, PID)
    else:
        with pytest.raises(IllegalTransitionError):
            _transition(current, target)


def test_a_transition_to_a_negative_producer_id_or_epoch_is_refused() -> None:
    with pytest.raises(IllegalTransitionError):
        _transition(meta(S.EMPTY), S.EMPTY, producer_id=-1)
    with pytest.raises(IllegalTransitionError):
        _transition(meta(S.EMPTY, epoch=-1), S.EMPTY)
    # Dead keeps whatever epoch the id had, even none
    assert _transition(meta(S.EMPTY, epoch=-1), S.DEAD).producer_epoch == -1


def test_only_ids_without_an_open_transaction_may_expire() -> None:
    assert {s for s in S if s.is_expiration_allowed} == {S.EMPTY, *COMPLETE}


def test_max_producer_epoch_is_kafkas() -> None:
    assert MAX_PRODUCER_EPOCH == 32767


# -- InitProducerId --------------------------------------------------------------------------


def test_init_unknown_id_needs_a_new_producer_id_then_starts_at_epoch_0() -> None:
    assert init(None) == NeedProducerId()
    m = written(init(None, new_producer_id=PID))
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 0, -1)
    assert m.last_producer_id == PID
    assert (m.state, m.partitions, m.txn_start_timestamp_ms) == (S.EMPTY, frozenset(), -1)
    assert (m.txn_timeout_ms, m.txn_last_update_timestamp_ms) == (TIMEOUT, NOW)


def test_init_unknown_id_takes_any_expected_producer_recovering_from_unknown_producer_id() -> None:
    d = init(None, expected_producer_id=77, expected_producer_epoch=3, new_producer_id=PID)
    assert (written(d).producer_id, written(d).producer_epoch) == (PID, 0)


@pytest.mark.parametrize("state", IDLE)
def test_init_without_expected_epoch_bumps_and_forgets_the_last_epoch(
    state: TransactionState,
) -> None:
    d = init(meta(state, epoch=5, last_epoch=4), txn_timeout_ms=30_000, now_ms=NOW + 1)
    m = written(d)
    assert isinstance(d, Transition) and d.reply is E.NONE and not d.complete
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 6, -1)
    assert (m.state, m.partitions, m.txn_start_timestamp_ms) == (S.EMPTY, frozenset(), -1)
    assert (m.txn_timeout_ms, m.txn_last_update_timestamp_ms) == (30_000, NOW + 1)


def test_init_with_the_current_epoch_bumps_and_remembers_it_for_a_retry() -> None:
    d = init(meta(S.COMPLETE_COMMIT, epoch=5), expected_producer_id=PID, expected_producer_epoch=5)
    assert (written(d).producer_epoch, written(d).last_producer_epoch) == (6, 5)


def test_init_retry_with_the_last_epoch_answers_the_same_epoch_without_a_bump() -> None:
    current = meta(S.EMPTY, epoch=6, last_epoch=5)
    d = init(current, expected_producer_id=PID, expected_producer_epoch=5)
    assert (written(d).producer_epoch, written(d).last_producer_epoch) == (6, 5)


def test_init_with_an_older_epoch_is_producer_fenced() -> None:
    current = meta(S.EMPTY, epoch=6, last_epoch=NO_PRODUCER_EPOCH)
    assert init(current, expected_producer_id=PID, expected_producer_epoch=5) == Reply(
        E.PRODUCER_FENCED
    )


def test_init_with_another_producer_id_is_producer_fenced() -> None:
    d = init(meta(S.EMPTY), expected_producer_id=PID + 1, expected_producer_epoch=5)
    assert d == Reply(E.PRODUCER_FENCED)


@pytest.mark.parametrize("expected", [True, False])
def test_init_with_an_exhausted_epoch_rotates_the_producer_id(expected: bool) -> None:
    exhausted = MAX_PRODUCER_EPOCH - 1
    current = meta(S.COMPLETE_ABORT, epoch=exhausted)
    kw: dict[str, Any] = (
        {"expected_producer_id": PID, "expected_producer_epoch": exhausted} if expected else {}
    )
    assert init(current, **kw) == NeedProducerId()
    m = written(init(current, new_producer_id=PID + 1, **kw))
    assert (m.producer_id, m.producer_epoch, m.last_producer_id) == (PID + 1, 0, PID)
    # only a KIP-360 producer can retry the rotation, so only its old epoch is remembered
    assert m.last_producer_epoch == (exhausted if expected else NO_PRODUCER_EPOCH)


def test_init_epoch_one_below_exhaustion_is_still_bumped() -> None:
    m = written(init(meta(S.EMPTY, epoch=MAX_PRODUCER_EPOCH - 2)))
    assert (m.producer_id, m.producer_epoch) == (PID, MAX_PRODUCER_EPOCH - 1)


def test_init_retry_of_a_rotation_with_the_old_producer_id_gets_the_new_one() -> None:
    exhausted = MAX_PRODUCER_EPOCH - 1
    rotated = written(
        init(
            meta(S.COMPLETE_COMMIT, epoch=exhausted),
            expected_producer_id=PID,
            expected_producer_epoch=exhausted,
            new_producer_id=PID + 1,
        )
    )
    retry = init(rotated, expected_producer_id=PID, expected_producer_epoch=exhausted)
    assert (written(retry).producer_id, written(retry).producer_epoch) == (PID + 1, 0)


def test_init_with_the_old_producer_id_and_an_epoch_not_exhausted_is_producer_fenced() -> None:
    rotated = meta(S.EMPTY, producer_id=PID + 1, epoch=0, last_producer_id=PID, last_epoch=-1)
    d = init(rotated, expected_producer_id=PID, expected_producer_epoch=MAX_PRODUCER_EPOCH - 2)
    assert d == Reply(E.PRODUCER_FENCED)


def test_init_exhausted_epoch_with_another_expected_epoch_is_kafkas_unknown_server_error() -> None:
    # after a fence to Short.MaxValue the old producer's epoch differs: Kafka's
    # prepareIncrementProducerEpoch throws IllegalStateException
    current = meta(S.COMPLETE_ABORT, epoch=MAX_PRODUCER_EPOCH, last_epoch=-1)
    d = init(current, expected_producer_id=PID, expected_producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert d == Reply(E.UNKNOWN_SERVER_ERROR)


def test_init_with_an_ongoing_transaction_fences_aborts_and_answers_concurrent() -> None:
    current = meta(S.ONGOING, epoch=5, last_epoch=4, partitions=frozenset({TP0, TP1}))
    d = init(current, now_ms=NOW + 7)
    assert isinstance(d, Transition)
    assert (d.reply, d.complete, d.epoch_fence) == (E.CONCURRENT_TRANSACTIONS, True, True)
    m = d.metadata
    assert (m.state, m.producer_id, m.producer_epoch, m.last_producer_epoch) == (
        S.PREPARE_ABORT,
        PID,
        6,
        NO_PRODUCER_EPOCH,
    )
    assert m.partitions == frozenset({TP0, TP1})
    assert (m.txn_start_timestamp_ms, m.txn_last_update_timestamp_ms) == (NOW - 5000, NOW + 7)
    markers = complete_transaction(m, NOW + 8)
    assert markers == WriteMarkers(ABORT, PID, 6, frozenset({TP0, TP1}), markers.then)
    # the retry then bumps the epoch a second time
    retried = init(markers.then, now_ms=NOW + 9)
    assert (written(retried).state, written(retried).producer_epoch) == (S.EMPTY, 7)


def test_init_after_a_failed_fence_does_not_bump_the_epoch_again() -> None:
    current = meta(S.ONGOING, epoch=5)
    attempt = init(current)
    assert isinstance(attempt, Transition)
    in_memory = epoch_fence_failed(current, attempt)
    assert (in_memory.state, in_memory.producer_epoch, in_memory.last_producer_epoch) == (
        S.ONGOING,
        6,
        -1,
    )
    again = init(in_memory, has_failed_epoch_fence=True)
    assert written(again).producer_epoch == 6


def test_epoch_fence_failed_is_only_for_fences() -> None:
    plain = init(meta(S.EMPTY))
    assert isinstance(plain, Transition)
    with pytest.raises(ValueError):
        epoch_fence_failed(meta(S.EMPTY), plain)


def test_init_fence_at_short_max_value_is_kafkas_unknown_server_error() -> None:
    current = meta(S.ONGOING, epoch=MAX_PRODUCER_EPOCH)
    assert init(current, has_failed_epoch_fence=True) == Reply(E.UNKNOWN_SERVER_ERROR)


def test_init_fence_may_reach_short_max_value() -> None:
    m = written(init(meta(S.ONGOING, epoch=MAX_PRODUCER_EPOCH - 1)))
    assert m.producer_epoch == MAX_PRODUCER_EPOCH


@pytest.mark.parametrize("state", PREPARE)
def test_init_while_the_transaction_completes_is_concurrent_transactions(
    state: TransactionState,
) -> None:
    assert init(meta(state)) == Reply(E.CONCURRENT_TRANSACTIONS)


@pytest.mark.parametrize("current", [None, meta(S.EMPTY), meta(S.ONGOING)])
def test_init_while_a_write_is_pending_is_concurrent_transactions(
    current: TransactionMetadata | None,
) -> None:
    assert init(current, pending=S.EMPTY) == Reply(E.CONCURRENT_TRANSACTIONS)


def test_init_pending_comes_before_producer_fenced() -> None:
    d = init(meta(S.EMPTY), pending=S.ONGOING, expected_producer_id=9, expected_producer_epoch=1)
    assert d == Reply(E.CONCURRENT_TRANSACTIONS)


def test_init_producer_fenced_comes_before_concurrent_for_a_completing_transaction() -> None:
    d = init(meta(S.PREPARE_COMMIT), expected_producer_id=9, expected_producer_epoch=1)
    assert d == Reply(E.PRODUCER_FENCED)


@pytest.mark.parametrize("timeout", [0, -1, 900_001])
def test_init_timeout_outside_1_to_max_is_invalid_transaction_timeout(timeout: int) -> None:
    assert init(meta(S.EMPTY), txn_timeout_ms=timeout) == Reply(E.INVALID_TRANSACTION_TIMEOUT)
    assert init(None, txn_timeout_ms=timeout) == Reply(E.INVALID_TRANSACTION_TIMEOUT)


def test_init_timeout_limit_is_transaction_max_timeout_ms() -> None:
    assert init(None, txn_timeout_ms=900_000) == NeedProducerId()
    assert init(None, txn_timeout_ms=10, max_txn_timeout_ms=9) == Reply(
        E.INVALID_TRANSACTION_TIMEOUT
    )


def test_init_empty_transactional_id_is_invalid_request() -> None:
    assert init_producer_id(None, "", TIMEOUT, NOW) == Reply(E.INVALID_REQUEST)


@pytest.mark.parametrize(("pid", "epoch"), [(-1, 3), (PID, -1)])
def test_init_expected_producer_id_without_epoch_is_invalid_request(pid: int, epoch: int) -> None:
    d = init(meta(S.EMPTY), expected_producer_id=pid, expected_producer_epoch=epoch)
    assert d == Reply(E.INVALID_REQUEST)


@pytest.mark.parametrize("state", [S.DEAD, S.PREPARE_EPOCH_FENCE])
def test_a_state_no_record_is_ever_in_is_a_bug(state: TransactionState) -> None:
    with pytest.raises(IllegalTransitionError):
        init(meta(state))


# -- AddPartitionsToTxn / AddOffsetsToTxn / verify_only --------------------------------------


def add(
    current: TransactionMetadata | None, *tps: tuple[str, int], **kw: Any
) -> Reply | Transition:
    args: dict[str, Any] = {"producer_id": PID, "producer_epoch": 5, "now_ms": NOW, **kw}
    return add_partitions_to_txn(current, TID, partitions=tps, **args)


@pytest.mark.parametrize("state", IDLE)
def test_add_partitions_opens_a_transaction_and_starts_its_clock(state: TransactionState) -> None:
    m = written(add(meta(state), TP0, TP1))
    assert (m.state, m.partitions) == (S.ONGOING, frozenset({TP0, TP1}))
    assert (m.txn_start_timestamp_ms, m.txn_last_update_timestamp_ms) == (NOW, NOW)
    assert (m.producer_id, m.producer_epoch) == (PID, 5)


def test_add_partitions_to_an_ongoing_transaction_keeps_its_start() -> None:
    m = written(add(meta(S.ONGOING), TP1))
    assert m.partitions == frozenset({TP0, TP1})
    assert (m.txn_start_timestamp_ms, m.txn_last_update_timestamp_ms) == (NOW - 5000, NOW)


def test_add_partitions_already_in_the_transaction_answers_at_once() -> None:
    assert add(meta(S.ONGOING), TP0) == Reply(E.NONE)


def test_add_no_partition_to_an_idle_id_still_opens_the_transaction() -> None:
    m = written(add(meta(S.EMPTY)))
    assert (m.state, m.partitions) == (S.ONGOING, frozenset())


@pytest.mark.parametrize(
    ("current", "producer_id"), [(None, PID), (meta(S.ONGOING), PID + 1), (meta(S.EMPTY), 0)]
)
def test_add_partitions_for_an_unknown_producer_id_is_invalid_producer_id_mapping(
    current: TransactionMetadata | None, producer_id: int
) -> None:
    assert add(current, TP0, producer_id=producer_id) == Reply(E.INVALID_PRODUCER_ID_MAPPING)


@pytest.mark.parametrize("epoch", [4, 6])
def test_add_partitions_with_another_epoch_is_producer_fenced(epoch: int) -> None:
    assert add(meta(S.ONGOING, epoch=5), TP1, producer_epoch=epoch) == Reply(E.PRODUCER_FENCED)


@pytest.mark.parametrize("state", PREPARE)
def test_add_partitions_while_the_transaction_completes_is_concurrent(
    state: TransactionState,
) -> None:
    assert add(meta(state), TP1) == Reply(E.CONCURRENT_TRANSACTIONS)


def test_add_partitions_while_a_write_is_pending_is_concurrent_transactions() -> None:
    assert add(meta(S.ONGOING), TP0, pending=S.ONGOING) == Reply(E.CONCURRENT_TRANSACTIONS)


def test_add_partitions_fencing_comes_before_pending() -> None:
    d = add(meta(S.ONGOING), TP0, producer_epoch=4, pending=S.ONGOING)
    assert d == Reply(E.PRODUCER_FENCED)


def test_add_partitions_empty_transactional_id_is_invalid_request() -> None:
    d = add_partitions_to_txn(meta(S.EMPTY), "", PID, 5, [TP0], NOW)
    assert d == Reply(E.INVALID_REQUEST)


def test_add_offsets_adds_the_groups_consumer_offsets_partition() -> None:
    m = written(add_offsets_to_txn(meta(S.ONGOING), TID, PID, 5, 17, NOW))
    assert m.partitions == frozenset({TP0, (OFFSETS_TOPIC, 17)})
    assert OFFSETS_TOPIC == "__consumer_offsets"
    assert add_offsets_to_txn(meta(S.ONGOING), TID, PID, 4, 17, NOW) == Reply(E.PRODUCER_FENCED)


def test_verify_only_reports_each_partition_without_changing_anything() -> None:
    current = meta(S.ONGOING, partitions=frozenset({TP0}))
    assert verify_partitions_in_txn(current, TID, PID, 5, [TP0, TP1]) == {
        TP0: E.NONE,
        TP1: E.TRANSACTION_ABORTABLE,
    }
    # a pending write is not looked at: the partitions are those already durable
    assert verify_partitions_in_txn(current, TID, PID, 5, [TP0]) == {TP0: E.NONE}


@pytest.mark.parametrize(
    ("current", "pid", "epoch", "error"),
    [
        (None, PID, 5, E.INVALID_PRODUCER_ID_MAPPING),
        (meta(S.ONGOING), PID + 1, 5, E.INVALID_PRODUCER_ID_MAPPING),
        (meta(S.ONGOING), PID, 4, E.PRODUCER_FENCED),
        (meta(S.PREPARE_COMMIT), PID, 5, E.CONCURRENT_TRANSACTIONS),
        (meta(S.PREPARE_ABORT), PID, 5, E.CONCURRENT_TRANSACTIONS),
        (meta(S.COMPLETE_COMMIT), PID, 5, E.TRANSACTION_ABORTABLE),
        (meta(S.EMPTY), PID, 5, E.TRANSACTION_ABORTABLE),
    ],
)
def test_verify_only_refusals_apply_to_every_partition(
    current: TransactionMetadata | None, pid: int, epoch: int, error: ErrorCode
) -> None:
    assert verify_partitions_in_txn(current, TID, pid, epoch, [TP0, TP2]) == {
        TP0: error,
        TP2: error,
    }


def test_verify_only_empty_transactional_id_is_invalid_request() -> None:
    assert verify_partitions_in_txn(None, "", PID, 5, [TP0]) == {TP0: E.INVALID_REQUEST}


# -- EndTxn and completion -------------------------------------------------------------------


def end(
    current: TransactionMetadata | None, result: TransactionResult, **kw: Any
) -> Reply | Transition:
    args: dict[str, Any] = {"producer_id": PID, "producer_epoch": 5, "now_ms": NOW, **kw}
    return end_txn(current, TID, result=result, **args)


@pytest.mark.parametrize(
    ("result", "prepared", "completed"),
    [(COMMIT, S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (ABORT, S.PREPARE_ABORT, S.COMPLETE_ABORT)],
)
def test_end_txn_prepares_then_writes_markers_then_completes(
    result: TransactionResult, prepared: TransactionState, completed: TransactionState
) -> None:
    current = meta(S.ONGOING, partitions=frozenset({TP0, TP2}), last_epoch=4)
    d = end(current, result, now_ms=NOW + 1)
    assert isinstance(d, Transition) and (d.reply, d.complete, d.epoch_fence) == (
        E.NONE,
        True,
        False,
    )
    p = d.metadata
    assert p == replace(current, state=prepared, txn_last_update_timestamp_ms=NOW + 1)
    markers = complete_transaction(p, NOW + 2)
    assert (markers.result, markers.producer_id, markers.producer_epoch) == (result, PID, 5)
    assert markers.partitions == frozenset({TP0, TP2})
    assert markers.then == replace(
        p, state=completed, partitions=frozenset(), txn_last_update_timestamp_ms=NOW + 2
    )


# Kafka's endTransaction for a client of protocol v1, every state x result
END_TXN_ANSWERS = {
    (S.COMPLETE_COMMIT, COMMIT): E.NONE,
    (S.COMPLETE_COMMIT, ABORT): E.INVALID_TXN_STATE,
    (S.COMPLETE_ABORT, ABORT): E.NONE,
    (S.COMPLETE_ABORT, COMMIT): E.INVALID_TXN_STATE,
    (S.PREPARE_COMMIT, COMMIT): E.CONCURRENT_TRANSACTIONS,
    (S.PREPARE_COMMIT, ABORT): E.INVALID_TXN_STATE,
    (S.PREPARE_ABORT, ABORT): E.CONCURRENT_TRANSACTIONS,
    (S.PREPARE_ABORT, COMMIT): E.INVALID_TXN_STATE,
    (S.EMPTY, COMMIT): E.INVALID_TXN_STATE,
    (S.EMPTY, ABORT): E.INVALID_TXN_STATE,
}


@pytest.mark.parametrize(("state", "result"), sorted(END_TXN_ANSWERS))
def test_end_txn_retry_or_wrong_state_answers(
    state: TransactionState, result: TransactionResult
) -> None:
    assert end(meta(state), result) == Reply(END_TXN_ANSWERS[(state, result)])


def test_end_txn_for_another_producer_id_is_invalid_producer_id_mapping() -> None:
    assert end(None, COMMIT) == Reply(E.INVALID_PRODUCER_ID_MAPPING)
    assert end(meta(S.ONGOING), COMMIT, producer_id=PID + 1) == Reply(E.INVALID_PRODUCER_ID_MAPPING)


@pytest.mark.parametrize("state", [S.ONGOING, *COMPLETE])
@pytest.mark.parametrize("epoch", [4, 6])
def test_end_txn_with_another_epoch_is_producer_fenced(state: TransactionState, epoch: int) -> None:
    # also for a retry: a client at another epoch never learns the transaction's outcome
    assert end(meta(state, epoch=5), COMMIT, producer_epoch=epoch) == Reply(E.PRODUCER_FENCED)


def test_end_txn_while_a_write_is_pending_is_concurrent_transactions() -> None:
    assert end(meta(S.ONGOING), ABORT, pending=S.ONGOING) == Reply(E.CONCURRENT_TRANSACTIONS)


def test_end_txn_empty_transactional_id_is_invalid_request() -> None:
    assert end_txn(meta(S.ONGOING), "", PID, 5, COMMIT, NOW) == Reply(E.INVALID_REQUEST)


@pytest.mark.parametrize("state", [S.EMPTY, S.ONGOING, *COMPLETE])
def test_only_a_prepared_transaction_completes(state: TransactionState) -> None:
    with pytest.raises(IllegalTransitionError):
        complete_transaction(meta(state), NOW)


# -- timeouts, expiration, reload ------------------------------------------------------------


def test_a_transaction_times_out_once_open_longer_than_its_timeout() -> None:
    started = NOW - TIMEOUT
    ongoing = meta(S.ONGOING, start=started)
    assert timed_out_transactions([ongoing], started + TIMEOUT) == []
    assert timed_out_transactions([ongoing], started + TIMEOUT + 1) == [ongoing]
    old = NOW - 10 * TIMEOUT
    idle = [meta(s, start=old, last_update=old) for s in (*IDLE, *PREPARE)]
    assert timed_out_transactions(idle, NOW) == []
    pending = {TID: S.PREPARE_COMMIT}
    assert timed_out_transactions([ongoing], NOW + TIMEOUT, pending=pending) == []


def test_a_timed_out_transaction_is_aborted_with_a_bumped_epoch_that_fences_its_producer() -> None:
    ongoing = meta(S.ONGOING, epoch=5, last_epoch=4)
    d = abort_timed_out_transaction(ongoing, PID, NOW)
    assert d is not None and (d.complete, d.epoch_fence) == (True, True)
    assert (d.metadata.state, d.metadata.producer_epoch, d.metadata.last_producer_epoch) == (
        S.PREPARE_ABORT,
        6,
        -1,
    )
    aborted = complete_transaction(d.metadata, NOW).then
    assert end(aborted, COMMIT) == Reply(E.PRODUCER_FENCED)
    assert add(aborted, TP0) == Reply(E.PRODUCER_FENCED)
    assert init(aborted, expected_producer_id=PID, expected_producer_epoch=5) == Reply(
        E.PRODUCER_FENCED
    )


def test_a_timed_out_abort_is_skipped_when_the_id_moved_on() -> None:
    ongoing = meta(S.ONGOING)
    assert abort_timed_out_transaction(ongoing, PID + 1, NOW) is None
    assert abort_timed_out_transaction(ongoing, PID, NOW, pending=S.ONGOING) is None
    assert abort_timed_out_transaction(meta(S.PREPARE_COMMIT), PID, NOW) is None
    assert abort_timed_out_transaction(None, PID, NOW) is None


def test_a_timed_out_abort_after_a_failed_fence_keeps_the_epoch() -> None:
    d = abort_timed_out_transaction(meta(S.ONGOING, epoch=6), PID, NOW, has_failed_epoch_fence=True)
    assert d is not None and d.metadata.producer_epoch == 6


def test_idle_transactional_ids_expire_after_transactional_id_expiration_ms() -> None:
    expiry = 1000
    due = NOW - expiry
    ids = [replace(meta(s, last_update=due), transactional_id=s.kafka_name) for s in S]
    assert expired_transactional_ids(ids, NOW, expiration_ms=expiry) == [
        "Empty",
        "CompleteCommit",
        "CompleteAbort",
    ]
    assert expired_transactional_ids(ids, NOW - 1, expiration_ms=expiry) == []
    assert expired_transactional_ids(ids, NOW, expiration_ms=expiry, pending={"Empty": S.DEAD}) == [
        "CompleteCommit",
        "CompleteAbort",
    ]


def test_a_reloaded_record_has_no_last_producer_id_or_epoch() -> None:
    loaded = as_loaded(meta(S.COMPLETE_ABORT, last_producer_id=PID - 1, last_epoch=4))
    assert (loaded.last_producer_id, loaded.last_producer_epoch) == (NO_PRODUCER_ID, -1)
    # which turns a KIP-360 retry after a coordinator move into PRODUCER_FENCED
    empty = meta(S.EMPTY, epoch=6, last_epoch=5)
    assert written(init(empty, expected_producer_id=PID, expected_producer_epoch=5))
    assert init(as_loaded(empty), expected_producer_id=PID, expected_producer_epoch=5) == Reply(
        E.PRODUCER_FENCED
    )


# -- DescribeTransactions / ListTransactions -------------------------------------------------


def test_describe_reports_the_transaction_with_its_kafka_state_name() -> None:
    current = meta(S.ONGOING, partitions=frozenset({TP1, TP2, TP0}))
    assert describe_transaction(current, TID) == TransactionDescription(
        transactional_id=TID,
        producer_id=PID,
        producer_epoch=5,
        state="Ongoing",
        txn_timeout_ms=TIMEOUT,
        txn_start_timestamp_ms=NOW - 5000,
        topics=(("orders", (0, 1)), ("payments", (0,))),
    )


def test_describe_unknown_dead_or_empty_id() -> None:
    assert describe_transaction(None, TID) is E.TRANSACTIONAL_ID_NOT_FOUND
    assert describe_transaction(meta(S.DEAD), TID) is E.TRANSACTIONAL_ID_NOT_FOUND
    assert describe_transaction(meta(S.EMPTY), "") is E.INVALID_REQUEST


def listed(*ms: TransactionMetadata, **kw: Any) -> tuple[list[str], list[str]]:
    rows, unknown = list_transactions(ms, **kw)
    return [r.transactional_id for r in rows], unknown


def test_list_filters_by_state_names_and_producer_ids() -> None:
    a = replace(meta(S.ONGOING, producer_id=1), transactional_id="a")
    b = replace(meta(S.EMPTY, producer_id=2), transactional_id="b")
    c = replace(meta(S.COMPLETE_COMMIT, producer_id=3), transactional_id="c")
    assert list_transactions([a], state_filters=[]) == ([TransactionListing("a", 1, "Ongoing")], [])
    assert listed(a, b, c) == (["a", "b", "c"], [])
    assert listed(a, b, c, state_filters=["Ongoing", "CompleteCommit"]) == (["a", "c"], [])
    assert listed(a, b, c, producer_id_filters=[2, 3]) == (["b", "c"], [])
    assert listed(a, b, c, state_filters=["Empty"], producer_id_filters=[1, 2]) == (["b"], [])


def test_list_never_shows_dead_ids() -> None:
    assert listed(meta(S.DEAD), state_filters=["Dead"]) == ([], [])


def test_list_reports_unknown_state_filters_and_they_match_nothing() -> None:
    a = meta(S.ONGOING)
    assert listed(a, state_filters=["ongoing"]) == ([], ["ongoing"])
    assert listed(a, state_filters=["Ongoing", "Nope"]) == ([TID], ["Nope"])


# -- error codes by version ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "first_with_producer_fenced"),
    [
        (ApiKey.INIT_PRODUCER_ID, 4),
        (ApiKey.ADD_PARTITIONS_TO_TXN, 2),
        (ApiKey.ADD_OFFSETS_TO_TXN, 2),
        (ApiKey.END_TXN, 2),
    ],
)
def test_old_clients_get_invalid_producer_epoch_for_producer_fenced(
    api: ApiKey, first_with_producer_fenced: int
) -> None:
    for version in range(first_with_producer_fenced):
        assert error_for_version(api, version, E.PRODUCER_FENCED) is E.INVALID_PRODUCER_EPOCH
    for version in range(first_with_producer_fenced, first_with_producer_fenced + 3):
        assert error_for_version(api, version, E.PRODUCER_FENCED) is E.PRODUCER_FENCED
    assert error_for_version(api, 0, E.CONCURRENT_TRANSACTIONS) is E.CONCURRENT_TRANSACTIONS


def test_verification_errors_are_mapped_for_the_partition_leaders_client() -> None:
    f = verification_error_for_client
    assert f(ApiKey.PRODUCE, 11, E.PRODUCER_FENCED) is E.INVALID_PRODUCER_EPOCH
    assert f(ApiKey.PRODUCE, 10, E.TRANSACTION_ABORTABLE) is E.INVALID_TXN_STATE
    assert f(ApiKey.PRODUCE, 11, E.TRANSACTION_ABORTABLE) is E.TRANSACTION_ABORTABLE
    assert f(ApiKey.TXN_OFFSET_COMMIT, 3, E.TRANSACTION_ABORTABLE) is E.INVALID_TXN_STATE
    assert f(ApiKey.TXN_OFFSET_COMMIT, 4, E.TRANSACTION_ABORTABLE) is E.TRANSACTION_ABORTABLE
    assert f(ApiKey.PRODUCE, 3, E.CONCURRENT_TRANSACTIONS) is E.CONCURRENT_TRANSACTIONS


def test_a_produce_answers_the_coordinators_retriable_errors_as_not_enough_replicas() -> None:
    """Kafka's ReplicaManager: a client that predates the verification retries
    NOT_ENOUGH_REPLICAS on a Produce, where it might give up on a coordinator's error."""
    f = produce_error_for_unverified
    for error in (
        E.NETWORK_EXCEPTION,
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.COORDINATOR_NOT_AVAILABLE,
        E.NOT_COORDINATOR,
    ):
        for version in (3, 9, 11, 12):
            code, message = f(version, error)
            assert code is E.NOT_ENOUGH_REPLICAS
            assert message == (
                "Unable to verify the partition has been added to the transaction. "
                f"Underlying error: {error.name}"
            )
    assert f(11, E.CONCURRENT_TRANSACTIONS)[0] is E.NOT_ENOUGH_REPLICAS
    assert f(12, E.CONCURRENT_TRANSACTIONS) == (E.CONCURRENT_TRANSACTIONS, None)
    not_added = "Partition was not added to the transaction"
    assert f(10, E.TRANSACTION_ABORTABLE) == (E.INVALID_TXN_STATE, not_added)
    assert f(11, E.TRANSACTION_ABORTABLE) == (E.TRANSACTION_ABORTABLE, None)
    assert f(11, E.PRODUCER_FENCED) == (E.INVALID_PRODUCER_EPOCH, None)
    assert f(11, E.INVALID_PRODUCER_ID_MAPPING) == (E.INVALID_PRODUCER_ID_MAPPING, None)


def test_an_unverified_offsets_partition_answers_as_kafka_39s_group_coordinator() -> None:
    f = offset_commit_error_for_unverified
    assert f(3, E.TRANSACTION_ABORTABLE) is E.INVALID_TXN_STATE
    assert f(4, E.TRANSACTION_ABORTABLE) is E.TRANSACTION_ABORTABLE
    assert f(4, E.PRODUCER_FENCED) is E.INVALID_PRODUCER_EPOCH
    assert f(4, E.NETWORK_EXCEPTION) is E.COORDINATOR_LOAD_IN_PROGRESS
    assert f(4, E.NOT_ENOUGH_REPLICAS) is E.COORDINATOR_NOT_AVAILABLE
    assert f(4, E.NOT_LEADER_OR_FOLLOWER) is E.NOT_COORDINATOR
    assert f(4, E.MESSAGE_TOO_LARGE) is E.INVALID_COMMIT_OFFSET_SIZE
    for kept in (E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR, E.CONCURRENT_TRANSACTIONS):
        assert f(4, kept) is kept


def test_a_refused_log_append_becomes_a_coordinator_error() -> None:
    f = coordinator_error_for_append
    for e in (
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.NOT_ENOUGH_REPLICAS,
        E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        E.REQUEST_TIMED_OUT,
    ):
        assert f(e) is E.COORDINATOR_NOT_AVAILABLE
    assert f(E.NOT_LEADER_OR_FOLLOWER) is E.NOT_COORDINATOR
    assert f(E.KAFKA_STORAGE_ERROR) is E.NOT_COORDINATOR
    assert f(E.MESSAGE_TOO_LARGE) is E.UNKNOWN_SERVER_ERROR
    assert f(E.RECORD_LIST_TOO_LARGE) is E.UNKNOWN_SERVER_ERROR
    assert f(E.CORRUPT_MESSAGE) is E.CORRUPT_MESSAGE


# -- random sequences from two producers of one transactional id -----------------------------

CLIENTS = (0, 1)
TOPIC_PARTITIONS = (TP0, TP1, TP2)
OUTCOMES = ("durable",) * 5 + ("refused", "unknown, durable", "unknown, lost")
# how a request's log append returns: mostly at once, sometimes later (another request meets it)
APPENDS = st.sampled_from((*OUTCOMES, "later", "later"))
PICKS = st.integers(0, 2 * len(CLIENTS))  # see producer_of


class TwoProducersOneTransactionalId(RuleBasedStateMachine):
    """Plays the I/O layer of the module's protocol (one write in flight at a time, markers,
    refused and ambiguous log appends, reloads) for two producers sharing ``TID``, and checks
    after every step:

    * the epochs of a producer id never go down (every durable record, every epoch handed out);
    * an InitProducerId never hands the same (id, epoch) to both producers;
    * AddPartitionsToTxn / EndTxn / verify_only never accept a fenced producer: NONE (or a
      write) only for the coordinator's current id and epoch;
    * a transaction is decided (commit or abort) at most once, and completes as decided;
    * every durable record follows Kafka's valid previous states, and every applied one
      Kafka's ``completeTransitionTo`` checks;
    * Empty and Complete* hold no partitions.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW
        self.current: TransactionMetadata | None = None  # the coordinator's memory
        self.persisted: TransactionMetadata | None = None  # the last durable record
        self.pending: TransactionState | None = None
        self.in_flight: Transition | WriteMarkers | None = None
        # who waits for the write in flight, for which request, sent with which (id, epoch)
        self.waiting: tuple[int | None, str, tuple[int, int]] = (None, "", (-1, -1))
        self.failed_fence = False
        self.next_producer_id = PID
        self.producers: dict[int, tuple[int, int]] = {}  # client -> (id, epoch) it was given
        self.max_epoch: dict[int, int] = {}
        self.handed: dict[tuple[int, int], int] = {}
        self.decided: dict[int, TransactionResult] = {}  # transaction (its start) -> outcome
        self.fenced: set[tuple[int, int]] = set()  # epochs a durable epoch fence ended

    # -- the I/O layer -------------------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1  # every request at its own instant: a transaction is named by its start

    def allocate(self) -> int:
        self.next_producer_id += 1
        return self.next_producer_id

    def handle(
        self,
        decision: object,
        client: int | None,
        op: str,
        append: str,
        sent: tuple[int, int] = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH),
    ) -> None:
        if isinstance(decision, Reply):
            event(f"{op}: {decision.error.name}")
            self.answer(client, op, sent, decision.error, None)
            return
        assert isinstance(decision, Transition), decision
        event(f"{op}: write {decision.metadata.state.kafka_name}")
        # a decision never writes over a pending write
        assert self.pending is None and self.in_flight is None
        if op in ("add", "end"):
            self.check_not_fenced(sent)
        self.pending = decision.metadata.state
        self.in_flight = decision
        self.waiting = (client, op, sent)
        if append != "later":
            self.append_returns(append)

    def answer(
        self,
        client: int | None,
        op: str,
        sent: tuple[int, int],
        error: ErrorCode,
        m: TransactionMetadata | None,
    ) -> None:
        if client is None or error is not E.NONE:
            return
        if op in ("add", "end"):
            self.check_not_fenced(sent)
        elif op == "init":
            assert m is not None
            given = (m.producer_id, m.producer_epoch)
            assert self.handed.setdefault(given, client) == client, f"{given} handed out twice"
            assert m.producer_epoch >= self.max_epoch.get(m.producer_id, -1)
            self.producers[client] = given

    def check_not_fenced(self, sent: tuple[int, int]) -> None:
        """A request accepted with ``sent`` came from the current producer."""
        pid, epoch = sent
        assert self.current is not None
        assert (pid, epoch) == (self.current.producer_id, self.current.producer_epoch)
        assert epoch == self.max_epoch.get(pid, epoch)
        assert sent not in self.fenced, f"{sent} was fenced and is accepted again"

    def make_durable(self, m: TransactionMetadata) -> None:
        before = self.persisted
        if before is None:
            assert m.state is S.EMPTY
        else:
            assert before.state in KAFKA_VALID_PREVIOUS_STATES[m.state], (before.state, m.state)
        assert m.producer_epoch >= self.max_epoch.get(m.producer_id, -1), "epoch went down"
        self.max_epoch[m.producer_id] = m.producer_epoch
        self.persisted = m

    def check_apply(self, old: TransactionMetadata | None, t: Transition) -> None:
        """Kafka's completeTransitionTo: what each target state may change."""
        new = t.metadata
        if old is None:
            assert (new.state, new.producer_epoch) == (S.EMPTY, 0)
            return
        assert new.txn_last_update_timestamp_ms >= old.txn_last_update_timestamp_ms
        same_producer = (new.producer_id, new.producer_epoch) == (
            old.producer_id,
            old.producer_epoch,
        )
        if new.state is S.EMPTY:
            assert (
                new.producer_id == old.producer_id
                and new.producer_epoch in (old.producer_epoch, old.producer_epoch + 1)
            ) or (new.producer_id != old.producer_id and new.producer_epoch == 0)
            assert (new.partitions, new.txn_start_timestamp_ms) == (frozenset(), -1)
        elif new.state is S.ONGOING:
            assert same_producer and old.partitions <= new.partitions
            assert new.txn_timeout_ms == old.txn_timeout_ms
        else:
            assert new.state in PREPARE
            assert new.producer_id == old.producer_id
            # a fence bumps the epoch, unless a failed one already did so in memory
            bump = 1 if t.epoch_fence and not self.failed_fence else 0
            assert new.producer_epoch == old.producer_epoch + bump
            assert (new.partitions, new.txn_timeout_ms, new.txn_start_timestamp_ms) == (
                old.partitions,
                old.txn_timeout_ms,
                old.txn_start_timestamp_ms,
            )

    def decide(self, prepared: TransactionMetadata, *, resumed: bool) -> None:
        outcome = COMMIT if prepared.state is S.PREPARE_COMMIT else ABORT
        key = prepared.txn_start_timestamp_ms
        if resumed:  # a reload carries on with a decision, maybe one never applied before
            assert self.decided.setdefault(key, outcome) == outcome
        else:
            assert key not in self.decided, f"transaction {key} decided twice"
            self.decided[key] = outcome

    def start_markers(self, prepared: TransactionMetadata) -> None:
        markers = complete_transaction(prepared, self.now)
        assert markers.partitions == prepared.partitions
        assert (markers.producer_id, markers.producer_epoch) == (
            prepared.producer_id,
            prepared.producer_epoch,
        )
        self.pending = markers.then.state
        self.in_flight = markers

    def reload(self) -> None:
        """The coordinator loads the transaction log again: only durable records count."""
        event("reload")
        self.in_flight, self.pending, self.failed_fence = None, None, False
        self.waiting = (None, "", (-1, -1))
        self.current = None if self.persisted is None else as_loaded(self.persisted)
        if self.current is not None and self.current.state in PREPARE:
            self.decide(self.current, resumed=True)
            self.start_markers(self.current)

    # -- rules ---------------------------------------------------------------------------------

    @initialize(
        epoch=st.sampled_from([None, 0, *range(MAX_PRODUCER_EPOCH - 4, MAX_PRODUCER_EPOCH)])
    )
    def transactional_id_already_known(self, epoch: int | None) -> None:
        if epoch is not None:  # loaded from the log, no producer holds it
            m = replace(meta(S.COMPLETE_COMMIT, epoch=epoch), producer_id=self.allocate())
            self.max_epoch[m.producer_id] = epoch
            self.persisted = m
            self.current = as_loaded(m)
        # the first producer is up before the sequence starts, as it usually is
        self.init_producer(client=0, with_current_id=False, timeout=400, append="durable")

    @rule(
        client=st.sampled_from(CLIENTS),
        with_current_id=st.booleans(),
        timeout=st.sampled_from([50, 400, 2000]),
        append=APPENDS,
    )
    def init_producer(self, client: int, with_current_id: bool, timeout: int, append: str) -> None:
        self.tick()
        kw: dict[str, int] = {}
        if with_current_id and client in self.producers:
            pid, epoch = self.producers[client]
            kw = {"expected_producer_id": pid, "expected_producer_epoch": epoch}

        def decide(new_producer_id: int | None) -> object:
            return init_producer_id(
                self.current,
                TID,
                timeout,
                self.now,
                pending=self.pending,
                has_failed_epoch_fence=self.failed_fence,
                new_producer_id=new_producer_id,
                **kw,
            )

        decision = decide(None)
        if isinstance(decision, NeedProducerId):
            event("init: new producer id" if self.current else "init: first producer id")
            decision = decide(self.allocate())
            assert not isinstance(decision, NeedProducerId)
        self.handle(decision, client, "init", append)

    def producer_of(self, pick: int) -> tuple[int, tuple[int, int]]:
        """A producer that has an id, mostly; now and then one that never had (or dropped) it."""
        known = sorted(self.producers)
        if not known or pick >= 2 * len(CLIENTS):
            client = pick % len(CLIENTS)
            return client, self.producers.get(client, (NO_PRODUCER_ID, NO_PRODUCER_EPOCH))
        client = known[pick % len(known)]
        return client, self.producers[client]

    @rule(
        pick=PICKS,
        tps=st.frozensets(st.sampled_from(TOPIC_PARTITIONS), min_size=1),
        append=APPENDS,
    )
    def add_partitions(self, pick: int, tps: frozenset[tuple[str, int]], append: str) -> None:
        self.tick()
        client, (pid, epoch) = self.producer_of(pick)
        d = add_partitions_to_txn(
            self.current, TID, pid, epoch, tps, self.now, pending=self.pending
        )
        self.handle(d, client, "add", append, (pid, epoch))

    @rule(pick=PICKS, append=APPENDS)
    def add_offsets(self, pick: int, append: str) -> None:
        self.tick()
        client, (pid, epoch) = self.producer_of(pick)
        d = add_offsets_to_txn(self.current, TID, pid, epoch, 7, self.now, pending=self.pending)
        self.handle(d, client, "add", append, (pid, epoch))

    @rule(pick=PICKS, tps=st.frozensets(st.sampled_from(TOPIC_PARTITIONS)))
    def verify_only(self, pick: int, tps: frozenset[tuple[str, int]]) -> None:
        _, (pid, epoch) = self.producer_of(pick)
        errors = verify_partitions_in_txn(self.current, TID, pid, epoch, tps)
        assert set(errors) == tps
        for tp, error in errors.items():
            event(f"verify: {error.name}")
            if error is E.NONE:
                self.check_not_fenced((pid, epoch))
                assert self.current is not None and tp in self.current.partitions

    @rule(pick=PICKS, result=st.sampled_from(TransactionResult), append=APPENDS)
    def end_transaction(self, pick: int, result: TransactionResult, append: str) -> None:
        self.tick()
        client, (pid, epoch) = self.producer_of(pick)
        d = end_txn(self.current, TID, pid, epoch, result, self.now, pending=self.pending)
        self.handle(d, client, "end", append, (pid, epoch))

    @rule(ms=st.integers(0, 2500))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule(append=APPENDS)
    def abort_timed_out(self, append: str) -> None:
        self.tick()
        known = [] if self.current is None else [self.current]
        pending = {} if self.pending is None else {TID: self.pending}
        for t in timed_out_transactions(known, self.now, pending=pending):
            d = abort_timed_out_transaction(
                self.current,
                t.producer_id,
                self.now,
                pending=self.pending,
                has_failed_epoch_fence=self.failed_fence,
            )
            if d is not None:
                self.handle(d, None, "timeout", append)

    @rule(client=st.sampled_from(CLIENTS))
    def producer_restarts(self, client: int) -> None:
        self.producers.pop(client, None)

    @precondition(lambda self: self.in_flight is not None)
    @rule(outcome=st.sampled_from(OUTCOMES))
    def log_append_returns(self, outcome: str) -> None:
        self.tick()
        self.append_returns(outcome)

    def append_returns(self, outcome: str) -> None:
        t = self.in_flight
        assert t is not None
        if isinstance(t, Transition) and t.epoch_fence and outcome.endswith("durable"):
            # once the fence is in the log, the producer that held the transaction is done
            # (a lost one leaves it in business after a reload, as in Kafka)
            self.fenced.add((t.metadata.producer_id, t.metadata.producer_epoch - 1))
        if outcome.startswith("unknown"):
            if outcome.endswith("durable"):
                self.make_durable(t.metadata if isinstance(t, Transition) else t.then)
            self.reload()
            return
        if isinstance(t, WriteMarkers):
            if outcome == "durable":
                self.make_durable(t.then)
                assert self.decided[t.then.txn_start_timestamp_ms] is t.result
                assert t.then.state is (
                    S.COMPLETE_COMMIT if t.result is COMMIT else S.COMPLETE_ABORT
                )
                self.current, self.pending, self.in_flight = t.then, None, None
            return  # a refused Complete* append is retried
        assert isinstance(t, Transition)
        client, op, sent = self.waiting
        self.waiting = (None, "", (-1, -1))
        if outcome == "refused":
            self.pending, self.in_flight = None, None
            if t.epoch_fence:
                assert self.current is not None
                self.current = epoch_fence_failed(self.current, t)
                self.failed_fence = True
            return
        self.make_durable(t.metadata)
        self.check_apply(self.current, t)
        self.current, self.pending, self.in_flight = t.metadata, None, None
        if t.metadata.state in PREPARE:
            self.decide(t.metadata, resumed=False)
        self.answer(client, op, sent, t.reply, t.metadata)
        if t.complete:
            self.failed_fence = False
            self.start_markers(t.metadata)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def idle_states_hold_no_partitions(self) -> None:
        for m in (self.current, self.persisted):
            if m is not None and m.state in IDLE:
                assert m.partitions == frozenset()

    @invariant()
    def open_transactions_have_a_start(self) -> None:
        m = self.current
        if m is not None:
            assert m.state not in (S.DEAD, S.PREPARE_EPOCH_FENCE)
            assert (m.txn_start_timestamp_ms == -1) == (m.state is S.EMPTY)
            assert 0 <= m.producer_epoch <= MAX_PRODUCER_EPOCH

    @invariant()
    def pending_is_the_write_in_flight(self) -> None:
        t = self.in_flight
        if t is None:
            assert self.pending is None
        else:
            assert self.pending is (t.metadata.state if isinstance(t, Transition) else t.then.state)

    @invariant()
    def memory_is_the_log_but_for_a_failed_fence(self) -> None:
        mem, log = self.current, self.persisted
        assert (mem is None) == (log is None)
        if mem is not None and log is not None:
            assert (mem.producer_id, mem.state, mem.partitions) == (
                log.producer_id,
                log.state,
                log.partitions,
            )
            # a refused fence leaves its bump in memory only, until the fence is retried or
            # the log is reloaded
            assert mem.producer_epoch == log.producer_epoch + (1 if self.failed_fence else 0)


TestTwoProducersOneTransactionalId = TwoProducersOneTransactionalId.TestCase
TestTwoProducersOneTransactionalId.settings = settings(
    max_examples=300, stateful_step_count=80, deadline=None
)
