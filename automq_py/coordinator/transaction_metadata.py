"""The transaction coordinator's state machine and decision rules (Kafka 3.9), as pure functions.

Kafka's ``TransactionCoordinator`` / ``TransactionMetadata`` / ``TransactionStateManager``
(``kafka.coordinator.transaction``, 3.9, transaction protocol version 1 - before KIP-890 part 2)
restated as functions ``(current metadata, request, now_ms) -> decision``, in the shape of
``storage/metadata/control.py``: no I/O, no event loop, no clock. The I/O layer keeps one
:class:`TransactionMetadata` per transactional id (the last record of ``__transaction_state``
that it applied), writes what a decision says, and applies it once durable.

States (``TransactionState``; the ids are the ``TransactionStatus`` byte of the log record,
the names are what DescribeTransactions / ListTransactions report)::

                            InitProducerId (epoch + 1, or a new producer id)
                           +------+
                           v      |
        (none) -------> Empty ----+
        InitProducerId     |
                           | AddPartitionsToTxn / AddOffsetsToTxn
                           v
                        Ongoing <----+ AddPartitionsToTxn
                         |  |  |     |
                         |  |  +-----+
          EndTxn(commit) |  | EndTxn(abort); or an epoch fence: InitProducerId, or
                         |  | the transaction timeout (Kafka's PrepareEpochFence)
                         v  v
             PrepareCommit  PrepareAbort
                         |  |
         markers written |  | markers written
                         v  v
            CompleteCommit  CompleteAbort

    CompleteCommit, CompleteAbort --InitProducerId--> Empty
    CompleteCommit, CompleteAbort --AddPartitionsToTxn / AddOffsetsToTxn--> Ongoing
    Empty, CompleteCommit, CompleteAbort --idle for transactional.id.expiration.ms--> Dead
                                           (a tombstone: the id is forgotten)

Every transition is checked against Kafka's ``validPreviousStates``
(:data:`VALID_PREVIOUS_STATES`); a decision that would break it is a bug here, not a client
error, and raises :class:`IllegalTransitionError`.

What is persisted and what is not. :class:`TransactionMetadata` is the record: what Kafka's
``TxnTransitMetadata`` carries. Two things Kafka keeps beside it are not in it, because they
describe an operation in flight rather than the transaction, and they are never written:

* the *pending state* (``pendingState``): the state of the record being written. While it is
  set, every operation but AddPartitionsToTxn's ``verify_only`` answers
  ``CONCURRENT_TRANSACTIONS`` and the timeout scan skips the id. The I/O layer keeps it (one per
  transactional id, also for an id whose first record is being written) and passes it in as
  ``pending``;
* ``hasFailedEpochFence``: a write that bumped the epoch to fence a producer failed; the next
  fence reuses the bumped epoch instead of bumping again. Passed in as
  ``has_failed_epoch_fence``.

``PrepareEpochFence`` is Kafka's pending state between "bump the epoch" and "write
PrepareAbort with it"; here the two are one decision (:class:`Transition` with
``epoch_fence=True``), so it never appears as a pending state and is never written.

Kafka 3.9 does not persist ``last_producer_id`` / ``last_producer_epoch`` either
(``TransactionLogValue`` v0 has neither): after a reload they are -1 (:func:`as_loaded`), which
only narrows KIP-360's retry cases to PRODUCER_FENCED.

The protocol the I/O layer follows, per decision:

* :class:`Reply` ``(error)``: answer now, write nothing.
* :class:`NeedProducerId`: allocate a producer id never issued before and decide again with
  ``new_producer_id=`` (the state may have changed meanwhile: deciding again is always right).
* :class:`Transition` ``(metadata, reply, complete, epoch_fence)``:

  1. set ``pending = metadata.state``; append ``metadata`` to the transaction log;
  2. durable: apply it (``current = metadata``), clear ``pending``, answer ``reply``
     (InitProducerId answers with ``metadata.producer_id`` / ``producer_epoch``). If
     ``complete``, then call :func:`complete_transaction` and carry out its
     :class:`WriteMarkers` (below); also clear ``has_failed_epoch_fence``;
  3. refused by the log: clear ``pending``, answer the append's error as
     :func:`coordinator_error_for_append` maps it; if ``epoch_fence``, set
     ``current = epoch_fence_failed(current, transition)`` and ``has_failed_epoch_fence``;
  4. outcome unknown (the append may or may not be durable): reload the transaction state from
     the log (:func:`as_loaded` each record, then :func:`complete_transaction` for every
     PrepareCommit/PrepareAbort) before deciding anything else for the ids of that partition.
     Kafka treats a timed-out append as refused (3.), which can leave its memory behind its
     log; reloading keeps the two equal.

* :class:`WriteMarkers` ``(result, producer_id, producer_epoch, partitions, then)``: set
  ``pending = then.state``; write a COMMIT/ABORT control batch (``producer_id``,
  ``producer_epoch``, the coordinator epoch) to every partition; then append ``then``
  (CompleteCommit/CompleteAbort) and apply it as in 2. A failed append of ``then`` is retried
  (Kafka retries COORDINATOR_NOT_AVAILABLE, keeping the pending state).
* Every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``:
  :func:`timed_out_transactions`, then :func:`abort_timed_out_transaction` for each (a
  :class:`Transition` nobody waits for).
* Every ``transaction.remove.expired.transaction.cleanup.interval.ms``:
  :func:`expired_transactional_ids` (idle for ``transactional.id.expiration.ms``); set
  ``pending = DEAD``, append a tombstone (null value) for each id, then forget the id if it is
  still pending DEAD with the same epoch, else clear ``pending``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode

TopicPartition = tuple[str, int]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_TXN_START_TIMESTAMP = -1
MAX_PRODUCER_EPOCH = 0x7FFF  # Short.MaxValue
OFFSETS_TOPIC = "__consumer_offsets"  # Kafka's GROUP_METADATA_TOPIC_NAME

DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms (15 minutes)
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000  # transactional.id.expiration.ms (7 days)


class IllegalTransitionError(ValueError):
    """A transition Kafka's ``validPreviousStates`` forbids, or a state no record can be in:
    a bug in the caller or here, never a client's fault (Kafka throws IllegalStateException)."""


