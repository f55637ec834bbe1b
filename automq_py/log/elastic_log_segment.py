"""ElasticLogSegment: one Kafka segment as slices of the partition's streams (AutoMQ's
``ElasticLogSegment``).

Kafka offset ``o`` of a segment lies at offset ``log.start + (o - base_offset)`` of its log
stream (``log`` or ``log.cleaned``); for a segment that is not ``.cleaned`` the two are equal.
A stream record batch holds one Kafka record batch and covers its offsets (a cleaned batch's
count also covers the compacted hole before it), so a stream fetch at a Kafka offset returns the
batch that holds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass

from automq_py.log.elastic_log_meta import (
    LOG_STREAM,
    NOOP_OFFSET,
    TIME_STREAM,
    CorruptLogMetaError,
    ElasticStreamSegmentMeta,
    SliceRange,
)
from automq_py.log.log_config import LogConfig
from automq_py.log.time_index import INT32_MAX, SegmentTimeIndex
from protocol.record_batch import RecordBatchHeader, parse_header
from storage.stream import S3Stream

log = logging.getLogger(__name__)

SCAN_FETCH_BYTES = 1 << 20


class SegmentOffsetError(ValueError):
    """An append whose offsets do not continue the segment's log stream."""


@dataclass(slots=True, frozen=True)
class BatchView:
    """A Kafka record batch read from a segment, with its parsed header."""

    header: RecordBatchHeader
    data: memoryview


