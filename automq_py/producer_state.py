"""Idempotent producer state of one partition (Kafka's ``ProducerStateManager``), pure logic.

For every producer id that wrote to the partition the broker keeps its epoch and the metadata
of its last :data:`BATCHES_TO_RETAIN` batches (Kafka's ``ProducerStateEntry``). A Produce batch
carrying a producer id is checked against that state before it gets offsets, with Kafka's rules
(``ProducerAppendInfo.checkProducerEpoch`` / ``checkSequence``, ``UnifiedLog``'s duplicate
lookup):

* an epoch older than the producer's current one: ``INVALID_PRODUCER_EPOCH`` (what Kafka >= 2.7
  answers a client's Produce; ``PRODUCER_FENCED`` is for the transaction coordinator);
* a batch whose epoch and sequence range equal one of the cached batches: a duplicate, answered
  with the original batch's base offset and not appended;
* a newer epoch must start at sequence 0, unless the broker knows no epoch for the producer;
* the same epoch must continue at last sequence + 1 (``Int32.MaxValue`` wraps to 0), else
  ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
* an unknown producer (no state: new, expired, or never seen here) may start at any sequence.
  Since KIP-360 (Kafka 2.5) brokers accept it rather than answer ``UNKNOWN_PRODUCER_ID``.

Batches without a producer id (-1) skip all of this.

Transactions (Kafka's ``ProducerAppendInfo.appendDataBatch`` / ``appendEndTxnMarker``): the
first transactional batch of a producer opens its transaction at that batch's offset; a
non-transactional batch while one is open is ``INVALID_TXN_STATE``. The coordinator's marker (a
control batch) closes it: a marker with an older producer epoch is ``INVALID_PRODUCER_EPOCH``,
one from an older coordinator epoch ``TRANSACTION_COORDINATOR_FENCED``; closing a non-empty
transaction gives a :class:`CompletedTxn`. The partition's first unstable offset (what bounds
its last stable offset, LSO) is the first offset of its oldest open transaction, or of a
completed one whose marker is not yet durable.

The state is persisted as the MetaStream's ``PRODUCER_SNAPSHOTS`` value (version 2, big-endian;
version 1, without the two transaction fields, is still read);
a snapshot at offset ``o`` covers every batch below ``o``, and on open the batches from ``o``
on are replayed with :meth:`ProducerStateManager.update`:

=========================  ======  ==============================================
field                      bytes   meaning
=========================  ======  ==============================================
version                    2       int16, ``2``
crc                        4       CRC-32C of every byte after this field
snapshot offset            8       int64: the state covers batches below it
producer count             4       int32
per producer:
  producer id              8       int64
  producer epoch           2       int16
  last timestamp           8       int64, broker time of its last append (ms)
  txn first offset         8       int64, first offset of its open transaction, -1 none (v2)
  coordinator epoch        4       int32, of the last marker it got, -1 none (v2)
  batch count              1       int8, 0..5, oldest first
  per batch:
    first sequence         4       int32
    last sequence          4       int32
    first offset           8       int64
    last offset            8       int64
    timestamp              8       int64, the batch's max timestamp
=========================  ======  ==============================================

AutoMQ stores Kafka's snapshot-file bytes instead; this layout holds the same facts plus all five
cached batches, so a retried duplicate of any of them is still recognised after a restart.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import crc32c

from protocol.errors import ErrorCode
from protocol.record_batch import RecordBatchHeader

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 0x7FFFFFFF
BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN (max.in.flight <= 5)
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms

NO_OFFSET = -1
NO_COORDINATOR_EPOCH = -1

SNAPSHOT_VERSION = 2
_SNAPSHOT_HEAD = struct.Struct(">hI")
_SNAPSHOT_BODY_HEAD = struct.Struct(">qi")
_PRODUCER_V1 = struct.Struct(">qhqb")
_PRODUCER = struct.Struct(">qhqqib")
_BATCH = struct.Struct(">iiqqq")


class InvalidProducerSnapshotError(ValueError):
    """Bytes that are not a ``PRODUCER_SNAPSHOTS`` value this code can read."""


@dataclass(slots=True, frozen=True)
class BatchMetadata:
    """What the broker remembers of an appended batch (Kafka's ``BatchMetadata``)."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerStateEntry:
    """One producer's epoch and its last appended batches, oldest first."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    current_txn_first_offset: int = NO_OFFSET  # first offset of its open transaction
    coordinator_epoch: int = NO_COORDINATOR_EPOCH  # of the last marker it got

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The cached batch with exactly this epoch and sequence range, if any."""
        if epoch != self.producer_epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def add_batch(self, epoch: int, batch: BatchMetadata, now_ms: int) -> None:
        """Remember a batch appended at broker time ``now_ms``; a new epoch forgets the old
        epoch's batches."""
        self._set_epoch(epoch)
        self.batches.append(batch)  # the deque's maxlen drops the oldest beyond five
        self.last_timestamp = max(self.last_timestamp, now_ms)

    def _set_epoch(self, epoch: int) -> None:
        if epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = epoch


@dataclass(slots=True, frozen=True)
class CompletedTxn:
    """A transaction its marker closed (Kafka's ``CompletedTxn``): the producer's data from
    ``first_offset`` and the marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(slots=True, frozen=True)
class AppendCheck:
    """The verdict on a partition's batches: append them, answer a duplicate, or an error."""

    error: ErrorCode = ErrorCode.NONE
    duplicate: BatchMetadata | None = None
    message: str | None = None

    @property
    def ok(self) -> bool:
        """True when the batches may be appended."""
        return self.error == ErrorCode.NONE and self.duplicate is None


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether ``next_seq`` directly follows ``last_seq`` (sequences wrap after Int32.MaxValue)."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def has_producer_id(header: RecordBatchHeader) -> bool:
    return header.producer_id > NO_PRODUCER_ID


# the verification guard of a Produce whose producer's transaction was open here when it was
# checked: it needs none while the transaction stays open, and matches no other
OPEN_TXN_GUARD = object()


class ProducerStateManager:
    """The producer state of one partition: checks incoming batches, records appended ones."""

    def __init__(self, entries: Iterable[ProducerStateEntry] = ()) -> None:
        self._producers: dict[int, ProducerStateEntry] = {e.producer_id: e for e in entries}
        # producer id -> first offset of its open transaction
        self._ongoing: dict[int, int] = {
            e.producer_id: e.current_txn_first_offset
            for e in self._producers.values()
            if e.current_txn_first_offset != NO_OFFSET
        }
        # completed transactions whose marker may not be durable yet, in marker order
        self._unstable: deque[CompletedTxn] = deque()
        # producer id -> (guard, when made): the transaction verifications under way
        # (:meth:`verification_guard`)
        self._verifying: dict[int, tuple[object, int]] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerStateEntry]:
        """Every producer's entry, by producer id."""
        return [self._producers[pid] for pid in sorted(self._producers)]

    def verification_guard(self, producer_id: int, now_ms: int) -> object:
        """What a Produce of ``producer_id``'s transactional batches holds while the
        transaction coordinator is asked whether this partition is in the transaction (Kafka's
        ``maybeStartTransactionVerification``): :data:`OPEN_TXN_GUARD` when the transaction
        is open here already, else the producer's guard, made now unless one is under way. A
        marker for the producer, or its transaction opening, ends the guard: the batches are
        then refused at :meth:`check` (a late Produce of a transaction aborted meanwhile would
        otherwise open one here that nothing closes)."""
        if producer_id in self._ongoing:
            return OPEN_TXN_GUARD
        found = self._verifying.get(producer_id)
        if found is not None:
            return found[0]
        guard = object()
        self._verifying[producer_id] = (guard, now_ms)
        return guard

    def check(
        self,
        headers: Sequence[RecordBatchHeader],
        *,
        check_sequence: bool = True,
        guard: object | None = None,
    ) -> AppendCheck:
        """Validate one Produce request's batches for this partition, in order, as if each
        earlier one had been appended. Changes nothing. A coordinator's own batches (offsets
        committed in a transaction) carry no sequence: ``check_sequence`` False checks their
        epoch and transaction state only, as Kafka does for ``AppendOrigin.COORDINATOR``.
        ``guard``, given for a Produce whose transactional batches were verified, must still be
        the producer's (:meth:`verification_guard`) for a batch that opens its transaction.

        A duplicate of a cached batch wins over everything after it, as in Kafka: the request
        is answered with that batch's offsets and nothing of it is appended.
        """
        # (epoch, last sequence) per producer as the batches before would leave it
        pending: dict[int, tuple[int, int]] = {}
        in_txn: set[int] = set()  # producers whose transaction an earlier batch opened
        for h in headers:
            if h.is_control:
                # markers come from the transaction coordinator only (Kafka's LogValidator)
                return AppendCheck(
                    ErrorCode.INVALID_RECORD, message="clients cannot write control batches"
                )
            if not has_producer_id(h):
                if h.is_transactional:
                    return AppendCheck(
                        ErrorCode.INVALID_RECORD,
                        message="a transactional batch without a producer id",
                    )
                continue
            pid, epoch, first_seq = h.producer_id, h.producer_epoch, h.base_sequence
            if not check_sequence:
                current = self._producers.get(pid)
                if current is not None and epoch < current.producer_epoch:
                    return AppendCheck(
                        ErrorCode.INVALID_PRODUCER_EPOCH,
                        message=f"producer {pid} epoch {epoch} is older than the current "
                        f"epoch {current.producer_epoch}",
                    )
                if not h.is_transactional and (pid in in_txn or pid in self._ongoing):
                    return AppendCheck(
                        ErrorCode.INVALID_TXN_STATE,
                        message=f"producer {pid} wrote outside its open transaction",
                    )
                if h.is_transactional:
                    in_txn.add(pid)
                continue
            if first_seq < 0:
                # Kafka's LogValidator: an idempotent batch must carry a sequence
                return AppendCheck(
                    ErrorCode.INVALID_RECORD,
                    message=f"producer {pid} sent a batch without a base sequence",
                )
            current = self._producers.get(pid)
            if current is not None:
                duplicate = current.find_duplicate(epoch, first_seq, h.last_sequence)
                if duplicate is not None:
                    return AppendCheck(duplicate=duplicate)
            if (
                guard is not None
                and h.is_transactional
                and pid not in in_txn
                and pid not in self._ongoing
                and self._verifying.get(pid, (None, 0))[0] is not guard
            ):
                # (Kafka's UnifiedLog: the verification ended before the append)
                return AppendCheck(
                    ErrorCode.INVALID_TXN_STATE,
                    message="Record was not part of an ongoing transaction",
                )
            known_epoch, last_seq = pending.get(
                pid,
                (current.producer_epoch, current.last_seq)
                if current is not None
                else (NO_PRODUCER_EPOCH, NO_SEQUENCE),
            )
            error = _check_epoch_and_sequence(pid, epoch, first_seq, known_epoch, last_seq)
            if error is not None:
                return error
            if not h.is_transactional and (pid in in_txn or pid in self._ongoing):
                return AppendCheck(
                    ErrorCode.INVALID_TXN_STATE,
                    message=f"producer {pid} sent a non-transactional batch while its "
                    "transaction is open",
                )
            if h.is_transactional:
                in_txn.add(pid)
            pending[pid] = (epoch, h.last_sequence)
        return AppendCheck()

    def check_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> AppendCheck:
        """Whether the coordinator's marker for ``producer_id`` may be appended (Kafka's
        ``appendEndTxnMarker`` checks)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return AppendCheck()
        if producer_epoch < entry.producer_epoch:
            return AppendCheck(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                message=f"marker for producer {producer_id} has epoch {producer_epoch}, older "
                f"than its current epoch {entry.producer_epoch}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            return AppendCheck(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                message=f"marker for producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch}",
            )
        return AppendCheck()

    def ongoing_txn_first_offset(self, producer_id: int) -> int:
        """First offset of ``producer_id``'s open transaction here, -1 when none is open."""
        return self._ongoing.get(producer_id, NO_OFFSET)

    def ongoing_first_offsets(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction, for every open one."""
        return dict(self._ongoing)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the oldest transaction not yet decided, or decided by a marker
        not yet durable (below ``high_watermark`` is durable); None when there is none."""
        unstable = self._unstable
        if not unstable and not self._ongoing:
            return None  # (most partitions: every fetch asks)
        while unstable and unstable[0].last_offset < high_watermark:
            unstable.popleft()
        first = min(self._ongoing.values(), default=None)
        if self._unstable:
            oldest = min(t.first_offset for t in self._unstable)
            first = oldest if first is None else min(first, oldest)
        return first

    def update(
        self,
        header: RecordBatchHeader,
        base_offset: int,
        now_ms: int,
        marker: tuple[bool, int] | None = None,
    ) -> CompletedTxn | None:
        """Record a batch now in the log at ``base_offset`` (after an append at broker time
        ``now_ms``, or when replaying the log on open). Batches without a producer id are
        ignored. A control batch needs its ``marker``: ``(is_commit, coordinator_epoch)``;
        closing a non-empty transaction returns it."""
        if not has_producer_id(header):
            return None
        entry = self._producers.get(header.producer_id)
        if entry is None:
            entry = self._producers[header.producer_id] = ProducerStateEntry(header.producer_id)
        if header.is_control:
            if marker is None:
                return None  # an empty control batch (a cleaned transaction): nothing to close
            is_commit, coordinator_epoch = marker
            completed = None
            if entry.current_txn_first_offset != NO_OFFSET:
                completed = CompletedTxn(
                    header.producer_id,
                    entry.current_txn_first_offset,
                    base_offset + header.last_offset_delta,
                    not is_commit,
                )
                self._unstable.append(completed)
            entry._set_epoch(header.producer_epoch)
            entry.coordinator_epoch = coordinator_epoch
            entry.current_txn_first_offset = NO_OFFSET
            entry.last_timestamp = max(entry.last_timestamp, now_ms)
            self._ongoing.pop(header.producer_id, None)
            self._verifying.pop(header.producer_id, None)
            return completed
        if header.is_transactional and entry.current_txn_first_offset == NO_OFFSET:
            entry.current_txn_first_offset = base_offset
            self._ongoing[header.producer_id] = base_offset
            self._verifying.pop(header.producer_id, None)
        entry.add_batch(
            header.producer_epoch,
            BatchMetadata(
                header.base_sequence,
                header.last_sequence,
                base_offset,
                base_offset + header.last_offset_delta,
                header.max_timestamp,
            ),
            now_ms,
        )
        return None

    def expire(self, now_ms: int, max_age_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> int:
        """Forget producers that appended nothing for ``max_age_ms`` (Kafka's
        ``producer.id.expiration.ms``). Returns how many were dropped.

        Kafka measures this on batch timestamps; broker time is used here so that a producer
        writing old create-times (a replay, a backfill) is not forgotten at the next roll."""
        expired = [
            pid
            for pid, e in self._producers.items()
            if now_ms - e.last_timestamp >= max_age_ms and pid not in self._ongoing
        ]
        for pid in expired:
            del self._producers[pid]
        for pid in [p for p, (_, made) in self._verifying.items() if now_ms - made >= max_age_ms]:
            del self._verifying[pid]
        return len(expired)

    def snapshot(self, offset: int) -> bytes:
        """The ``PRODUCER_SNAPSHOTS`` value for this state, covering batches below ``offset``."""
        return encode_snapshot(offset, self.entries())

    @classmethod
    def from_snapshot(cls, buf: bytes | memoryview) -> tuple[ProducerStateManager, int]:
        """The state a snapshot holds and the offset it covers up to."""
        offset, entries = decode_snapshot(buf)
        return cls(entries), offset


def _check_epoch_and_sequence(
    pid: int, epoch: int, first_seq: int, known_epoch: int, last_seq: int
) -> AppendCheck | None:
    """Kafka's ``checkProducerEpoch`` then ``checkSequence``; None when the batch may follow."""
    if epoch < known_epoch:
        return AppendCheck(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            message=f"producer {pid} epoch {epoch} is older than the current epoch {known_epoch}",
        )
    if known_epoch == NO_PRODUCER_EPOCH:
        return None  # unknown producer: any sequence starts it (KIP-360)
    if epoch != known_epoch:
        if first_seq != 0:
            return AppendCheck(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                message=f"producer {pid} starts its new epoch {epoch} at sequence {first_seq}, "
                f"not 0 (current epoch {known_epoch})",
            )
        return None
    if not in_sequence(last_seq, first_seq):
        return AppendCheck(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            message=f"producer {pid} sent sequence {first_seq}, expected "
            f"{0 if last_seq == INT32_MAX else last_seq + 1}",
        )
    return None


def encode_snapshot(offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    """A ``PRODUCER_SNAPSHOTS`` value (layout in the module docstring)."""
    listed = list(entries)
    body = bytearray(_SNAPSHOT_BODY_HEAD.pack(offset, len(listed)))
    for e in listed:
        body += _PRODUCER.pack(
            e.producer_id,
            e.producer_epoch,
            e.last_timestamp,
            e.current_txn_first_offset,
            e.coordinator_epoch,
            len(e.batches),
        )
        for b in e.batches:
            body += _BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp)
    return _SNAPSHOT_HEAD.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + bytes(body)


def decode_snapshot(buf: bytes | memoryview) -> tuple[int, list[ProducerStateEntry]]:
    """``(snapshot offset, entries)``; :class:`InvalidProducerSnapshotError` on bad bytes."""
    view = memoryview(buf)
    if len(view) < _SNAPSHOT_HEAD.size + _SNAPSHOT_BODY_HEAD.size:
        raise InvalidProducerSnapshotError(f"producer snapshot of {len(view)} bytes is too short")
    version, crc = _SNAPSHOT_HEAD.unpack_from(view, 0)
    if version not in (1, SNAPSHOT_VERSION):
        raise InvalidProducerSnapshotError(f"unknown producer snapshot version {version}")
    if crc32c.crc32c(view[_SNAPSHOT_HEAD.size :]) != crc:
        raise InvalidProducerSnapshotError("producer snapshot CRC-32C mismatch")
    pos = _SNAPSHOT_HEAD.size
    offset, count = _SNAPSHOT_BODY_HEAD.unpack_from(view, pos)
    pos += _SNAPSHOT_BODY_HEAD.size
    entries: list[ProducerStateEntry] = []
    try:
        for _ in range(count):
            if version == 1:
                pid, epoch, last_timestamp, n = _PRODUCER_V1.unpack_from(view, pos)
                txn_first, coordinator_epoch = NO_OFFSET, NO_COORDINATOR_EPOCH
                pos += _PRODUCER_V1.size
            else:
                pid, epoch, last_timestamp, txn_first, coordinator_epoch, n = _PRODUCER.unpack_from(
                    view, pos
                )
                pos += _PRODUCER.size
            if not 0 <= n <= BATCHES_TO_RETAIN:
                raise InvalidProducerSnapshotError(f"producer {pid} has {n} cached batches")
            if txn_first < NO_OFFSET:
                raise InvalidProducerSnapshotError(
                    f"producer {pid} has transaction first offset {txn_first}"
                )
            entry = ProducerStateEntry(
                pid,
                epoch,
                last_timestamp=last_timestamp,
                current_txn_first_offset=txn_first,
                coordinator_epoch=coordinator_epoch,
            )
            for _ in range(n):
                entry.batches.append(BatchMetadata(*_BATCH.unpack_from(view, pos)))
                pos += _BATCH.size
            entries.append(entry)
    except struct.error as e:
        raise InvalidProducerSnapshotError(f"producer snapshot is truncated: {e}") from e
    if pos != len(view):
        raise InvalidProducerSnapshotError(f"{len(view) - pos} trailing bytes in producer snapshot")
    return offset, entries
