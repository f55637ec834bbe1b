"""ElasticLog: a Kafka partition as a MetaStream plus data streams (AutoMQ's ``ElasticLog``).

The MetaStream holds ``PARTITION`` (log start offset, clean shutdown flag), ``LOG`` (stream ids
and segments, see :mod:`automq_py.log.elastic_log_meta`), ``LEADER_EPOCH_CHECKPOINT`` and
``PRODUCER_SNAPSHOTS`` (see :mod:`automq_py.producer_state`). The segments are slices of the
``log`` (record batches) and ``tim`` (time index) streams; ``txn`` (the aborted-transaction
index, :mod:`automq_py.log.txn_index`) stays -1 until the partition's first aborted
transaction. :mod:`automq_py.log.log_loader` finds or creates the MetaStream and opens the log.

Every stream is opened at the partition's epoch, so opening the log on a new owner fences the
old one. ``LOG`` is written when a segment is created, rolled or dropped and on close; the
active segment reaches the log stream's end, so batches acknowledged after the last ``LOG``
write are still part of the log after a crash. An unclean stop (``PARTITION`` ``cs`` false) is
repaired on open by re-scanning the active segment.

Producer state (idempotent producers' epochs and last batches) follows every append; it is
snapshotted to ``PRODUCER_SNAPSHOTS`` at each roll and at close, and on open it is restored
from the snapshot and brought up to the log end by replaying the batch headers after the
snapshot's offset, so a retried duplicate is still recognised after a crash.

Appends run one at a time: each waits until its batch is durable (the WAL groups the writes of
many partitions), so the log end offset is also the high watermark on a single node.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from automq_py.log import meta_stream_record as keys
from automq_py.log.elastic_log_meta import (
    CLEANED_SUFFIX,
    LOG_STREAM,
    NO_TIMESTAMP,
    NOOP_OFFSET,
    TIME_STREAM,
    TXN_STREAM,
    ElasticLogMeta,
    ElasticPartitionMeta,
    ElasticStreamSegmentMeta,
    SliceRange,
    TimestampOffset,
)
from automq_py.log.elastic_log_segment import BatchView, ElasticLogSegment
from automq_py.log.leader_epoch_cache import LeaderEpochCache
from automq_py.log.log_config import LogConfig
from automq_py.log.meta_stream import MetaStream
from automq_py.log.txn_index import (
    ENTRY_SIZE,
    AbortedTxn,
    aborted_in_range,
    decode_entries,
    encode_entry,
)
from automq_py.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, ProducerStateManager
from protocol import control_records
from protocol.record_batch import (
    TIMESTAMP_TYPE_BIT,
    InvalidRecordBatchError,
    RecordBatchHeader,
    parse_header,
)
from protocol.records import parse_records
from storage.errors import OffsetOutOfRangeError, StreamClosedError
from storage.retention import SegmentInfo
from storage.stream import S3Stream, StreamClient, close_streams

log = logging.getLogger(__name__)

_BASE_OFFSET = operator.attrgetter("base_offset")  # a segment's, to bisect by


class LogOffsetOutOfRangeError(OffsetOutOfRangeError):
    """An offset outside ``[log_start_offset, log_end_offset]``: Kafka's OFFSET_OUT_OF_RANGE."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is outside the log [{log_start_offset}, {log_end_offset}]"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


# partitions about to be handed over have their tails uploaded first (while still served) when
# these average at least this many bytes per stream: for a broker's 10,000 nearly empty
# partitions an upload's cost is per stream (their blocks, 20,000 ranges committed), paid again
# at the close for nothing
TAILS_FIRST_MIN_AVERAGE = 4096


class CleanedSegmentError(ValueError):
    """A cleaned segment that does not fit the log as it is now."""


@dataclass(slots=True, frozen=True)
class CleanedBatch:
    """A batch key compaction kept: its bytes (original base offset and offsets) and the
    stream offsets it covers (its own span plus the compacted hole before it)."""

    data: bytes | memoryview
    count: int


def _offset_of_max_timestamp(view: BatchView) -> int:
    """The offset of the first record of ``view`` whose timestamp is its batch's max (Kafka's
    ``offsetOfMaxTimestamp``): the base offset of a LogAppendTime batch, whose records all
    take its time, or of one whose records cannot be read."""
    header = view.header
    if header.attributes & TIMESTAMP_TYPE_BIT:
        return header.base_offset
    try:
        records = parse_records(view.data)
    except InvalidRecordBatchError:
        return header.base_offset
    for record in records:
        if record.timestamp == header.max_timestamp:
            return int(record.offset)
    return header.base_offset


