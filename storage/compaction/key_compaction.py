"""Key compaction (pure): Kafka's log cleaner over the batches of the segments being cleaned.

``cleanup.policy=compact`` keeps the last record of every key. A Spark job reads a partition's
sealed segments, calls :func:`build_offset_map` over the dirty range and :func:`clean_batches`
once per group of segments (oldest first, passing ``txn_state`` on), and hands each result to
the broker, which swaps it in as one ``.cleaned`` segment. No I/O and no clock here: the time is
``now_ms``, as Kafka's ``Cleaner.doClean(cleanable, currentTime)``.

The rules, as Apache Kafka 3.9 has them (``core/src/main/scala/kafka/log/LogCleaner.scala``:
``Cleaner.buildOffsetMap``, ``cleanSegments``, ``cleanInto`` and its ``RecordFilter``,
``shouldRetainRecord``, ``CleanedTransactionMetadata``; ``clients/.../record/MemoryRecords.java``:
``filterTo``, ``buildRetainedRecordsInto``):

* **Offset map.** Over the dirty range, the last offset of every key, from data records of
  batches not in an aborted transaction; control batches and aborted data do not count.
* **Records.** A data record at or beyond ``clean_up_to`` stays (Kafka's ``pastLatestOffset``).
  Below it, a record without a key goes; a record stays if no later offset of its key is in the
  map, and, being a tombstone (null value), only while its batch's delete horizon has not come.
* **Aborted transactions.** Their data batches go whole (``BatchRetention.DELETE``), whatever
  the keys.
* **Delete horizon (KIP-534).** The first cleaning that keeps a tombstone in a batch, or keeps a
  transaction marker whose transaction has no data left, sets the batch's delete horizon to
  ``now + delete.retention.ms``: baseTimestamp becomes the horizon and attribute bit 6 is set
  (record timestamps do not change). A cleaning at or after the horizon drops the tombstones
  (``now >= horizon``) and the marker (``horizon <= now``).
* **Transaction markers** stay while a data batch of their transaction was read in this round
  (a COMMIT whose producer had a transactional batch since the last marker; an ABORT whose
  aborted transaction had a batch read), and after that until their delete horizon; other
  control records (KRaft's) always stay. An aborted transaction whose ABORT marker stays is
  listed in ``CleanedSegment.aborted_txns`` (the cleaned segment's transaction index).
* **Empty batches (``RETAIN_EMPTY``).** A batch that holds an active producer's last data
  offset, or its last marker when its epoch's last entry is a marker, stays even when all its
  records go, as a bare header (producer id, epoch, base sequence, offsets, max timestamp kept;
  no codec, no horizon), so the producer's sequence and epoch survive (KAFKA-5490, KAFKA-8335).
* **Encoding.** A batch that loses no record and needs no new horizon is copied byte for byte;
  otherwise it is rebuilt at its base offset with its lastOffsetDelta, producer id, epoch, base
  sequence, partition leader epoch, timestamp type, transactional/control bits and codec, the
  kept records at their own offsets and timestamps, the CRC recomputed.

The ``.cleaned`` segment (AutoMQ, seed 003): Kafka offset ``o`` of a segment lies at stream
offset ``log.start + (o - base_offset)``, so the ``log.cleaned`` stream slice must be as long as
the segment's offset span. Each kept batch is one stream record batch covering ``count`` stream
offsets: from the end of the previous kept batch (the segment base for the first) to its own
end (``base_offset + lastOffsetDelta + 1``), the compacted hole before it included. A fetch in a
hole then returns the next kept batch, as Kafka's would.

**The tail.** The last batch of every cleaned segment stays, as an empty batch if all its
records go: Kafka's rule for the last batch of a cleaning round (KAFKA-17076, backported to the
3.9 branch), applied to every segment, because here each segment must keep its end. The counts
then add up to exactly ``[base_offset, end_offset)`` with ``end_offset`` the original next
offset, and every stream batch's header ends where its stream range ends: a consumer that gets
the last batch moves past it (its nextOffset is the segment end), whereas a count stretched over
a tail hole would hand it a batch whose offsets all lie before its fetch position, again and
again.

Kafka differences: the map holds keys, not 16-byte MD5 digests, and is never full; magic 0/1
batches (``legacyDeleteHorizonMs``) do not exist here; an aborted transaction ends at its
marker's offset even when the marker itself is gone, so a transaction index entry that outlived
its marker (Kafka rewrites the index from ``aborted_txns``; a cleaned segment that keeps the old
index does not) never takes the producer's later transactions for aborted.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

from protocol import record_batch
from protocol.control_records import (
    ControlRecordType,
    InvalidControlRecordError,
    decode_control_key,
)
from protocol.record_batch import DELETE_HORIZON_BIT, RecordBatchHeader
from protocol.records import Compression, Record, encode_batch, parse_records

_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_EMPTY_BATCH_BITS = _TIMESTAMP_TYPE_BIT | _TRANSACTIONAL_BIT | _CONTROL_BIT

BatchBytes = bytes | bytearray | memoryview


class AbortedRange(Protocol):
    """An aborted transaction as the transaction index records it (``AbortedTxn``)."""

    @property
    def producer_id(self) -> int: ...

    @property
    def first_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...  # the offset of its ABORT marker


@dataclass(slots=True, frozen=True)
class ProducerLastRecord:
    """Kafka's ``LastRecord`` of an active producer: its last data offset in its current epoch
    (None when that epoch has only markers) and that epoch."""

    last_data_offset: int | None
    producer_epoch: int


@dataclass(slots=True, frozen=True)
class TxnCleaningState:
    """Kafka's ``CleanedTransactionMetadata`` between two groups of one cleaning round: pass a
    group's ``CleanedSegment.txn_state`` to the cleaning of the next group."""

    pending: tuple[AbortedRange, ...] = ()  # aborted txns not reached yet
    aborted: tuple[tuple[AbortedRange, bool], ...] = ()  # ongoing aborted txns, batch read?
    committed: frozenset[int] = frozenset()  # producers with a transactional batch read