class ElasticLogSegment:
    """A segment's stream slices and its in-memory state (size, first batch time, index)."""

    def __init__(
        self, meta: ElasticStreamSegmentMeta, log_stream: S3Stream, time_index: SegmentTimeIndex
    ) -> None:
        self.base_offset = meta.base_offset
        self.create_timestamp = meta.create_timestamp
        self.last_modified_timestamp = meta.last_modified_timestamp
        self.stream_suffix = meta.stream_suffix
        self.size = meta.log_size
        self.log_stream = log_stream
        self.log_slice = meta.log
        self.txn_slice = meta.txn
        self.first_batch_timestamp = meta.first_batch_timestamp
        self.time_index = time_index

    @classmethod
    def of(
        cls, meta: ElasticStreamSegmentMeta, streams: Mapping[str, S3Stream], config: LogConfig
    ) -> ElasticLogSegment:
        """The segment ``meta`` describes, over its log and time index streams among the
        log's open ``streams`` (by name: ``log``, ``tim``, or ``log.cleaned``...)."""
        log_name = LOG_STREAM + meta.stream_suffix
        time_name = TIME_STREAM + meta.stream_suffix
        if log_name not in streams or time_name not in streams:
            raise CorruptLogMetaError(
                f"segment {meta.base_offset} needs streams {log_name!r} and {time_name!r}, "
                f"the log's open streams are {sorted(streams)}"
            )
        time_index = SegmentTimeIndex(
            streams[time_name],
            meta.base_offset,
            meta.time,
            meta.time_index_last_entry,
            index_interval_bytes=config.index_interval_bytes,
            max_entries=config.max_time_index_entries,
        )
        return cls(meta, streams[log_name], time_index)

    # -- offsets ---------------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self.log_slice.end == NOOP_OFFSET

    @property
    def next_offset(self) -> int:
        """The Kafka offset after the segment's last durable batch."""
        log_slice = self.log_slice  # (inlined: a fetch asks for it several times a partition)
        end = log_slice.end
        if end == NOOP_OFFSET:
            end = self.log_stream.confirmed_offset
        return self.base_offset + (end - log_slice.start)

    @property
    def assigned_end(self) -> int:
        """The Kafka offset after the segment's last appended batch, durable or not."""
        end = self.log_stream.next_offset if self.is_active else self.log_slice.end
        return self.to_kafka(end)

    def to_stream(self, offset: int) -> int:
        return self.log_slice.start + (offset - self.base_offset)

    def to_kafka(self, stream_offset: int) -> int:
        return self.base_offset + (stream_offset - self.log_slice.start)

    @property
    def max_timestamp(self) -> int:
        """The largest batch max timestamp in the segment (-1 if none)."""
        return self.time_index.max_so_far.timestamp

    @property
    def largest_timestamp(self) -> int:
        """Kafka's ``LogSegment.largestTimestamp``: the largest timestamp, or the last-modified
        time when no batch carries one (what ``retention.ms`` measures a segment's age by)."""
        ts = self.max_timestamp
        return ts if ts >= 0 else self.last_modified_timestamp

    def meta(self) -> ElasticStreamSegmentMeta:
        """The segment's meta as the ``LOG`` value records it now."""
        return ElasticStreamSegmentMeta(
            base_offset=self.base_offset,
            create_timestamp=self.create_timestamp,
            last_modified_timestamp=self.last_modified_timestamp,
            stream_suffix=self.stream_suffix,
            log_size=self.size,
            log=self.log_slice,
            time=self.time_index.slice_range,
            txn=self.txn_slice,
            first_batch_timestamp=self.first_batch_timestamp,
            time_index_last_entry=self.time_index.last_entry,
        )

    # -- write -----------------------------------------------------------------------------------

    def should_roll(
        self, config: LogConfig, batch_size: int, last_offset: int, max_timestamp: int, now: int
    ) -> bool:
        """Kafka's ``LogSegment.shouldRoll`` before appending a batch; an empty segment never
        rolls."""
        if self.size == 0:
            return False
        waited = self._time_waited_for_roll(now, max_timestamp)
        return (
            self.size > config.segment_bytes - batch_size
            or waited > config.segment_ms - config.segment_jitter_ms
            or self.time_index.is_full
            or last_offset - self.base_offset > INT32_MAX
        )

    def _time_waited_for_roll(self, now: int, message_timestamp: int) -> int:
        # like Kafka: measured in record time from the first batch, else in wall time
        if self.first_batch_timestamp > 0:
            return message_timestamp - self.first_batch_timestamp
        return now - self.create_timestamp

    async def start_append(
        self,
        batch: bytes | memoryview,
        base_offset: int,
        record_count: int,
        max_timestamp: int,
        now: int,
        timeout: float | None = None,
        on_done: Callable[[], object] | None = None,
    ) -> asyncio.Future[None]:
        """:meth:`append_now` once the WAL cache has room: ``TimeoutError`` when it has had
        none for ``timeout`` seconds (nothing appended)."""
        await self.log_stream.wait_for_room(timeout)
        return self.append_now(batch, base_offset, record_count, max_timestamp, now, on_done)

    def append_now(
        self,
        batch: bytes | memoryview,
        base_offset: int,
        record_count: int,
        max_timestamp: int,
        now: int,
        on_done: Callable[[], object] | None = None,
    ) -> asyncio.Future[None]:
        """Start the append of one Kafka batch at ``base_offset`` (the segment's assigned end)
        and return the future of its durability, which is done once it and every batch before
        it are durable. The time-index entry, when one is due, goes right behind the batch,
        into the same group commit. Does not wait for room in the WAL cache (see
        :meth:`start_append`). ``on_done``: see :meth:`S3Stream.start_append`."""
        expected = self.to_stream(base_offset)
        if not self.is_active or self.log_stream.next_offset != expected:
            raise SegmentOffsetError(
                f"segment {self.base_offset}: offset {base_offset} maps to stream offset "
                f"{expected}, the log stream {self.log_stream.stream_id} is at "
                f"{self.log_stream.next_offset}"
            )
        _, durable = self.log_stream.append_now(batch, record_count, on_done)
        # the batch's offsets are taken from here on: the segment accounts for it whatever
        # happens to the index entry (a failed entry write fails the storage, and so the batch)
        size = len(batch)
        if self.size == 0:
            self.first_batch_timestamp = max_timestamp
        self.last_modified_timestamp = now
        self.size += size
        self.time_index.on_batch_submitted(
            size, max_timestamp, base_offset, base_offset + record_count - 1
        )
        return durable

    async def seal(self, txn_end: int) -> None:
        """Stop being active: index the max timestamp so far, end every slice at its stream's
        end (AutoMQ's ``onBecomeInactiveSegment``)."""
        await self.time_index.maybe_append(self.time_index.max_so_far)
        self.log_slice = SliceRange(self.log_slice.start, self.log_stream.next_offset)
        self.time_index.seal()
        self.txn_slice = SliceRange(self.txn_slice.start, txn_end)

    async def recover(self) -> list[tuple[int, int]]:
        """After an unclean stop, rebuild the size, first batch time and time index from the
        batches in the log stream. Returns ``(leader epoch, base offset)`` of every batch whose
        epoch is larger than all before it, for the leader epoch cache."""
        indexed_up_to = await self.time_index.recover()
        self.size = 0
        epochs: list[tuple[int, int]] = []
        async for view in self.batches(self.base_offset):
            h = view.header
            if self.size == 0:
                self.first_batch_timestamp = h.max_timestamp
            await self.time_index.on_batch_appended(
                h.size, h.max_timestamp, h.base_offset, h.last_offset, after=indexed_up_to
            )
            self.size += h.size
            if h.partition_leader_epoch >= 0 and (
                not epochs or h.partition_leader_epoch > epochs[-1][0]
            ):
                epochs.append((h.partition_leader_epoch, h.base_offset))
        # as a closed segment does: its time index ends at its largest timestamp
        await self.time_index.maybe_append(self.time_index.max_so_far)
        return epochs

    # -- read ------------------------------------------------------------------------------------

    async def read(
        self, offset: int, max_bytes: int, max_offset: int | None, min_one: bool
    ) -> tuple[list[memoryview], int]:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one when
        ``min_one``), none starting at or after ``max_offset``. Returns them and the offset after
        the last one (``offset`` if none)."""
        offset, end = self._read_range(offset, max_offset)
        if offset >= end:
            return [], offset
        views, stop = await self.log_stream.read_whole(
            self.to_stream(offset), self.to_stream(end), max_bytes, min_one
        )
        return views, (self.to_kafka(stop) if views else offset)

    def read_cached(
        self, offset: int, end: int, max_bytes: int, min_one: bool, out: list[memoryview]
    ) -> tuple[int, int] | None:
        """:meth:`read` at once, up to ``end`` (at most :attr:`next_offset`), when the LogCache
        holds the batch at ``offset``, the batches appended to ``out``: the bytes appended and
        the offset after the last (``offset`` if none); None, appending nothing, when the read
        would go to object storage."""
        base = self.base_offset
        if offset < base:
            offset = base
        if offset >= end:
            return 0, offset
        shift = self.log_slice.start - base  # Kafka offset -> stream offset
        hot = self.log_stream.read_whole_cached(
            offset + shift, end + shift, max_bytes, min_one, out
        )
        if hot is None:
            return None
        taken, stop = hot
        return taken, (stop - shift if taken else offset)

    def _read_range(self, offset: int, max_offset: int | None) -> tuple[int, int]:
        """Where a read from ``offset`` towards ``max_offset`` starts and ends in the segment."""
        next_offset = self.next_offset
        end = next_offset if max_offset is None else min(next_offset, max_offset)
        return max(offset, self.base_offset), end

    async def batches(self, offset: int) -> AsyncGenerator[BatchView, None]:
        """Every batch from the one holding ``offset`` to the segment's end, headers parsed."""
        pos = max(offset, self.base_offset)
        end = self.next_offset
        while pos < end:
            result = await self.log_stream.fetch(
                self.to_stream(pos), self.to_stream(end), SCAN_FETCH_BYTES
            )
            if not result.batches:
                # the stream's metadata says it holds these offsets: what was replayed from
                # here (producer state, a recovery) misses them
                log.error(
                    "log stream %d: no batch at offset %d before the segment's end %d",
                    self.log_stream.stream_id,
                    pos,
                    end,
                )
                return
            for batch in result.batches:
                data = memoryview(batch.payload)
                yield BatchView(parse_header(data), data)
                pos = self.to_kafka(batch.last_offset)

    async def find_offset_by_timestamp(
        self, timestamp: int, start_offset: int
    ) -> tuple[int, int] | None:
        """``(offset, max timestamp)`` of the first batch at or after ``start_offset`` whose max
        timestamp is >= ``timestamp``: the time index says where to start scanning."""
        entry = await self.time_index.lookup(timestamp)
        async with aclosing(self.batches(max(entry.offset, start_offset))) as views:
            async for view in views:
                if view.header.max_timestamp >= timestamp:
                    return max(view.header.base_offset, start_offset), view.header.max_timestamp
        return None

    async def batch_holding(self, offset: int) -> BatchView | None:
        """The batch that holds ``offset``, if the segment has it."""
        async with aclosing(self.batches(offset)) as views:
            async for view in views:
                return view
        return None
