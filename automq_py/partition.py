"""Partition: a topic partition led by this broker, over its ElasticLog.

Produce: the records blob is split into batches, each validated (magic v2, sizes, CRC32C),
copied once into a writable buffer, given its base offset and leader epoch in place (outside
the CRC) and appended. A batch holding records Kafka's LogValidator refuses (keyless ones for a
compacted topic, timestamps out of bounds) fails whole, naming each of those records
(KIP-467's record_errors) so the client can tell them from the rest. Appends to one partition
are serialized up to the start of their WAL writes, so offsets are assigned in order; the wait
for durability runs concurrently, so one request's batches and the next request's share group
commits. The log end offset (assigned) runs ahead of the high watermark (durable); reads and
acknowledgements follow the high watermark, and every advance of it wakes the fetches waiting
on this partition.

Idempotent producers: under the append lock, before any offset is assigned, the batches are
checked against the log's producer state (:mod:`automq_py.producer_state`), which records each
batch when its append starts. A retried batch the partition already holds is answered with its
original base offset, once that batch is durable, and not appended again; an out-of-order
sequence or a fenced epoch fails the whole request for this partition.

Transactions: the producer state opens a producer's transaction at its first transactional
batch; the transaction coordinator closes it with a marker (:meth:`Partition.append_marker`),
under the same lock. An ABORT marker first adds the transaction to the log's
aborted-transaction index, then is appended itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from automq_py.log.elastic_log import ElasticLog
from automq_py.log.log_config import LogConfig
from automq_py.log.txn_index import AbortedTxn
from protocol import control_records, record_batch
from protocol.errors import ErrorCode
from protocol.produce import RecordError
from protocol.record_batch import (
    InvalidRecordBatchError,
    InvalidRecordsError,
    LegacyMessageSetError,
)
from protocol.records import check_records, encode_batch, parse_records
from storage.config_def import LONG_MAX

log = logging.getLogger("automq.replica")


@dataclass(slots=True, frozen=True)
class AppendResult:
    error: ErrorCode
    base_offset: int = -1
    log_start_offset: int = -1
    message: str | None = None
    # the broker's time stamped on the batches (a LogAppendTime topic), else -1
    log_append_time_ms: int = -1
    # the records that made a batch fail (KIP-467), in batch order
    record_errors: tuple[RecordError, ...] = ()


@dataclass(slots=True, frozen=True)
class PendingAppend:
    """An append under way: ``durable`` is done once its batches are (or failed with the
    log's error). Callers chain on ``durable`` itself: one more future in between would cost
    the response one more pass of the event loop."""

    durable: asyncio.Future[None]
    base_offset: int
    partition: Partition
    log_append_time_ms: int = -1
    # called by the storage once ``durable`` is settled, as it sets it done or failed (None:
    # this append's storage does not, a duplicate's wait)
    listeners: list[Callable[[], object]] | None = None

    def when_durable(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once, when ``durable`` is done: right away if it is, else as the
        storage settles the write, in the same pass of the event loop (a done callback runs a
        pass later, behind the requests read meanwhile); a duplicate's wait, from its done
        callback."""
        if self.durable.done():
            callback()
        elif self.listeners is not None:
            self.listeners.append(callback)
        else:
            self.durable.add_done_callback(lambda _: callback())

    def result(self) -> AppendResult:
        """The append's result once ``durable`` is done; raises what failed it."""
        self.durable.result()
        return self.expected_result()

    def expected_result(self) -> AppendResult:
        """The append's result should ``durable`` complete: its offsets, and the log start
        offset as of now (Kafka's, too, is the one at the append)."""
        return AppendResult(
            ErrorCode.NONE,
            self.base_offset,
            self.partition.log_start_offset,
            log_append_time_ms=self.log_append_time_ms,
        )


class Partition:
    def __init__(
        self, topic: str, index: int, log: ElasticLog, leader_epoch: int, max_message_bytes: int
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.leader_epoch = leader_epoch
        self.max_message_bytes = max_message_bytes
        self._append_lock = asyncio.Lock()
        # fetches waiting for data, and appends (duplicates) waiting for an offset to be durable
        self._data_waiters: set[asyncio.Future[None]] = set()
        self._durable_waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        return self.log.last_stable_offset

    async def append_records(
        self, records: memoryview, *, from_coordinator: bool = False
    ) -> AppendResult:
        """Validate and append a Produce request's records; return once they are durable.
        ``from_coordinator``: a coordinator's own records (Kafka's ``AppendOrigin.COORDINATOR``),
        whose producer batches carry no sequence numbers."""
        started = await self.start_append(records, from_coordinator=from_coordinator)
        if isinstance(started, AppendResult):
            return started
        await asyncio.shield(started.durable)
        return started.result()

    async def start_append(
        self,
        records: memoryview,
        deadline: float | None = None,
        *,
        from_coordinator: bool = False,
        guard: object | None = None,
    ) -> AppendResult | PendingAppend:
        """Validate a Produce request's records for this partition and start their append:
        an :class:`AppendResult` when the answer is known now (invalid, rejected), else a
        :class:`PendingAppend`, durable once every batch is. Raises what the log raises
        when an append cannot start (the caller maps it to the partition's error), and
        ``TimeoutError`` when it could not start by ``deadline`` (event-loop time: the
        partition's lock or the WAL cache's room waited for too long; no batch was appended
        then, or only the first ones, which complete as usual). ``guard``: the transaction
        verification the Produce holds, if it verified its transactional batches
        (:meth:`~automq_py.producer_state.ProducerStateManager.verification_guard`)."""
        try:
            batches = list(record_batch.iter_batches(records))
            if not batches:
                raise InvalidRecordBatchError("no record batch in the produce request")
            config = self.log.config
            now_ms = int(time.time() * 1000)
            for header, view in batches:
                if header.size > self.max_message_bytes:
                    return AppendResult(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        message=f"batch of {header.size} bytes exceeds max.message.bytes "
                        f"{self.max_message_bytes}",
                    )
                record_batch.validate_batch(view, header=header)
                # as Kafka's LogValidator reads every record it appends
                check_records(view, header)
                invalid = invalid_records(
                    view,
                    f"{self.topic}-{self.index}",
                    compact=config.compact and not header.is_control,
                    bounds=_timestamp_bounds(config, now_ms),
                )
                if invalid is not None:
                    code, message, errors = invalid
                    return AppendResult(
                        code, -1, self.log_start_offset, message, record_errors=errors
                    )
            target = _TARGET_CODEC.get(config.compression_type)
            if target is not None:
                level = _compression_level(config, target)
                batches = [
                    (header, view)
                    if header.attributes & 0x07 == target
                    else _recompressed(header, view, target, level)
                    for header, view in batches
                ]
                for header, _ in batches:  # (recompressed, a batch may have grown past it)
                    if header.size > self.max_message_bytes:
                        return AppendResult(
                            ErrorCode.MESSAGE_TOO_LARGE,
                            message=f"batch of {header.size} bytes, recompressed, exceeds "
                            f"max.message.bytes {self.max_message_bytes}",
                        )
        except LegacyMessageSetError as e:
            return AppendResult(ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, message=str(e))
        except InvalidRecordsError as e:
            return AppendResult(ErrorCode.INVALID_RECORD, message=str(e))
        except InvalidRecordBatchError as e:
            return AppendResult(ErrorCode.CORRUPT_MESSAGE, message=str(e))
        if (
            len(batches) == 1
            and not self._append_lock.locked()
            and config.message_timestamp_type != "LogAppendTime"
        ):
            started = self._append_now(
                *batches[0], check_sequence=not from_coordinator, guard=guard
            )
            if started is not None:
                return started
        loop = asyncio.get_running_loop()
        if self._append_lock.locked() and deadline is not None:
            await asyncio.wait_for(self._append_lock.acquire(), deadline - loop.time())
        else:
            await self._append_lock.acquire()
        try:
            refused = self._check_producers(
                [header for header, _ in batches], check_sequence=not from_coordinator, guard=guard
            )
            if refused is not None:
                return refused
            first = -1
            durable: asyncio.Future[None] | None = None
            append_time = now_ms if config.message_timestamp_type == "LogAppendTime" else -1
            listeners: list[Callable[[], object]] = []
            last_batch = batches[-1][1]
            for header, view in batches:
                base = self.log.log_end_offset
                # a writable batch is the request's own memory: its offsets are set in place
                buf = view if not view.readonly else memoryview(bytearray(view))
                record_batch.assign_offsets(buf, base, self.leader_epoch)
                if append_time >= 0:
                    record_batch.set_log_append_time(buf, append_time)
                durable = await self.log.start_append(
                    buf,
                    base_offset=base,
                    record_count=header.last_offset_delta + 1,
                    max_timestamp=header.max_timestamp if append_time < 0 else append_time,
                    first_timestamp=header.base_timestamp,
                    # only the first batch may time out: a request is never half appended
                    # for lack of room
                    timeout=None if deadline is None or first >= 0 else deadline - loop.time(),
                    # the last batch durable means every one before it is
                    on_done=partial(_fire, listeners) if view is last_batch else None,
                )
                if first < 0:
                    first = base
        finally:
            self._append_lock.release()
        assert durable is not None
        return self._pending(durable, first, append_time, listeners)

    def _check_producers(
        self,
        headers: list[record_batch.RecordBatchHeader],
        *,
        check_sequence: bool,
        guard: object | None = None,
    ) -> AppendResult | PendingAppend | None:
        """The answer when the producer state refuses the batches or already holds them (a
        duplicate, answered once the original is durable); None when they may be appended."""
        check = self.log.producer_state.check(headers, check_sequence=check_sequence, guard=guard)
        if check.duplicate is not None:
            # the original may still be on its way to the WAL: answer once it is durable, with
            # its offsets and, as Kafka's UnifiedLog answers a duplicate, its max timestamp as
            # the log append time (the append time on a LogAppendTime topic)
            duplicate = check.duplicate
            return PendingAppend(
                self.wait_durable(duplicate.last_offset + 1),
                duplicate.first_offset,
                self,
                duplicate.timestamp,
            )
        if check.error != ErrorCode.NONE:
            # as Kafka's ReplicaManager logs an append a producer's state refuses: the client
            # acts on it (librdkafka bumps its epoch on OUT_OF_ORDER_SEQUENCE_NUMBER)
            log.warning(
                "append to %s-%d refused: %s: %s",
                self.topic,
                self.index,
                check.error.name,
                check.message,
            )
            return AppendResult(check.error, message=check.message)
        return None

    def _pending(
        self,
        durable: asyncio.Future[None],
        first: int,
        append_time: int,
        listeners: list[Callable[[], object]],
    ) -> PendingAppend:
        """The append whose last batch's durability is ``durable``; ``listeners`` are what
        that batch's ``on_done`` fires."""
        # the last batch durable means every one before it is; its listeners wake the reads
        # waiting for the high watermark first
        if durable.done():
            self._on_durable(durable)
        else:
            listeners.insert(0, partial(self._on_durable, durable))
        return PendingAppend(durable, first, self, append_time, listeners)

    def _append_now(
        self,
        header: record_batch.RecordBatchHeader,
        view: memoryview,
        *,
        check_sequence: bool,
        guard: object | None = None,
    ) -> AppendResult | PendingAppend | None:
        """The append of a request's one batch (validated, with the broker's timestamps not
        set in it), in one pass, when nothing has to wait: no other append holds the
        partition, the log need not roll and the WAL cache has room. None when something
        must: then nothing was appended, and the caller takes the lock and waits. Nothing
        here yields, so no other append comes between the check and the offsets taken."""
        refused = self._check_producers([header], check_sequence=check_sequence, guard=guard)
        if refused is not None:
            return refused
        if view.readonly:
            return None
        base = self.log.log_end_offset
        record_batch.assign_offsets(view, base, self.leader_epoch)
        listeners: list[Callable[[], object]] = []
        durable = self.log.append_now(view, header, base, partial(_fire, listeners))
        if durable is None:
            return None  # (the offsets set in place are set again, the same)
        return self._pending(durable, base, -1, listeners)

    async def append_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool
    ) -> AppendResult | PendingAppend:
        """Start the append of the coordinator's COMMIT or ABORT marker for ``producer_id``'s
        transaction here (Kafka's WriteTxnMarkers, on the leader): an :class:`AppendResult`
        when it is refused (fenced producer epoch or coordinator epoch), else the
        :class:`PendingAppend` of the marker batch."""
        async with self._append_lock:
            state = self.log.producer_state
            check = state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            if check.error != ErrorCode.NONE:
                return AppendResult(check.error, message=check.message)
            base = self.log.log_end_offset
            first = state.ongoing_txn_first_offset(producer_id)
            if not commit and first >= 0:
                # the LSO once this marker is in: the oldest other undecided transaction's
                # first offset, or just past the marker (Kafka's lastStableOffset(completedTxn))
                others = [
                    o for pid, o in state.ongoing_first_offsets().items() if pid != producer_id
                ]
                await self.log.add_aborted_txn(
                    AbortedTxn(producer_id, first, base, min(others, default=base + 1))
                )
            batch = control_records.build_marker_batch(
                commit,
                producer_id,
                producer_epoch,
                coordinator_epoch,
                int(time.time() * 1000),
                base_offset=base,
                partition_leader_epoch=self.leader_epoch,
            )
            header = record_batch.parse_header(batch)
            durable = await self.log.start_append(
                memoryview(batch),
                base_offset=base,
                record_count=1,
                max_timestamp=header.max_timestamp,
                first_timestamp=header.base_timestamp,
            )
        durable.add_done_callback(self._on_durable)
        return PendingAppend(durable, base, self)

    def _on_durable(self, durable: asyncio.Future[None]) -> None:
        """The high watermark moved (or the log failed): wake whoever waits on it."""
        for waiter in self._data_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._data_waiters.clear()
        if self._durable_waiters:
            hw = self.high_watermark
            failed = durable.exception() if not durable.cancelled() else None
            keep = []
            for offset, waiter in self._durable_waiters:
                if waiter.done():
                    continue
                if offset <= hw:
                    waiter.set_result(None)
                elif failed is not None:
                    waiter.set_exception(failed)
                else:
                    keep.append((offset, waiter))
            self._durable_waiters = keep

    def wait_durable(self, offset: int) -> asyncio.Future[None]:
        """A future done once the high watermark reaches ``offset``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if offset <= self.high_watermark:
            waiter.set_result(None)
        else:
            self._durable_waiters.append((offset, waiter))
        return waiter

    def add_data_waiter(self, waiter: asyncio.Future[None]) -> None:
        """Complete ``waiter`` when the high watermark next moves (a delayed fetch)."""
        self._data_waiters.add(waiter)

    def remove_data_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._data_waiters.discard(waiter)

    async def read(
        self, offset: int, max_bytes: int, max_offset: int | None = None, *, min_one: bool = True
    ) -> list[memoryview]:
        return await self.log.read(offset, max_bytes, max_offset=max_offset, min_one=min_one)


# compression.type -> the codec a batch is stored with (producer: as it came)
_TARGET_CODEC = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _compression_level(config: LogConfig, codec: int) -> int | None:
    """The topic's compression.<codec>.level (None: the codec's default; gzip's -1 is)."""
    if codec == 1:
        return None if config.compression_gzip_level == -1 else config.compression_gzip_level
    if codec == 3:
        return config.compression_lz4_level
    if codec == 4:
        return config.compression_zstd_level
    return None


def _recompressed(
    header: record_batch.RecordBatchHeader, view: memoryview, codec: int, level: int | None
) -> tuple[record_batch.RecordBatchHeader, memoryview]:
    """The batch with its records compressed with ``codec`` at ``level`` (a topic's
    compression.type other than the producer's, as Kafka's LogValidator recompresses): every
    header field but the codec bits kept, the records as they were."""
    data = encode_batch(
        parse_records(view, check_crc=False),
        base_offset=header.base_offset,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        attributes=(header.attributes & ~0x07) | codec,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        compression_level=level,
    )
    return record_batch.parse_header(data), memoryview(data)


def _fire(listeners: list[Callable[[], object]]) -> None:
    """Call and forget the listeners of an append that just became durable (or failed)."""
    fired = listeners[:]
    listeners.clear()
    for listener in fired:
        listener()


def _timestamp_bounds(config: LogConfig, now_ms: int) -> tuple[int, int] | None:
    """The CreateTime range a record's timestamp must be in: message.timestamp.before.max.ms
    and .after.max.ms (else the deprecated .difference.max.ms) around now; None when nothing
    is checked (LogAppendTime, or no bound set)."""
    before, after = config.timestamp_before_max_ms, config.timestamp_after_max_ms
    if config.message_timestamp_type != "CreateTime" or before == after == LONG_MAX:
        return None
    return now_ms - before, now_ms + after


def invalid_records(
    batch: memoryview, topic_partition: str, *, compact: bool, bounds: tuple[int, int] | None
) -> tuple[ErrorCode, str, tuple[RecordError, ...]] | None:
    """Kafka's LogValidator.validateRecord on every record of one batch (only read when there is
    something to check): a compacted topic's record needs a key (compaction keeps the last
    record per key), else its timestamp must be within ``bounds`` (-1, no timestamp, always
    is). None when every record passes; else the batch's error, Kafka's message for it and
    the failing records (KIP-467's record_errors): INVALID_TIMESTAMP if any timestamp failed,
    else INVALID_RECORD."""
    if not compact and bounds is None:
        return None
    errors: list[RecordError] = []
    late = False
    for i, record in enumerate(parse_records(batch, check_crc=False)):
        if compact and record.key is None:
            errors.append(
                RecordError(
                    i,
                    "Compacted topic cannot accept message without key in topic partition "
                    + topic_partition,
                )
            )
        elif bounds is not None and record.timestamp != -1:
            low, high = bounds
            if not low <= record.timestamp <= high:
                late = True
                errors.append(
                    RecordError(
                        i,
                        f"Timestamp {record.timestamp} of message with offset {record.offset} is "
                        "out of range. The timestamp should be within "
                        f"[{_java_long(low)}, {_java_long(high)}]",
                    )
                )
    if not errors:
        return None
    if late:
        message = "One or more records have been rejected due to invalid timestamp"
        return ErrorCode.INVALID_TIMESTAMP, message, tuple(errors)
    # Java's toString of the first three RecordErrors, as Kafka's message lists them
    shown = ", ".join(
        f"RecordError(batchIndex={e.batch_index}, message='{e.message}')" for e in errors[:3]
    )
    message = (
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]"
    )
    return ErrorCode.INVALID_RECORD, message, tuple(errors)


def _java_long(value: int) -> int:
    """``value`` as a Java long holds it (wrapped to 64 bits): Kafka's message shows now plus
    an unset bound (Long.MAX_VALUE) overflowed."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)