@dataclass(slots=True, frozen=True)
class KeptBatch:
    """One stream record batch of the cleaned segment: the Kafka batch ``data`` (its original
    base offset) covering ``count`` stream offsets, the hole before it included."""

    base_offset: int
    count: int
    data: bytes

    @property
    def end_offset(self) -> int:
        """The Kafka offset after this batch (and after its stream range)."""
        return self.base_offset + record_batch.parse_header(self.data).last_offset_delta + 1


@dataclass(slots=True, frozen=True)
class CleaningStats:
    """The figures of one cleaning (Kafka's ``CleanerStats`` and a little more)."""

    batches_read: int = 0
    batches_kept: int = 0
    empty_batches_kept: int = 0
    records_read: int = 0
    records_kept: int = 0
    records_superseded: int = 0  # a later offset of the key is in the map
    records_aborted: int = 0
    records_without_key: int = 0
    tombstones_kept: int = 0
    tombstones_dropped: int = 0  # past their delete horizon
    markers_kept: int = 0
    markers_dropped: int = 0
    bytes_read: int = 0
    bytes_kept: int = 0


@dataclass(slots=True, frozen=True)
class CleanedSegment:
    """What one cleaning keeps of segments ``[base_offset, end_offset)``: the batches, whose
    counts add up to ``end_offset - base_offset``, the aborted transactions its transaction
    index keeps, the figures, and the transaction state for the round's next group."""

    base_offset: int
    end_offset: int
    batches: tuple[KeptBatch, ...]
    aborted_txns: tuple[AbortedRange, ...]
    stats: CleaningStats
    txn_state: TxnCleaningState


def build_offset_map(
    batches: Iterable[BatchBytes],
    *,
    aborted: Iterable[AbortedRange],
    up_to: int,
    start: int = 0,
) -> dict[bytes, int]:
    """The last offset of every key in ``[start, up_to)`` (Kafka's ``buildOffsetMap`` over the
    dirty range): data records of committed or non-transactional batches only.

    ``batches``: the range's stored batches in offset order, each item one or more whole
    batches; ``aborted``: the aborted transactions overlapping the range. Maps of consecutive
    ranges merge with ``|`` (the later wins), each built with its own overlapping aborted txns.
    """
    tracker = _TxnTracker(TxnCleaningState(), aborted)
    latest: dict[bytes, int] = {}
    for header, data in _batches(batches):
        if header.base_offset >= up_to:
            break
        if header.is_control:
            records = parse_records(data)
            tracker.on_control_batch(header, records[0] if records else None)
            continue
        if tracker.on_data_batch(header):
            continue  # aborted: its keys do not count
        for r in parse_records(data):
            if r.key is not None and start <= r.offset < up_to:
                latest[r.key] = r.offset
    return latest