class TransactionState(enum.IntEnum):
    """Kafka's transaction states, with their ``TransactionStatus`` ids."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions report ("PrepareCommit", ...)."""
        return _KAFKA_NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TransactionState | None:
        """The state a ListTransactions state filter names; None for an unknown name."""
        return _BY_KAFKA_NAME.get(name)

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        """The states a transaction may move to this one from (Kafka's validPreviousStates)."""
        return VALID_PREVIOUS_STATES[self]

    @property
    def is_expiration_allowed(self) -> bool:
        """Whether an idle transactional id in this state may expire (no transaction open)."""
        return self in _EXPIRATION_ALLOWED


_KAFKA_NAMES: dict[TransactionState, str] = {
    TransactionState.EMPTY: "Empty",
    TransactionState.ONGOING: "Ongoing",
    TransactionState.PREPARE_COMMIT: "PrepareCommit",
    TransactionState.PREPARE_ABORT: "PrepareAbort",
    TransactionState.COMPLETE_COMMIT: "CompleteCommit",
    TransactionState.COMPLETE_ABORT: "CompleteAbort",
    TransactionState.DEAD: "Dead",
    TransactionState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_KAFKA_NAME = {name: state for state, name in _KAFKA_NAMES.items()}

_S = TransactionState
VALID_PREVIOUS_STATES: Mapping[TransactionState, frozenset[TransactionState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_ABORT, _S.COMPLETE_COMMIT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}
_EXPIRATION_ALLOWED = frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT})
_PREPARE = frozenset({_S.PREPARE_COMMIT, _S.PREPARE_ABORT})
_NEVER_CURRENT = frozenset({_S.DEAD, _S.PREPARE_EPOCH_FENCE})


class TransactionResult(enum.IntEnum):
    """How a transaction ends; the values are the control record types (ABORT 0, COMMIT 1)."""

    ABORT = 0
    COMMIT = 1


@dataclass(slots=True, frozen=True)
class TransactionMetadata:
    """One transactional id's state: a record of ``__transaction_state`` (Kafka's
    ``TxnTransitMetadata`` plus the id).

    ``last_producer_id`` is the producer id before the last transition (equal to
    ``producer_id`` except right after a rotation); ``last_producer_epoch`` is the epoch a
    KIP-360 producer may still send to retry an InitProducerId it got no answer for (-1 once
    another producer took over). ``txn_start_timestamp_ms`` is -1 in Empty.
    """

    transactional_id: str
    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    partitions: frozenset[TopicPartition]
    txn_start_timestamp_ms: int
    txn_last_update_timestamp_ms: int

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        """Kafka's ``isEpochExhausted``: the client never gets ``Short.MaxValue``, so the
        coordinator can always bump once more to fence."""
        return is_epoch_exhausted(self.producer_epoch)


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """An epoch at or past ``Short.MaxValue - 1`` takes a new producer id instead of a bump."""
    return producer_epoch >= MAX_PRODUCER_EPOCH - 1


# -- decisions -------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Reply:
    """Answer ``error`` now; nothing is written (``NONE``: it is already done)."""

    error: ErrorCode


@dataclass(slots=True, frozen=True)
class NeedProducerId:
    """The decision needs a producer id never issued before: allocate one and decide again,
    passing it as ``new_producer_id``."""


@dataclass(slots=True, frozen=True)
class Transition:
    """Write ``metadata`` to the transaction log (pending state ``metadata.state`` meanwhile).

    Once durable: apply it and answer ``reply``; if ``complete``, then end the transaction with
    :func:`complete_transaction`. If the log refuses it and ``epoch_fence`` is set, the bumped
    epoch stays in memory (:func:`epoch_fence_failed`).
    """

    metadata: TransactionMetadata
    reply: ErrorCode = ErrorCode.NONE
    complete: bool = False
    epoch_fence: bool = False