def batch_marker(header: RecordBatchHeader, batch: bytes | memoryview) -> tuple[bool, int] | None:
    """``(is_commit, coordinator_epoch)`` of a control batch; None for data batches and for
    an empty or unreadable control batch."""
    if not header.is_control or header.records_count == 0:
        return None
    try:
        return control_records.parse_marker(batch)
    except ValueError:
        return None


class ElasticLog:
    """One partition's log. Open it with :func:`automq_py.log.log_loader.open_log`."""

    def __init__(
        self,
        *,
        client: StreamClient,
        meta_stream: MetaStream,
        streams: dict[str, S3Stream],
        stream_map: dict[str, int],
        segments: list[ElasticLogSegment],
        partition_meta: ElasticPartitionMeta,
        leader_epochs: LeaderEpochCache,
        producer_state: ProducerStateManager,
        config: LogConfig,
        epoch: int,
        clock: Callable[[], int],
    ) -> None:
        self.client = client
        self.meta_stream = meta_stream
        self.config = config
        self.epoch = epoch
        self._streams = streams
        self._stream_map = stream_map
        self._segments = segments
        self._partition_meta = partition_meta
        self._leader_epochs = leader_epochs
        self._clock = clock
        self._lock = asyncio.Lock()  # appends, rolls, meta writes: one at a time
        self._closed = False
        self.producer_state = producer_state
        # producer.id.expiration.ms, as the broker has it now (a dynamic config)
        self.producer_id_expiration_ms = DEFAULT_PRODUCER_ID_EXPIRATION_MS
        # the aborted-transaction index, (stream name, position, entry), read on first use
        self._aborted: list[tuple[str, int, AbortedTxn]] | None = None
        self._aborted_lock = asyncio.Lock()
        # bumped when what a load of the index reads changes under it (a cleaning replaced the
        # segments, or an entry was appended while the index was unloaded): the load reads again
        self._aborted_generation = 0
        self._aborted_appends: set[asyncio.Future[None]] = set()  # entries not yet durable
        self._cleaner_lock = asyncio.Lock()  # one key-compaction swap at a time

    # -- state -----------------------------------------------------------------------------------

    @property
    def meta_stream_id(self) -> int:
        return self.meta_stream.stream_id

    @property
    def stream_map(self) -> dict[str, int]:
        """Stream name (``log``, ``tim``, ``txn``...) -> stream id, -1 when not created."""
        return dict(self._stream_map)

    @property
    def log_start_offset(self) -> int:
        return self._partition_meta.start_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to append at (Kafka's log end offset): offsets below it are taken,
        though the last appends may not be durable yet."""
        return self._segments[-1].assigned_end

    @property
    def high_watermark(self) -> int:
        """The end of the durable log: every offset below is acknowledged and may be read. On
        a single node durable means committed, so this is Kafka's high watermark."""
        return self._segments[-1].next_offset

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: below it every transaction is decided and its marker durable;
        read_committed consumers read up to here."""
        return self.stable_offset(self.high_watermark)

    def out_of_range(self, offset: int, high_watermark: int) -> bool:
        """Whether ``offset`` is outside ``[log_start_offset, log_end_offset]`` (Kafka's
        OFFSET_OUT_OF_RANGE), for a caller that has just read the high watermark: the log end
        offset, never below it, is asked only for an offset past it."""
        return offset < self.log_start_offset or (
            offset > high_watermark and offset > self.log_end_offset
        )

    def stable_offset(self, high_watermark: int) -> int:
        """The last stable offset, for a caller that has just read the high watermark."""
        unstable = self.producer_state.first_unstable_offset(high_watermark)
        return high_watermark if unstable is None else min(high_watermark, unstable)

    @property
    def segments(self) -> list[ElasticStreamSegmentMeta]:
        """The segments as ``LOG`` would record them now, in offset order."""
        return [s.meta() for s in self._segments]

    def segment_infos(self) -> list[SegmentInfo]:
        """Each segment's offsets, size, largest and first batch timestamps, oldest first (for
        retention and key compaction's lags)."""
        return [
            SegmentInfo(
                s.base_offset,
                s.next_offset,
                s.size,
                s.largest_timestamp,
                s.stream_suffix == CLEANED_SUFFIX,
                s.first_batch_timestamp,
            )
            for s in self._segments
        ]

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        return self._leader_epochs

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # -- write -----------------------------------------------------------------------------------

    async def append(
        self,
        batch: bytes | memoryview,
        *,
        base_offset: int,
        record_count: int,
        max_timestamp: int,
        first_timestamp: int,
    ) -> None:
        """:meth:`start_append`, returning once the batch is durable."""
        durable = await self.start_append(
            batch,
            base_offset=base_offset,
            record_count=record_count,
            max_timestamp=max_timestamp,
            first_timestamp=first_timestamp,
        )
        await asyncio.shield(durable)

    async def start_append(
        self,
        batch: bytes | memoryview,
        *,
        base_offset: int,
        record_count: int,
        max_timestamp: int,
        first_timestamp: int,
        timeout: float | None = None,
        on_done: Callable[[], object] | None = None,
        header: RecordBatchHeader | None = None,
    ) -> asyncio.Future[None]:
        """Start the append of one Kafka record batch whose header already says
        ``base_offset`` (which must be :attr:`log_end_offset`) and return the future of its
        durability: done once it and every batch before it are durable, when the high
        watermark has passed it. Rolls the active segment first when ``segment.bytes``,
        ``segment.ms`` or its time index says so. Appends started one after the other share
        WAL group commits; the producer state records the batch now, so the next append's
        sequence check sees it.

        ``first_timestamp`` (the batch's base timestamp) is accepted for symmetry with
        Kafka's append info; rolling and indexing use ``max_timestamp``, as Kafka does.
        ``TimeoutError`` when the WAL cache has had no room for ``timeout`` seconds.
        ``on_done()`` is called as the future is set done, in the same pass of the event loop
        (see :meth:`S3Stream.start_append`). ``header``: the batch's, when the caller has
        parsed it (its producer fields are read, not its offsets).
        """
        if record_count <= 0:
            raise ValueError(f"record_count must be positive, got {record_count}")
        del first_timestamp
        async with self._lock:
            self._check_open()
            if base_offset != self.log_end_offset:
                raise ValueError(
                    f"batch base offset {base_offset} is not the log end offset "
                    f"{self.log_end_offset}"
                )
            now = self._clock()
            last_offset = base_offset + record_count - 1
            if self._segments[-1].should_roll(
                self.config, len(batch), last_offset, max_timestamp, now
            ):
                await self._roll(now)
            segment = self._segments[-1]
            await segment.log_stream.wait_for_room(timeout)
            return self._append(
                segment, batch, header, base_offset, record_count, max_timestamp, now, on_done
            )

    def append_now(
        self,
        batch: bytes | memoryview,
        header: RecordBatchHeader,
        base_offset: int,
        on_done: Callable[[], object] | None = None,
    ) -> asyncio.Future[None] | None:
        """:meth:`start_append` of a batch at ``base_offset`` (:attr:`log_end_offset`), when
        it can start without waiting: None (nothing done) while another append holds the log,
        when the active segment must roll first, or the WAL cache has no room; the caller
        then awaits :meth:`start_append`. ``header``: the batch's, as parsed before its
        offsets were set (its base offset is not read)."""
        if self._lock.locked() or self._closed:
            return None
        segment = self._segments[-1]
        now = self._clock()
        record_count = header.last_offset_delta + 1
        max_timestamp = header.max_timestamp
        if not segment.log_stream.storage.has_room() or segment.should_roll(
            self.config, len(batch), base_offset + record_count - 1, max_timestamp, now
        ):
            return None
        return self._append(
            segment, batch, header, base_offset, record_count, max_timestamp, now, on_done
        )

    def _append(
        self,
        segment: ElasticLogSegment,
        batch: bytes | memoryview,
        header: RecordBatchHeader | None,
        base_offset: int,
        record_count: int,
        max_timestamp: int,
        now: int,
        on_done: Callable[[], object] | None,
    ) -> asyncio.Future[None]:
        durable = segment.append_now(batch, base_offset, record_count, max_timestamp, now, on_done)
        self._track_producer(batch, base_offset, now, header)
        return durable

    def _track_producer(
        self,
        batch: bytes | memoryview,
        base_offset: int,
        now: int,
        header: RecordBatchHeader | None = None,
    ) -> None:
        """Record an appended batch in the producer state (from its header, and a marker's
        record)."""
        if header is None:
            try:
                header = parse_header(batch)
            except InvalidRecordBatchError:
                return  # not a Kafka batch (some tests append opaque payloads): no producer
        self.producer_state.update(header, base_offset, now, batch_marker(header, batch))

    # -- key compaction --------------------------------------------------------------------------

    async def replace_with_cleaned(
        self,
        base_offset: int,
        end_offset: int,
        batches: Sequence[CleanedBatch],
        aborted: Sequence[AbortedTxn] = (),
    ) -> int:
        """Replace the sealed segments that cover exactly ``[base_offset, end_offset)`` with one
        ``.cleaned`` segment holding ``batches`` (what key compaction kept, in offset order):
        AutoMQ's cleaned segment, whose data lies in the ``log.cleaned`` stream (and its time
        index in ``tim.cleaned``). Each batch covers ``count`` stream offsets, the hole before
        it included, so the counts add up to the segment's offset span and Kafka offsets map
        to stream offsets as in any segment. ``aborted`` are the aborted transactions whose
        ABORT marker the cleaning kept: the cleaned segment's own transaction index (in
        ``txn.cleaned``); the replaced segments' entries go with them, as Kafka's cleaner
        rewrites the index, so no entry outlives its marker. Returns how many segments were
        replaced.

        The batches are written first, outside the log's lock (appends go on meanwhile); the
        swap in ``LOG`` then checks that the segments are still the ones planned:
        :class:`CleanedSegmentError` when they are not (a retention trim or another cleaning
        came first), or when the batches do not fit the range."""
        if sum(b.count for b in batches) != end_offset - base_offset:
            raise CleanedSegmentError(
                f"cleaned batches cover {sum(b.count for b in batches)} offsets, the range "
                f"[{base_offset}, {end_offset}) has {end_offset - base_offset}"
            )
        async with self._cleaner_lock:
            replaced = self._sealed_range(base_offset, end_offset)
            log_stream = await self._cleaned_stream(LOG_STREAM + CLEANED_SUFFIX)
            time_stream = await self._cleaned_stream(TIME_STREAM + CLEANED_SUFFIX)
            txn_slice = SliceRange(0, 0)
            txn_name = TXN_STREAM + CLEANED_SUFFIX
            if aborted or txn_name in self._streams:
                txn_stream = await self._cleaned_stream(txn_name)
                txn_start = txn_stream.next_offset
                for txn in aborted:
                    entry = encode_entry(txn)
                    await txn_stream.start_append(entry, len(entry))
                txn_slice = SliceRange(txn_start, txn_stream.next_offset)
            meta = ElasticStreamSegmentMeta(
                base_offset=base_offset,
                create_timestamp=replaced[0].create_timestamp,
                last_modified_timestamp=max(s.last_modified_timestamp for s in replaced),
                stream_suffix=CLEANED_SUFFIX,
                log=SliceRange(log_stream.next_offset, NOOP_OFFSET),
                time=SliceRange(time_stream.next_offset, NOOP_OFFSET),
                txn=txn_slice,
                time_index_last_entry=TimestampOffset(NO_TIMESTAMP, base_offset),
            )
            cleaned = ElasticLogSegment.of(meta, self._streams, self.config)
            durable: asyncio.Future[None] | None = None
            for batch in batches:
                header = parse_header(batch.data)
                if header.base_offset < base_offset or header.last_offset >= end_offset:
                    raise CleanedSegmentError(
                        f"batch [{header.base_offset}, {header.last_offset}] is outside "
                        f"[{base_offset}, {end_offset})"
                    )
                _, durable = await log_stream.start_append(batch.data, batch.count)
                if cleaned.size == 0:
                    cleaned.first_batch_timestamp = header.max_timestamp
                cleaned.size += len(batch.data)
                cleaned.time_index.on_batch_submitted(
                    len(batch.data), header.max_timestamp, header.base_offset, header.last_offset
                )
            await cleaned.time_index.maybe_append(cleaned.time_index.max_so_far)
            if durable is not None:
                await asyncio.shield(durable)
            cleaned.log_slice = SliceRange(meta.log.start, log_stream.next_offset)
            cleaned.time_index.seal()
            async with self._lock:
                self._check_open()
                if self._sealed_range(base_offset, end_offset) != replaced:
                    raise CleanedSegmentError(
                        f"the segments of [{base_offset}, {end_offset}) changed meanwhile"
                    )
                first = self._segments.index(replaced[0])
                self._segments[first : first + len(replaced)] = [cleaned]
                # read again from the segments' slices, from the swap on: a write or trim
                # below that fails must not leave the replaced segments' transactions behind
                self._aborted = None
                self._aborted_generation += 1
                await self._persist_log_meta()
                await self._trim_streams()
            log.info(
                "MetaStream %d: %d segments of [%d, %d) replaced by a cleaned segment of %d "
                "batches (%d bytes, was %d)",
                self.meta_stream_id,
                len(replaced),
                base_offset,
                end_offset,
                len(batches),
                cleaned.size,
                sum(s.size for s in replaced),
            )
            return len(replaced)

    def _sealed_range(self, base_offset: int, end_offset: int) -> list[ElasticLogSegment]:
        """The sealed segments that cover exactly ``[base_offset, end_offset)``."""
        chosen = [
            s
            for s in self._segments
            if not s.is_active and s.base_offset >= base_offset and s.next_offset <= end_offset
        ]
        if (
            not chosen
            or chosen[0].base_offset != base_offset
            or chosen[-1].next_offset != end_offset
            or any(a.next_offset != b.base_offset for a, b in itertools.pairwise(chosen))
        ):
            raise CleanedSegmentError(
                f"no sealed segments cover exactly [{base_offset}, {end_offset})"
            )
        return chosen

    async def _cleaned_stream(self, name: str) -> S3Stream:
        """The stream ``name`` (``log.cleaned``, ``tim.cleaned``), created on first use."""
        stream = self._streams.get(name)
        if stream is not None:
            return stream
        async with self._lock:
            self._check_open()
            stream = self._streams.get(name)
            if stream is None:
                stream = await self.client.create_and_open(self.epoch)
                self._streams[name] = stream
                self._stream_map[name] = stream.stream_id
                await self._persist_log_meta()  # no stream is ever left unnamed
                log.info(
                    "MetaStream %d: created stream %s = %d",
                    self.meta_stream_id,
                    name,
                    stream.stream_id,
                )
            return stream

    # -- transactions ----------------------------------------------------------------------------

    async def add_aborted_txn(self, txn: AbortedTxn) -> None:
        """Start the append of ``txn`` to the aborted-transaction index (creating the Txn
        stream on the first one). Call it before appending the ABORT marker itself: the WAL
        makes records durable in order, so a durable marker implies its index entry."""
        await self._load_aborted()
        async with self._lock:
            self._check_open()
            stream = self._streams.get(TXN_STREAM)
            if stream is None:
                stream = await self.client.create_and_open(self.epoch)
                self._streams[TXN_STREAM] = stream
                self._stream_map[TXN_STREAM] = stream.stream_id
                await self._persist_log_meta()
                log.info(
                    "MetaStream %d: created the Txn stream %d",
                    self.meta_stream_id,
                    stream.stream_id,
                )
            entry = encode_entry(txn)
            position, durable = await stream.start_append(entry, len(entry), backpressure=False)
            if not durable.done():
                self._aborted_appends.add(durable)
                durable.add_done_callback(self._aborted_appends.discard)
            if self._aborted is not None:
                self._aborted.append((TXN_STREAM, position, txn))
            else:  # a cleaning dropped the index meanwhile: its next load reads this entry
                self._aborted_generation += 1

    async def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions with data in ``[fetch_offset, upper_bound)``."""
        entries = await self._load_aborted()
        return aborted_in_range((t for _, _, t in entries), fetch_offset, upper_bound)

    def aborted_transactions_cached(
        self, fetch_offset: int, upper_bound: Callable[[], int]
    ) -> list[AbortedTxn] | None:
        """:meth:`aborted_transactions` at once, once the index is loaded (None before);
        ``upper_bound`` is asked only when the partition has aborted a transaction (most never
        do, and a read_committed fetch asks each partition it reads)."""
        entries = self._aborted
        if entries is None:
            return None
        if not entries:
            return []
        return aborted_in_range((t for _, _, t in entries), fetch_offset, upper_bound())

    async def _load_aborted(self) -> list[tuple[str, int, AbortedTxn]]:
        """The index: each segment's slice of its Txn stream (``txn``, or ``txn.cleaned`` for
        a cleaned segment, whose entries its cleaning wrote)."""
        if self._aborted is not None:
            return self._aborted
        async with self._aborted_lock:
            while self._aborted is None:
                generation = self._aborted_generation
                if self._aborted_appends:  # read only what is durable: wait for the rest
                    await asyncio.wait(list(self._aborted_appends))
                loaded: list[tuple[str, int, AbortedTxn]] = []
                for segment in list(self._segments):
                    name = TXN_STREAM + segment.stream_suffix
                    stream = self._streams.get(name)
                    if stream is None:
                        continue
                    sliced = segment.txn_slice
                    pos = max(sliced.start, stream.start_offset)
                    end = stream.confirmed_offset
                    if sliced.end != NOOP_OFFSET:
                        end = min(end, sliced.end)
                    while pos < end:
                        result = await stream.fetch(pos, end)
                        if not result.batches:
                            break
                        for batch in result.batches:
                            for i, txn in enumerate(decode_entries(batch.payload)):
                                loaded.append((name, batch.base_offset + i * ENTRY_SIZE, txn))
                            pos = batch.last_offset
                if generation == self._aborted_generation:
                    self._aborted = loaded
            return self._aborted

    async def roll(self) -> None:
        """Start a new active segment now (if the current one holds anything)."""
        async with self._lock:
            self._check_open()
            if self._segments[-1].size > 0:
                await self._roll(self._clock())

    async def _roll(self, now: int) -> None:
        old = self._segments[-1]
        await old.seal(self._txn_next_offset())
        meta = ElasticStreamSegmentMeta.new_active(
            old.next_offset,
            now,
            self._streams[LOG_STREAM].next_offset,
            self._streams[TIME_STREAM].next_offset,
            self._txn_next_offset(),
        )
        self._segments.append(ElasticLogSegment.of(meta, self._streams, self.config))
        # the state now covers exactly the batches below the new segment (Kafka's roll does too)
        await self.meta_stream.put_many(
            [self._log_meta_item(), *self._producer_snapshot_items(meta.base_offset)]
        )
        log.debug("rolled segment %d at offset %d", old.base_offset, meta.base_offset)

    def _txn_next_offset(self) -> int:
        txn = self._streams.get(TXN_STREAM)
        return txn.next_offset if txn is not None else 0

    async def truncate_start(self, new_start: int) -> None:
        """Move the log start offset to ``new_start`` (DeleteRecords, retention): offsets
        below it can no longer be read; whole segments below it are dropped and the streams
        trimmed to what the remaining segments use."""
        async with self._lock:
            self._check_open()
            if new_start <= self.log_start_offset:
                return
            if new_start > self.high_watermark:
                raise LogOffsetOutOfRangeError(
                    new_start, self.log_start_offset, self.high_watermark
                )
            # the start offset first: once it is durable nothing below it is read again
            self._partition_meta = dataclasses.replace(self._partition_meta, start_offset=new_start)
            await self.meta_stream.put(keys.PARTITION, self._partition_meta.encode())
            keep = [s for s in self._segments if s.is_active or s.next_offset > new_start]
            dropped = len(self._segments) - len(keep)
            if dropped:
                self._segments = keep
                await self._persist_log_meta()
            if self._leader_epochs.truncate_from_start(new_start):
                await self._persist_leader_epochs()
            await self._trim_streams()
            log.debug("log start moved to %d, %d segments dropped", new_start, dropped)

    async def _trim_streams(self) -> None:
        """Trim each data stream to the first slice a remaining segment uses."""
        starts: dict[str, int] = {}
        for s in self._segments:
            for name, start in (
                (LOG_STREAM + s.stream_suffix, s.log_slice.start),
                (TIME_STREAM + s.stream_suffix, s.time_index.slice_start),
                (TXN_STREAM + s.stream_suffix, s.txn_slice.start),
            ):
                starts[name] = min(starts.get(name, start), start)
        for name, start in starts.items():
            stream = self._streams.get(name)
            if stream is None:
                continue  # no Txn stream yet
            await stream.trim(start)
            if name.startswith(TXN_STREAM) and self._aborted is not None:
                self._aborted = [(n, p, t) for n, p, t in self._aborted if n != name or p >= start]

    async def assign_leader_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that leader ``epoch`` starts at ``start_offset`` (LEADER_EPOCH_CHECKPOINT)."""
        async with self._lock:
            self._check_open()
            if self._leader_epochs.assign(epoch, start_offset):
                await self._persist_leader_epochs()

    async def close(self) -> None:
        """Index the active segment's max timestamp, write ``LOG`` and ``PARTITION`` with
        ``cs`` true (the next open trusts them), then close every stream."""
        await ElasticLog.close_many([self])

    @staticmethod
    async def close_many(logs: Sequence[ElasticLog]) -> None:
        """Close several logs as one: each writes its final meta, then their streams' cached
        data is uploaded together and one metadata change closes them all (a broker handing
        many partitions over, or stopping, pays one upload and one transaction, not one per
        stream). In that change the MetaStream closes with the data streams: once it is
        closed, a broker taking the partition over may open it (see ReplicaManager)."""
        # concurrently: each seal's appends wait for the WAL, whose group commit then makes
        # the logs' final meta durable together rather than one fsync after another
        sealed = await asyncio.gather(*(log._seal() for log in logs), return_exceptions=True)
        streams: list[S3Stream] = []
        failed: BaseException | None = None
        for outcome in sealed:
            if isinstance(outcome, BaseException):
                failed = outcome  # its streams stay open: a later close_many closes them
            else:
                streams += outcome
        if streams:
            await close_streams(streams[0].storage, streams)
        if failed is not None:
            raise failed

    @staticmethod
    async def upload_tails(logs: Sequence[ElasticLog]) -> bool:
        """Upload what the logs' streams have not yet made durable in object storage, while
        they go on taking appends: a partition about to be handed over then has only what
        arrives meanwhile left to upload when it closes. False when not worth it (see
        :data:`TAILS_FIRST_MIN_AVERAGE`): nothing uploaded."""
        streams = [
            s
            for log in logs
            if not log._closed
            for s in (*log._streams.values(), log.meta_stream.stream)
        ]
        if not streams:
            return False
        storage = streams[0].storage
        ids = [s.stream_id for s in streams]
        size, holding = storage.cache.unuploaded(ids)
        if size < TAILS_FIRST_MIN_AVERAGE * holding:
            log.info(
                "not uploading the tails of %d partitions first: %d bytes in %d streams (an "
                "upload costs as much per stream as for their bytes; the close uploads them)",
                len(logs),
                size,
                holding,
            )
            return False
        await storage.upload_streams(ids)
        return True

    async def _seal(self) -> list[S3Stream]:
        """Write the final meta and refuse further use; the streams to close. Once sealed
        (or after a seal that failed partway), the same streams: :func:`close_streams` takes
        those never closed or whose close failed, so a close that failed is finished by the
        next, without the final meta when its writes failed (the next open then recovers)."""
        async with self._lock:
            streams = [*self._streams.values(), self.meta_stream.stream]
            if self._closed:
                return streams
            self._closed = True
            active = self._segments[-1]
            await active.time_index.maybe_append(active.time_index.max_so_far)
            self._partition_meta = dataclasses.replace(
                self._partition_meta, recover_offset=self.log_end_offset, cleaned_shutdown=True
            )
            # one append: 10,000 partitions closing together wait for one group commit each
            await self.meta_stream.put_many(
                [
                    self._log_meta_item(),
                    *self._producer_snapshot_items(self.log_end_offset),
                    (keys.PARTITION, self._partition_meta.encode()),
                ]
            )
            return streams

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError("the log is closed")

    def _log_meta_item(self) -> tuple[str, bytes]:
        meta = ElasticLogMeta(dict(self._stream_map), tuple(s.meta() for s in self._segments))
        return keys.LOG, meta.encode()

    async def _persist_log_meta(self) -> None:
        await self.meta_stream.put(*self._log_meta_item())

    async def _persist_leader_epochs(self) -> None:
        await self.meta_stream.put(
            keys.LEADER_EPOCH_CHECKPOINT, self._leader_epochs.checkpoint().encode()
        )

    def expire_producers(self) -> int:
        """Forget the producers idle for ``producer.id.expiration.ms`` but those with a
        transaction open (Kafka's ``removeExpiredProducers``); how many were."""
        return self.producer_state.expire(self._clock(), self.producer_id_expiration_ms)

    def _producer_snapshot_items(self, offset: int) -> list[tuple[str, bytes]]:
        """``PRODUCER_SNAPSHOTS`` covering batches below ``offset`` (producers idle longer than
        ``producer.id.expiration.ms`` forgotten first), to write; none for a partition that
        never saw an idempotent producer."""
        self.expire_producers()
        if not len(self.producer_state) and self.meta_stream.get(keys.PRODUCER_SNAPSHOTS) is None:
            return []
        return [(keys.PRODUCER_SNAPSHOTS, self.producer_state.snapshot(offset))]

    # -- read ------------------------------------------------------------------------------------

    async def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one: bool = True,
    ) -> list[memoryview]:
        """Kafka record batches from the one holding ``offset``: whole batches up to
        ``max_bytes`` (with ``min_one``, at least one when any is available, however large),
        none starting at or after ``max_offset`` or at the high watermark. Raises
        :class:`LogOffsetOutOfRangeError` outside ``[log_start_offset, log_end_offset]``."""
        segments, i, max_offset, _ = self._read_from(offset, max_offset)
        out: list[memoryview] = []
        total = 0
        while i < len(segments):
            segment = segments[i]
            views, pos = await segment.read(
                offset, max_bytes - total, max_offset, min_one and not out
            )
            out.extend(views)
            total += sum(len(v) for v in views)
            if pos < segment.next_offset or total >= max_bytes:
                break  # the budget or max_offset ended the read inside this segment
            offset = pos
            i += 1
        return out

    def read_cached(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one: bool = True,
        high_watermark: int | None = None,
    ) -> tuple[list[memoryview], int] | None:
        """:meth:`read` at once, when the LogCache holds all it returns (a consumer keeping
        up), with the bytes it returns; None when some of it would come from object storage.
        ``high_watermark``: the one the caller has just read, if it has (a fetch has)."""
        segments, i, max_offset, hw = self._read_from(offset, max_offset, high_watermark)
        out: list[memoryview] = []
        total = 0
        last = len(segments) - 1
        while i <= last:
            segment = segments[i]
            next_offset = hw if i == last else segment.next_offset  # (the same, asked once)
            got = segment.read_cached(
                offset,
                next_offset if next_offset < max_offset else max_offset,
                max_bytes - total,
                min_one and not total,
                out,
            )
            if got is None:
                return None
            taken, pos = got
            total += taken
            if pos < next_offset or total >= max_bytes:
                break
            offset = pos
            i += 1
        return out, total

    def _read_from(
        self, offset: int, max_offset: int | None, high_watermark: int | None = None
    ) -> tuple[list[ElasticLogSegment], int, int, int]:
        """Where a read from ``offset`` starts: the segments (a roll replaces nothing in place:
        a stable snapshot), the index of the one holding ``offset``, the offset the read stops
        before (``max_offset``, at most the high watermark), and the high watermark (the
        caller's, read just before, if given)."""
        hw = self.high_watermark if high_watermark is None else high_watermark
        if self.out_of_range(offset, hw):
            raise LogOffsetOutOfRangeError(offset, self.log_start_offset, self.log_end_offset)
        segments = self._segments
        i = len(segments) - 1  # mostly the active segment: a consumer keeping up
        if i and offset < segments[i].base_offset:
            i = max(bisect.bisect_right(segments, offset, key=_BASE_OFFSET) - 1, 0)
        return segments, i, (hw if max_offset is None else min(max_offset, hw)), hw

    async def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, max timestamp)`` of the first batch whose max timestamp is >=
        ``timestamp`` (ListOffsets by time); None past the end. The offset is the batch's
        base offset (or the log start inside the first batch): a caller that decodes records
        can step to the exact record."""
        start = self.log_start_offset
        for segment in list(self._segments):
            if segment.max_timestamp >= timestamp and segment.next_offset > start:
                found = await segment.find_offset_by_timestamp(timestamp, start)
                if found is not None:
                    return found
        return None

    async def max_timestamp_offset(self) -> tuple[int, int]:
        """``(offset, timestamp)`` of the record holding the largest timestamp (ListOffsets
        MAX_TIMESTAMP), the first such record on ties, as Kafka's ``offsetOfMaxTimestamp``
        finds it in its batch (a LogAppendTime batch's first record); ``(-1, -1)`` for an
        empty log."""
        best: ElasticLogSegment | None = None
        for segment in self._segments:
            if segment.max_timestamp > (best.max_timestamp if best else NO_TIMESTAMP):
                best = segment
        if best is None:
            return -1, NO_TIMESTAMP
        max_so_far = best.time_index.max_so_far
        start = self.log_start_offset
        view = await best.batch_holding(max(max_so_far.offset, start))
        if view is None:
            return -1, NO_TIMESTAMP
        return max(_offset_of_max_timestamp(view), start), max_so_far.timestamp