def last_records_of_producers(batches: Iterable[BatchBytes]) -> dict[int, ProducerLastRecord]:
    """Every producer's :class:`ProducerLastRecord` as a replay of the whole log gives it (what
    Kafka reads from its producer state, ``lastRecordsOfActiveProducers``), for a caller without
    the partition's producer state: a new epoch forgets the data offsets of the previous one."""
    last: dict[int, ProducerLastRecord] = {}
    for header, _ in _batches(batches):
        if header.producer_id < 0:
            continue
        entry = last.get(header.producer_id)
        if entry is None or entry.producer_epoch != header.producer_epoch:
            entry = ProducerLastRecord(None, header.producer_epoch)
        if not header.is_control:
            entry = ProducerLastRecord(header.last_offset, header.producer_epoch)
        last[header.producer_id] = entry
    return last


def clean_batches(
    batches: Iterable[BatchBytes],
    offset_map: Mapping[bytes, int],
    *,
    segment_base: int,
    clean_up_to: int,
    aborted: Iterable[AbortedRange],
    delete_retention_ms: int,
    now_ms: int,
    active_producers: Mapping[int, ProducerLastRecord],
    txn_state: TxnCleaningState | None = None,
) -> CleanedSegment:
    """Clean one group of segments into one ``.cleaned`` segment by Kafka's rules (see the
    module docstring).

    ``batches``: the group's stored batches in offset order (each item one or more whole
    batches); ``segment_base``: the group's first segment's base offset (its first batch may
    start later, after an earlier cleaning); ``offset_map``: :func:`build_offset_map` of the
    round's dirty range, which ends at ``clean_up_to``; ``aborted``: the aborted transactions
    overlapping the group; ``active_producers``: each active producer's last record (from the
    producer state, or :func:`last_records_of_producers`); ``txn_state``: the previous group's,
    for every group of a round after the first.
    """
    views = list(_batches(batches))
    _check_order(views, segment_base)
    tracker = _TxnTracker(txn_state or TxnCleaningState(), aborted)
    rules = _Rules(offset_map, clean_up_to, delete_retention_ms, now_ms, active_producers)
    tally = _Tally()
    kept: list[KeptBatch] = []
    covered = segment_base
    for i, (header, data) in enumerate(views):
        out = rules.filter_batch(header, data, tracker, tally, last_in_segment=i == len(views) - 1)
        if out is None:
            continue
        end = header.last_offset + 1
        kept.append(KeptBatch(header.base_offset, end - covered, bytes(out)))
        covered = end
    return CleanedSegment(
        base_offset=segment_base,
        end_offset=covered,
        batches=tuple(kept),
        aborted_txns=tuple(tracker.kept_aborted),
        stats=tally.freeze(),
        txn_state=tracker.state(),
    )


# -- the filter (Kafka's RecordFilter in Cleaner.cleanInto) ---------------------------------------


class _Retention(enum.Enum):
    """Kafka's ``RecordFilter.BatchRetention``."""

    DELETE = "delete"  # the batch goes without a look at its records
    RETAIN_EMPTY = "retain empty"  # the batch stays, if need be without records
    DELETE_EMPTY = "delete empty"  # the batch goes if no record stays


class _Verdict(enum.Enum):
    KEEP = "keep"
    SUPERSEDED = "superseded"
    EXPIRED_TOMBSTONE = "expired tombstone"
    NO_KEY = "no key"


@dataclass(slots=True)
class _Tally:
    """The figures while cleaning; frozen into :class:`CleaningStats` at the end."""

    counts: dict[str, int] = field(
        default_factory=lambda: {f.name: 0 for f in fields(CleaningStats)}
    )

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def freeze(self) -> CleaningStats:
        return CleaningStats(**self.counts)