@dataclass(slots=True, frozen=True)
class WriteMarkers:
    """Write a ``result`` marker for ``producer_id``/``producer_epoch`` to every partition,
    then persist ``then`` (CompleteCommit or CompleteAbort; pending meanwhile)."""

    result: TransactionResult
    producer_id: int
    producer_epoch: int
    partitions: frozenset[TopicPartition]
    then: TransactionMetadata


# -- transitions -----------------------------------------------------------------------------


def new_transaction_metadata(
    transactional_id: str, producer_id: int, txn_timeout_ms: int, now_ms: int
) -> TransactionMetadata:
    """The entry Kafka creates for an unknown transactional id before its first InitProducerId
    is written: Empty, epoch -1. It is never written as it is."""
    return TransactionMetadata(
        transactional_id=transactional_id,
        producer_id=producer_id,
        last_producer_id=NO_PRODUCER_ID,
        producer_epoch=NO_PRODUCER_EPOCH,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        txn_timeout_ms=txn_timeout_ms,
        state=TransactionState.EMPTY,
        partitions=frozenset(),
        txn_start_timestamp_ms=NO_TXN_START_TIMESTAMP,
        txn_last_update_timestamp_ms=now_ms,
    )


def _transition(
    current: TransactionMetadata,
    state: TransactionState,
    *,
    producer_id: int | None = None,
    producer_epoch: int | None = None,
    last_producer_epoch: int | None = None,
    txn_timeout_ms: int | None = None,
    partitions: frozenset[TopicPartition] | None = None,
    txn_start_timestamp_ms: int | None = None,
    txn_last_update_timestamp_ms: int | None = None,
) -> TransactionMetadata:
    """Kafka's ``prepareTransitionTo``: check the move, and remember the producer id it leaves
    (every transition sets ``last_producer_id`` to the current id)."""
    if current.state not in state.valid_previous_states:
        raise IllegalTransitionError(
            f"transactional id {current.transactional_id!r}: {current.state.kafka_name} "
            f"may not move to {state.kafka_name}"
        )
    new_id = current.producer_id if producer_id is None else producer_id
    new_epoch = current.producer_epoch if producer_epoch is None else producer_epoch
    if new_id < 0:
        raise IllegalTransitionError(f"illegal new producer id {new_id}")
    if state is not TransactionState.DEAD and new_epoch < 0:
        raise IllegalTransitionError(f"illegal new producer epoch {new_epoch}")
    return TransactionMetadata(
        transactional_id=current.transactional_id,
        producer_id=new_id,
        last_producer_id=current.producer_id,
        producer_epoch=new_epoch,
        last_producer_epoch=(
            current.last_producer_epoch if last_producer_epoch is None else last_producer_epoch
        ),
        txn_timeout_ms=current.txn_timeout_ms if txn_timeout_ms is None else txn_timeout_ms,
        state=state,
        partitions=current.partitions if partitions is None else partitions,
        txn_start_timestamp_ms=(
            current.txn_start_timestamp_ms
            if txn_start_timestamp_ms is None
            else txn_start_timestamp_ms
        ),
        txn_last_update_timestamp_ms=(
            current.txn_last_update_timestamp_ms
            if txn_last_update_timestamp_ms is None
            else txn_last_update_timestamp_ms
        ),
    )


def _check_current(current: TransactionMetadata) -> None:
    if current.state in _NEVER_CURRENT:
        # Kafka logs fatal and throws: Dead is only ever a pending state, PrepareEpochFence too
        raise IllegalTransitionError(
            f"transactional id {current.transactional_id!r} is in state "
            f"{current.state.kafka_name}, which no record is ever in"
        )


def _fence_and_abort(
    current: TransactionMetadata, now_ms: int, has_failed_epoch_fence: bool
) -> TransactionMetadata | None:
    """Kafka's ``prepareFenceProducerEpoch`` followed by the abort ``endTransaction`` makes of
    it: PrepareAbort at the epoch + 1, which fences every request of the old epoch (the client
    never gets this epoch). None where Kafka throws: not Ongoing, or the epoch is already
    ``Short.MaxValue`` (checked before ``has_failed_epoch_fence`` is looked at, as Kafka does).
    """
    if current.state is not TransactionState.ONGOING:
        return None
    if current.producer_epoch == MAX_PRODUCER_EPOCH:
        return None
    # a fence whose write failed already bumped the epoch in memory: bumping again is not needed
    epoch = current.producer_epoch if has_failed_epoch_fence else current.producer_epoch + 1
    return _transition(
        current,
        TransactionState.PREPARE_ABORT,
        producer_epoch=epoch,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        txn_last_update_timestamp_ms=now_ms,
    )