@dataclass(slots=True, frozen=True)
class _Rules:
    offset_map: Mapping[bytes, int]
    clean_up_to: int
    delete_retention_ms: int
    now_ms: int
    active_producers: Mapping[int, ProducerLastRecord]

    def filter_batch(
        self,
        header: RecordBatchHeader,
        data: memoryview,
        tracker: _TxnTracker,
        tally: _Tally,
        *,
        last_in_segment: bool,
    ) -> BatchBytes | None:
        """The batch as the cleaned segment keeps it, or None (``MemoryRecords.filterTo`` for
        one batch, with the cleaner's ``checkBatchRetention`` and ``shouldRetainRecord``)."""
        tally.add("batches_read")
        tally.add("records_read", header.records_count)
        tally.add("bytes_read", header.size)
        records: list[Record] | None = None
        if header.is_control:
            records = parse_records(data)
            can_discard = tracker.on_control_batch(header, records[0] if records else None)
            horizon = header.delete_horizon_ms
            discard_records = can_discard and horizon is not None and horizon <= self.now_ms
        else:
            can_discard = tracker.on_data_batch(header)
            discard_records = can_discard
        if (header.producer_id >= 0 and self._is_last_of_producer(header)) or last_in_segment:
            retention = _Retention.RETAIN_EMPTY
        elif discard_records:
            retention = _Retention.DELETE
        else:
            retention = _Retention.DELETE_EMPTY
        marker_of_empty_txn = can_discard and header.is_control

        if header.is_control:
            tally.add("markers_dropped" if discard_records else "markers_kept", len(records or ()))
        elif can_discard:
            tally.add("records_aborted", header.records_count)
        if retention is _Retention.DELETE:
            return None

        if records is None:
            records = parse_records(data)
        kept = [] if discard_records else self._kept_records(header, records, tally)
        if kept:
            tally.add("batches_kept")
            tally.add("records_kept", len(kept))
            has_tombstones = any(r.value is None for r in kept)
            set_horizon = (has_tombstones or marker_of_empty_txn) and (
                header.delete_horizon_ms is None
            )
            if len(kept) == len(records) and not set_horizon:
                tally.add("bytes_kept", header.size)
                return data
            horizon = (
                self.now_ms + self.delete_retention_ms if set_horizon else header.delete_horizon_ms
            )
            out = _rebuild(header, kept, horizon)
            tally.add("bytes_kept", len(out))
            return out
        if retention is _Retention.RETAIN_EMPTY:
            tally.add("batches_kept")
            tally.add("empty_batches_kept")
            out = _empty_batch(header)
            tally.add("bytes_kept", len(out))
            return out
        return None

    def _is_last_of_producer(self, header: RecordBatchHeader) -> bool:
        """Kafka's ``isBatchLastRecordOfProducer``: the batch with the producer's last data
        offset, or, when its epoch's last entry is a marker, a marker of that epoch."""
        last = self.active_producers.get(header.producer_id)
        if last is None:
            return False
        if last.last_data_offset is not None:
            return header.last_offset == last.last_data_offset
        return header.is_control and header.producer_epoch == last.producer_epoch

    def _kept_records(
        self, header: RecordBatchHeader, records: Sequence[Record], tally: _Tally
    ) -> list[Record]:
        if header.is_control:
            return list(records)  # a marker's fate is its batch's
        kept = []
        for r in records:
            verdict = self._verdict(header, r)
            if verdict is _Verdict.KEEP:
                kept.append(r)
                if r.value is None:
                    tally.add("tombstones_kept")
            elif verdict is _Verdict.SUPERSEDED:
                tally.add("records_superseded")
            elif verdict is _Verdict.EXPIRED_TOMBSTONE:
                tally.add("tombstones_dropped")
            else:
                tally.add("records_without_key")
        return kept

    def _verdict(self, header: RecordBatchHeader, r: Record) -> _Verdict:
        """Kafka's ``Cleaner.shouldRetainRecord`` for a magic-v2 data record."""
        if r.offset >= self.clean_up_to:
            return _Verdict.KEEP  # beyond the map: not cleaned in this round
        if r.key is None:
            return _Verdict.NO_KEY
        if r.offset < self.offset_map.get(r.key, -1):
            return _Verdict.SUPERSEDED
        horizon = header.delete_horizon_ms
        if r.value is None and horizon is not None and self.now_ms >= horizon:
            return _Verdict.EXPIRED_TOMBSTONE
        return _Verdict.KEEP


def _rebuild(header: RecordBatchHeader, kept: Sequence[Record], horizon: int | None) -> bytearray:
    """Kafka's ``buildRetainedRecordsInto``: the kept records in a batch like the original, at
    its base offset and last offset; baseTimestamp is the delete horizon when there is one, else
    the first kept record's timestamp; maxTimestamp is the kept records' largest (the original's
    under LOG_APPEND_TIME, whose records all read it)."""
    attributes = header.attributes & ~DELETE_HORIZON_BIT
    if horizon is not None:
        attributes |= DELETE_HORIZON_BIT
    log_append_time = bool(header.attributes & _TIMESTAMP_TYPE_BIT)
    return encode_batch(
        kept,
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=kept[0].timestamp if horizon is None else horizon,
        max_timestamp=header.max_timestamp if log_append_time else max(r.timestamp for r in kept),
        attributes=attributes,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
    )