def epoch_fence_failed(current: TransactionMetadata, attempt: Transition) -> TransactionMetadata:
    """What stays in memory when the log refused an ``epoch_fence`` transition.

    Kafka bumps the in-memory epoch before it appends the PrepareAbort and does not undo it
    when the append fails, so the old epoch stays fenced; the next fence reuses this epoch
    (``has_failed_epoch_fence``). A reload from the log forgets both.
    """
    if not attempt.epoch_fence:
        raise ValueError("not an epoch fence")
    return replace(
        current,
        producer_epoch=attempt.metadata.producer_epoch,
        last_producer_epoch=NO_PRODUCER_EPOCH,
    )


def as_loaded(record: TransactionMetadata) -> TransactionMetadata:
    """The metadata Kafka 3.9 rebuilds from a record when it loads ``__transaction_state``:
    no last producer id or epoch (not in the record), no partitions for Empty."""
    return replace(
        record,
        last_producer_id=NO_PRODUCER_ID,
        last_producer_epoch=NO_PRODUCER_EPOCH,
        partitions=frozenset() if record.state is TransactionState.EMPTY else record.partitions,
    )


def complete_transaction(prepared: TransactionMetadata, now_ms: int) -> WriteMarkers:
    """The second phase of a commit or abort (Kafka's ``prepareComplete``): the markers to
    write and the CompleteCommit / CompleteAbort record to persist after them.

    Called once the PrepareCommit/PrepareAbort record is durable, and for every such record
    found when the transaction log is loaded.
    """
    if prepared.state not in _PREPARE:
        raise IllegalTransitionError(
            f"transactional id {prepared.transactional_id!r} is {prepared.state.kafka_name}: "
            "only PrepareCommit and PrepareAbort complete"
        )
    commit = prepared.state is TransactionState.PREPARE_COMMIT
    done = _transition(
        prepared,
        TransactionState.COMPLETE_COMMIT if commit else TransactionState.COMPLETE_ABORT,
        partitions=frozenset(),
        txn_last_update_timestamp_ms=now_ms,
    )
    return WriteMarkers(
        result=TransactionResult.COMMIT if commit else TransactionResult.ABORT,
        producer_id=prepared.producer_id,
        producer_epoch=prepared.producer_epoch,
        partitions=prepared.partitions,
        then=done,
    )


# -- InitProducerId --------------------------------------------------------------------------


def validate_transaction_timeout(txn_timeout_ms: int, max_txn_timeout_ms: int) -> bool:
    """Kafka's ``validateTransactionTimeoutMs``: positive and at most the broker's maximum."""
    return 0 < txn_timeout_ms <= max_txn_timeout_ms


def init_producer_id(
    current: TransactionMetadata | None,
    transactional_id: str,
    txn_timeout_ms: int,
    now_ms: int,
    *,
    max_txn_timeout_ms: int = DEFAULT_TRANSACTION_MAX_TIMEOUT_MS,
    expected_producer_id: int = NO_PRODUCER_ID,
    expected_producer_epoch: int = NO_PRODUCER_EPOCH,
    pending: TransactionState | None = None,
    has_failed_epoch_fence: bool = False,
    new_producer_id: int | None = None,
) -> Reply | NeedProducerId | Transition:
    """InitProducerId with a transactional id (Kafka's ``handleInitProducerId``).

    ``expected_producer_id`` / ``expected_producer_epoch`` are the v3+ fields (KIP-360): a
    producer that already has an id asks to bump its own epoch; both -1 otherwise.

    * no state yet: a new producer id (:class:`NeedProducerId`) at epoch 0;
    * Empty / CompleteCommit / CompleteAbort: epoch + 1, or a new producer id at epoch 0 once
      the epoch is exhausted (``Short.MaxValue - 1``);
    * Ongoing: the open transaction is aborted first with the epoch + 1 (this fences the old
      producer); the client is answered ``CONCURRENT_TRANSACTIONS`` and retries, which bumps
      the epoch a second time (or rotates the id);
    * PrepareCommit / PrepareAbort, or a write pending: ``CONCURRENT_TRANSACTIONS``.

    A v3+ producer is fenced (``PRODUCER_FENCED``) unless its id is the current one, or the
    id the last rotation replaced with an exhausted epoch (a retry of that rotation). Its epoch
    must then be the current one (bump) or the last one (a retry: answered the current epoch
    again, no bump).
    """
    if (expected_producer_id == NO_PRODUCER_ID) != (expected_producer_epoch == NO_PRODUCER_EPOCH):
        return Reply(ErrorCode.INVALID_REQUEST)  # KafkaApis: one of the two without the other
    if not transactional_id:
        return Reply(ErrorCode.INVALID_REQUEST)
    if not validate_transaction_timeout(txn_timeout_ms, max_txn_timeout_ms):
        return Reply(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    if pending is not None:
        return Reply(ErrorCode.CONCURRENT_TRANSACTIONS)
    if new_producer_id is not None and new_producer_id < 0:
        raise ValueError(f"illegal new producer id {new_producer_id}")
    if current is None:
        if new_producer_id is None:
            return NeedProducerId()
        current = new_transaction_metadata(
            transactional_id, new_producer_id, txn_timeout_ms, now_ms
        )
        new_producer_id = None  # spent on the entry
    _check_current(current)
    expected = expected_producer_id != NO_PRODUCER_ID
    if expected and not (
        # just created: a producer recovering from UNKNOWN_PRODUCER_ID may take the new id
        current.producer_epoch == NO_PRODUCER_EPOCH
        or expected_producer_id == current.producer_id
        # a retry of a rotation whose answer the producer never got
        or (
            expected_producer_id == current.last_producer_id
            and is_epoch_exhausted(expected_producer_epoch)
        )
    ):
        return Reply(ErrorCode.PRODUCER_FENCED)

    state = current.state
    if state in _PREPARE:
        return Reply(ErrorCode.CONCURRENT_TRANSACTIONS)
    if state is TransactionState.ONGOING:
        aborted = _fence_and_abort(current, now_ms, has_failed_epoch_fence)
        if aborted is None:
            # Kafka's prepareFenceProducerEpoch throws at Short.MaxValue: UNKNOWN_SERVER_ERROR
            return Reply(ErrorCode.UNKNOWN_SERVER_ERROR)
        return Transition(
            aborted, reply=ErrorCode.CONCURRENT_TRANSACTIONS, complete=True, epoch_fence=True
        )

    if current.is_producer_epoch_exhausted:
        if expected and expected_producer_epoch != current.producer_epoch:
            # Kafka's prepareIncrementProducerEpoch throws "Cannot allocate any more producer
            # epochs": the client gets UNKNOWN_SERVER_ERROR
            return Reply(ErrorCode.UNKNOWN_SERVER_ERROR)
        if new_producer_id is None:
            return NeedProducerId()
        return Transition(
            _transition(
                current,
                TransactionState.EMPTY,
                producer_id=new_producer_id,
                producer_epoch=0,
                # remembered only for a producer that can retry with it (v3+)
                last_producer_epoch=current.producer_epoch if expected else NO_PRODUCER_EPOCH,
                txn_timeout_ms=txn_timeout_ms,
                partitions=frozenset(),
                txn_start_timestamp_ms=NO_TXN_START_TIMESTAMP,
                txn_last_update_timestamp_ms=now_ms,
            )
        )

    bumped = current.producer_epoch + 1
    if not expected:
        # a new producer (or a pre-KIP-360 one): nobody may retry with the old epoch
        epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
    elif (
        current.producer_epoch == NO_PRODUCER_EPOCH
        or expected_producer_epoch == current.producer_epoch
    ):
        epoch, last_epoch = bumped, current.producer_epoch
    elif expected_producer_epoch == current.last_producer_epoch:
        # a retry of a bump that succeeded: the same epoch again. No other producer can have
        # initialized since: that would have set the last epoch to -1.
        epoch, last_epoch = current.producer_epoch, current.last_producer_epoch
    else:
        return Reply(ErrorCode.PRODUCER_FENCED)
    return Transition(
        _transition(
            current,
            TransactionState.EMPTY,
            producer_epoch=epoch,
            last_producer_epoch=last_epoch,
            txn_timeout_ms=txn_timeout_ms,
            partitions=frozenset(),
            txn_start_timestamp_ms=NO_TXN_START_TIMESTAMP,
            txn_last_update_timestamp_ms=now_ms,
        )
    )


# -- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------------------


def _check_producer(
    current: TransactionMetadata | None, producer_id: int, producer_epoch: int
) -> ErrorCode:
    if current is None or current.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if current.producer_epoch != producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    return ErrorCode.NONE


def add_partitions_to_txn(
    current: TransactionMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[TopicPartition],
    now_ms: int,
    *,
    pending: TransactionState | None = None,
) -> Reply | Transition:
    """AddPartitionsToTxn (v0-v3, or a v4 transaction without ``verify_only``).

    The producer id must be the current one (else ``INVALID_PRODUCER_ID_MAPPING``) at the
    current epoch exactly (else ``PRODUCER_FENCED``). Adding to a transaction that is being
    completed (or while any write is pending) is ``CONCURRENT_TRANSACTIONS``: the client
    retries once the markers are written. Partitions already in the Ongoing transaction are
    answered at once; otherwise the transaction becomes (or stays) Ongoing with them, and
    starts its clock if it was not open.
    """
    if not transactional_id:
        return Reply(ErrorCode.INVALID_REQUEST)
    error = _check_producer(current, producer_id, producer_epoch)
    if error is not ErrorCode.NONE:
        return Reply(error)
    assert current is not None
    if pending is not None or current.state in _PREPARE:
        return Reply(ErrorCode.CONCURRENT_TRANSACTIONS)
    _check_current(current)
    added = frozenset(partitions)
    if current.state is TransactionState.ONGOING and added <= current.partitions:
        return Reply(ErrorCode.NONE)
    opens = current.state is not TransactionState.ONGOING
    return Transition(
        _transition(
            current,
            TransactionState.ONGOING,
            partitions=current.partitions | added,
            txn_start_timestamp_ms=now_ms if opens else current.txn_start_timestamp_ms,
            txn_last_update_timestamp_ms=now_ms,
        )
    )


def add_offsets_to_txn(
    current: TransactionMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    offsets_partition: int,
    now_ms: int,
    *,
    pending: TransactionState | None = None,
) -> Reply | Transition:
    """AddOffsetsToTxn: AddPartitionsToTxn of the group's ``__consumer_offsets`` partition
    (``offsets_partition``: where the group coordinator places the group id)."""
    return add_partitions_to_txn(
        current,
        transactional_id,
        producer_id,
        producer_epoch,
        ((OFFSETS_TOPIC, offsets_partition),),
        now_ms,
        pending=pending,
    )


def verify_partitions_in_txn(
    current: TransactionMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[TopicPartition],
) -> dict[TopicPartition, ErrorCode]:
    """AddPartitionsToTxn v4 with ``verify_only`` (KIP-890 part 1): a partition leader asks
    whether these partitions are in the producer's open transaction before it appends a
    transactional batch. Nothing changes.

    The id and epoch are checked as for AddPartitionsToTxn; a transaction being completed is
    ``CONCURRENT_TRANSACTIONS``. A pending write is not looked at (partitions join the metadata
    when their record is durable and leave it when the markers are). Each partition is then
    ``NONE`` if it is in the transaction, else ``TRANSACTION_ABORTABLE``; the leader turns
    that into what its client understands (:func:`verification_error_for_client`).
    """
    wanted = frozenset(partitions)
    if not transactional_id:
        return dict.fromkeys(wanted, ErrorCode.INVALID_REQUEST)
    error = _check_producer(current, producer_id, producer_epoch)
    if error is ErrorCode.NONE:
        assert current is not None
        if current.state in _PREPARE:
            error = ErrorCode.CONCURRENT_TRANSACTIONS
    if error is not ErrorCode.NONE:
        return dict.fromkeys(wanted, error)
    assert current is not None
    return {
        tp: ErrorCode.NONE if tp in current.partitions else ErrorCode.TRANSACTION_ABORTABLE
        for tp in wanted
    }


# -- EndTxn ----------------------------------------------------------------------------------


def end_txn(
    current: TransactionMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    result: TransactionResult,
    now_ms: int,
    *,
    pending: TransactionState | None = None,
) -> Reply | Transition:
    """EndTxn from a client (Kafka's ``endTransaction`` with ``isFromClient``, protocol v1).

    Id and epoch as for AddPartitionsToTxn (the epoch must match exactly: a client never
    bumps it here). An Ongoing transaction moves to PrepareCommit / PrepareAbort; once that
    record is durable the client is answered and the markers are written
    (:func:`complete_transaction`). A retry after the answer was lost:

    ================  ==========================  ==========================
    state             same result                 other result
    ================  ==========================  ==========================
    CompleteCommit    NONE (already committed)    INVALID_TXN_STATE
    CompleteAbort     NONE (already aborted)      INVALID_TXN_STATE
    PrepareCommit     CONCURRENT_TRANSACTIONS     INVALID_TXN_STATE
    PrepareAbort      CONCURRENT_TRANSACTIONS     INVALID_TXN_STATE
    Empty             INVALID_TXN_STATE           INVALID_TXN_STATE
    ================  ==========================  ==========================
    """
    if not transactional_id:
        return Reply(ErrorCode.INVALID_REQUEST)
    error = _check_producer(current, producer_id, producer_epoch)
    if error is not ErrorCode.NONE:
        return Reply(error)
    assert current is not None
    if pending is not None:
        return Reply(ErrorCode.CONCURRENT_TRANSACTIONS)
    _check_current(current)
    commit = result is TransactionResult.COMMIT
    state = current.state
    if state is TransactionState.ONGOING:
        return Transition(
            _transition(
                current,
                TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT,
                txn_last_update_timestamp_ms=now_ms,
            ),
            complete=True,
        )
    done = TransactionState.COMPLETE_COMMIT if commit else TransactionState.COMPLETE_ABORT
    preparing = TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT
    if state is done:
        return Reply(ErrorCode.NONE)
    if state is preparing:
        return Reply(ErrorCode.CONCURRENT_TRANSACTIONS)
    return Reply(ErrorCode.INVALID_TXN_STATE)


# -- timeouts and expiration -----------------------------------------------------------------


def timed_out_transactions(
    transactions: Iterable[TransactionMetadata],
    now_ms: int,
    *,
    pending: Mapping[str, TransactionState] | None = None,
) -> list[TransactionMetadata]:
    """The Ongoing transactions open for longer than their timeout (Kafka's
    ``timedOutTransactions``: ``start + timeout < now``), skipping ids with a write pending."""
    pending = pending or {}
    return [
        t
        for t in transactions
        if t.transactional_id not in pending
        and t.state is TransactionState.ONGOING
        and t.txn_start_timestamp_ms + t.txn_timeout_ms < now_ms
    ]


def abort_timed_out_transaction(
    current: TransactionMetadata | None,
    producer_id: int,
    now_ms: int,
    *,
    pending: TransactionState | None = None,
    has_failed_epoch_fence: bool = False,
) -> Transition | None:
    """The abort Kafka performs for a timed-out transaction (``abortTimedOutTransactions``):
    the epoch is bumped (fencing the producer, whose next request gets ``PRODUCER_FENCED``)
    and the transaction aborted. None if the id moved on since the scan (another producer id,
    a pending write, or no longer Ongoing). Nobody waits for the reply.
    """
    if current is None or current.producer_id != producer_id or pending is not None:
        return None
    aborted = _fence_and_abort(current, now_ms, has_failed_epoch_fence)
    if aborted is None:
        return None
    return Transition(aborted, complete=True, epoch_fence=True)


def expired_transactional_ids(
    transactions: Iterable[TransactionMetadata],
    now_ms: int,
    *,
    expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
    pending: Mapping[str, TransactionState] | None = None,
) -> list[str]:
    """Transactional ids with no open transaction and no update for ``expiration_ms``
    (``transactional.id.expiration.ms``): Kafka writes a tombstone for each and forgets it."""
    pending = pending or {}
    return [
        t.transactional_id
        for t in transactions
        if t.transactional_id not in pending
        and t.state.is_expiration_allowed
        and t.txn_last_update_timestamp_ms <= now_ms - expiration_ms
    ]


# -- DescribeTransactions / ListTransactions (KIP-664) ---------------------------------------


@dataclass(slots=True, frozen=True)
class TransactionDescription:
    """One transaction as DescribeTransactions reports it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    txn_timeout_ms: int
    txn_start_timestamp_ms: int
    topics: tuple[tuple[str, tuple[int, ...]], ...]  # (topic, partitions), sorted


def describe_transaction(
    current: TransactionMetadata | None, transactional_id: str
) -> TransactionDescription | ErrorCode:
    """DescribeTransactions for one id: the description, or the error to report for it
    (``INVALID_REQUEST`` for an empty id, ``TRANSACTIONAL_ID_NOT_FOUND`` for an unknown one)."""
    if not transactional_id:
        return ErrorCode.INVALID_REQUEST
    if current is None or current.state is TransactionState.DEAD:
        return ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    topics: dict[str, list[int]] = {}
    for topic, partition in current.partitions:
        topics.setdefault(topic, []).append(partition)
    return TransactionDescription(
        transactional_id=transactional_id,
        producer_id=current.producer_id,
        producer_epoch=current.producer_epoch,
        state=current.state.kafka_name,
        txn_timeout_ms=current.txn_timeout_ms,
        txn_start_timestamp_ms=current.txn_start_timestamp_ms,
        topics=tuple((t, tuple(sorted(ps))) for t, ps in sorted(topics.items())),
    )


@dataclass(slots=True, frozen=True)
class TransactionListing:
    """One transaction as ListTransactions reports it."""

    transactional_id: str
    producer_id: int
    state: str


def list_transactions(
    transactions: Iterable[TransactionMetadata],
    *,
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
) -> tuple[list[TransactionListing], list[str]]:
    """ListTransactions: the transactions matching the filters (an empty filter matches all),
    and the state filters that name no state (``UnknownStateFilters``).

    Dead ids (being expired) are never listed. A state filter made only of unknown names
    matches nothing, as in Kafka.
    """
    names = list(dict.fromkeys(state_filters))
    states = {s for s in map(TransactionState.from_kafka_name, names) if s is not None}
    unknown = [n for n in names if TransactionState.from_kafka_name(n) is None]
    producer_ids = frozenset(producer_id_filters)
    listed = [
        TransactionListing(t.transactional_id, t.producer_id, t.state.kafka_name)
        for t in transactions
        if t.state is not TransactionState.DEAD
        and (not producer_ids or t.producer_id in producer_ids)
        and (not names or t.state in states)
    ]
    return listed, unknown


# -- error codes by client version -----------------------------------------------------------

# KIP-588 added PRODUCER_FENCED (90) with these versions; older clients know only
# INVALID_PRODUCER_EPOCH (47) for it and treat it the same way (KafkaApis maps it back).
_PRODUCER_FENCED_SINCE: Mapping[int, int] = {
    ApiKey.INIT_PRODUCER_ID: 4,
    ApiKey.ADD_PARTITIONS_TO_TXN: 2,
    ApiKey.ADD_OFFSETS_TO_TXN: 2,
    ApiKey.END_TXN: 2,
}

# the first version whose client handles TRANSACTION_ABORTABLE (120) when the transaction
# coordinator refuses to verify a partition (KAFKA-16314; KafkaApis / GroupCoordinator 3.9)
_TRANSACTION_ABORTABLE_SINCE: Mapping[int, int] = {
    ApiKey.PRODUCE: 11,
    ApiKey.TXN_OFFSET_COMMIT: 4,
}


def error_for_version(api_key: int, api_version: int, error: ErrorCode) -> ErrorCode:
    """The error a transaction coordinator API answers at this version: ``PRODUCER_FENCED``
    becomes ``INVALID_PRODUCER_EPOCH`` below InitProducerId v4, AddPartitionsToTxn v2,
    AddOffsetsToTxn v2 and EndTxn v2."""
    since = _PRODUCER_FENCED_SINCE.get(api_key)
    if error is ErrorCode.PRODUCER_FENCED and since is not None and api_version < since:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


def verification_error_for_client(api_key: int, api_version: int, error: ErrorCode) -> ErrorCode:
    """The error a partition leader answers for a partition the coordinator did not verify
    (Kafka's ``AddPartitionsToTxnManager``), for a Produce or TxnOffsetCommit at this version.

    ``PRODUCER_FENCED`` is always ``INVALID_PRODUCER_EPOCH`` (what a Produce answers since
    KAFKA-10687); ``TRANSACTION_ABORTABLE`` is ``INVALID_TXN_STATE`` below Produce v11 and
    TxnOffsetCommit v4.
    """
    if error is ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    since = _TRANSACTION_ABORTABLE_SINCE.get(api_key)
    if error is ErrorCode.TRANSACTION_ABORTABLE and (since is None or api_version < since):
        return ErrorCode.INVALID_TXN_STATE
    return error


# what a Produce answers for an unverified partition instead of the coordinator's retriable
# errors, which clients older than the verification did not expect from a Produce (Kafka's
# ReplicaManager): NOT_ENOUGH_REPLICAS, which every client retries without a metadata refresh
_UNVERIFIED_RETRIABLE = frozenset(
    {
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)
# Produce v12 (transaction version 2) answers CONCURRENT_TRANSACTIONS as it is
_CONCURRENT_TRANSACTIONS_PRODUCE_SINCE = 12


def produce_error_for_unverified(
    api_version: int, error: ErrorCode
) -> tuple[ErrorCode, str | None]:
    """The error and message a Produce at ``api_version`` answers for a partition whose
    verification failed with ``error`` (Kafka's ``ReplicaManager``): the coordinator's
    retriable errors become ``NOT_ENOUGH_REPLICAS`` naming the underlying one (up to Produce
    v11 for ``CONCURRENT_TRANSACTIONS``), and ``INVALID_TXN_STATE`` says the partition was not
    added to the transaction."""
    code = verification_error_for_client(ApiKey.PRODUCE, api_version, error)
    if code in _UNVERIFIED_RETRIABLE and not (
        code is ErrorCode.CONCURRENT_TRANSACTIONS
        and api_version >= _CONCURRENT_TRANSACTIONS_PRODUCE_SINCE
    ):
        return ErrorCode.NOT_ENOUGH_REPLICAS, (
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {code.name}"
        )
    if code is ErrorCode.INVALID_TXN_STATE:
        return code, "Partition was not added to the transaction"
    return code, None


# what a TxnOffsetCommit answers for the coordinator's errors on verifying the group's
# offsets partition (Kafka 3.9's GroupMetadataManager.maybeConvertOffsetCommitError)
_UNVERIFIED_OFFSET_COMMIT: Mapping[ErrorCode, ErrorCode] = {
    ErrorCode.NETWORK_EXCEPTION: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


def offset_commit_error_for_unverified(api_version: int, error: ErrorCode) -> ErrorCode:
    """The error a TxnOffsetCommit at ``api_version`` answers when the transaction coordinator
    did not verify the group's offsets partition with ``error``: a partition not in the
    transaction is ``INVALID_TXN_STATE`` (``TRANSACTION_ABORTABLE`` from v4), a fenced epoch
    ``INVALID_PRODUCER_EPOCH``, and the coordinator's transport and placement errors become
    the group coordinator's own retriable ones."""
    code = verification_error_for_client(ApiKey.TXN_OFFSET_COMMIT, api_version, error)
    return _UNVERIFIED_OFFSET_COMMIT.get(code, code)


_APPEND_ERRORS: Mapping[ErrorCode, ErrorCode] = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


def coordinator_error_for_append(error: ErrorCode) -> ErrorCode:
    """The error a client gets when the transaction log refused a write (Kafka's
    ``appendTransactionToLog``): retriable ones become ``COORDINATOR_NOT_AVAILABLE`` (retry
    here), a lost partition ``NOT_COORDINATOR`` (find the coordinator again)."""
    return _APPEND_ERRORS.get(error, error)