def _empty_batch(header: RecordBatchHeader) -> bytearray:
    """Kafka's ``DefaultRecordBatch.writeEmptyHeader``: no records, no codec, no horizon,
    baseTimestamp -1; offsets, producer fields, max timestamp and type bits kept."""
    return encode_batch(
        [],
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=-1,
        max_timestamp=header.max_timestamp,
        attributes=(header.attributes & _EMPTY_BATCH_BITS) | Compression.NONE,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
    )


# -- transactions (Kafka's CleanedTransactionMetadata) ---------------------------------------------


@dataclass(slots=True)
class _OngoingAbort:
    txn: AbortedRange
    batch_read: bool = False


class _TxnTracker:
    """Which transaction each batch belongs to, as the cleaner walks the log in offset order;
    decides when a marker may go and which aborted transactions the cleaned index keeps."""

    def __init__(self, state: TxnCleaningState, aborted: Iterable[AbortedRange]) -> None:
        self._order = itertools.count()
        self._pending: list[tuple[int, int, AbortedRange]] = []  # min-heap by first offset
        self._aborted = {t.producer_id: _OngoingAbort(t, read) for t, read in state.aborted}
        self._committed = set(state.committed)
        self.kept_aborted: list[AbortedRange] = []
        # the index lists a transaction for every group it overlaps: a second copy is dropped
        # when it comes up (already ongoing, or over)
        for txn in itertools.chain(state.pending, aborted):
            heapq.heappush(self._pending, (txn.first_offset, next(self._order), txn))

    def on_data_batch(self, header: RecordBatchHeader) -> bool:
        """Kafka's ``onBatchRead``: True when the batch is in an aborted transaction."""
        self._advance_to(header)
        if not header.is_transactional:
            return False
        ongoing = self._aborted.get(header.producer_id)
        if ongoing is None:
            self._committed.add(header.producer_id)
            return False
        ongoing.batch_read = True
        return True

    def on_control_batch(self, header: RecordBatchHeader, first: Record | None) -> bool:
        """Kafka's ``onControlBatchRead``: True when the marker may go (once its delete horizon
        has passed): no batch of its transaction was read. An empty control batch was a marker
        already cleaned away."""
        self._advance_to(header)
        if first is None:
            return True
        try:
            control_type = decode_control_key(first.key)
        except InvalidControlRecordError:
            return False  # Kafka's UNKNOWN: kept
        if control_type == ControlRecordType.ABORT:
            ongoing = self._aborted.pop(header.producer_id, None)
            if ongoing is not None and ongoing.batch_read:
                self.kept_aborted.append(ongoing.txn)
                return False
            return True
        if control_type == ControlRecordType.COMMIT:
            if header.producer_id in self._committed:
                self._committed.discard(header.producer_id)
                return False
            return True
        return False

    def _advance_to(self, header: RecordBatchHeader) -> None:
        """Start the aborted transactions that begin by the end of the batch (Kafka's
        ``consumeAbortedTxnsUpTo``) and end those whose ABORT marker lay before it. Kafka ends
        them at their marker only; here an index entry may outlive its marker (cleaned away) and
        must not take the producer's later transactions for aborted."""
        while self._pending and self._pending[0][0] <= header.last_offset:
            _, _, txn = heapq.heappop(self._pending)
            if txn.last_offset >= header.base_offset:
                self._aborted.setdefault(txn.producer_id, _OngoingAbort(txn))
        for pid in [p for p, o in self._aborted.items() if o.txn.last_offset < header.base_offset]:
            del self._aborted[pid]

    def state(self) -> TxnCleaningState:
        return TxnCleaningState(
            pending=tuple(t for _, _, t in sorted(self._pending, key=lambda p: p[:2])),
            aborted=tuple((o.txn, o.batch_read) for o in self._aborted.values()),
            committed=frozenset(self._committed),
        )


# -- input -----------------------------------------------------------------------------------------


def _batches(chunks: Iterable[BatchBytes]) -> Iterator[tuple[RecordBatchHeader, memoryview]]:
    for chunk in chunks:
        yield from record_batch.iter_batches(chunk)


def _check_order(views: Sequence[tuple[RecordBatchHeader, memoryview]], base: int) -> None:
    end = base
    for header, _ in views:
        if header.base_offset < end or header.last_offset_delta < 0:
            raise ValueError(
                f"batch [{header.base_offset}, {header.last_offset}] does not follow offset {end}"
            )
        end = header.last_offset + 1
