"""A segment's time index, kept in the partition's ``tim`` stream (AutoMQ's ``ElasticTimeIndex``).

Entries are 12 bytes each, and a stream record of ``n`` entries has count ``12 * n``, so ``tim``
stream offsets are byte positions (entry ``n`` of a segment lies at ``slice.start + 12 * n``), in
Kafka's ``.timeindex`` layout:

======  ===============  =====  ==============================================
offset  field            bytes  meaning
======  ===============  =====  ==============================================
0       timestamp        8      int64, big-endian: a max timestamp so far
8       relativeOffset   4      int32, big-endian: offset - segment base offset
======  ===============  =====  ==============================================

Entry ``(t, o)`` says: the segment's largest timestamp first reached ``t`` in the batch whose
last offset is ``o``; every earlier batch has a smaller max timestamp. Entries are strictly
increasing in both fields.

Kafka's rule decides when to add one: after a batch is appended, if more than
``index.interval.bytes`` of log were appended since the last entry (not counting this batch),
the segment's max timestamp so far is indexed, if larger than the last entry's. A segment that
stops being active indexes its max timestamp so far regardless of the interval, so a sealed
segment's last entry holds its largest timestamp.

An active segment's new entries are held in memory and appended ``FLUSH_ENTRIES`` at a time
(and when the segment stops being active, or its log closes): an entry per batch was one more
WAL append, cache entry and stream record for every Produce. The index serves lookups from
memory meanwhile. Entries lost in a crash are rebuilt by recovery, which indexes the log's
batches past the last entry the stream holds; an index short of some entries still finds the
right offsets, from an earlier start.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
from array import array

from automq_py.log.elastic_log_meta import NO_TIMESTAMP, NOOP_OFFSET, SliceRange, TimestampOffset
from storage.stream import S3Stream

ENTRY = struct.Struct(">qi")
ENTRY_SIZE = ENTRY.size  # 12
INT32_MAX = (1 << 31) - 1
FETCH_BYTES = 1 << 20
FLUSH_ENTRIES = 64  # new entries appended to the stream together

assert ENTRY_SIZE == 12

UNKNOWN = TimestampOffset(NO_TIMESTAMP, -1)  # Kafka's TimestampOffset.UNKNOWN


class TimeIndexError(ValueError):
    """An entry out of order, or index bytes that are not whole entries."""


def encode_entry(timestamp: int, relative_offset: int) -> bytes:
    """One 12-byte entry."""
    if not 0 <= relative_offset <= INT32_MAX:
        raise TimeIndexError(f"relative offset {relative_offset} does not fit in an int32")
    return ENTRY.pack(timestamp, relative_offset)


def decode_entries(buf: bytes | memoryview) -> list[tuple[int, int]]:
    """``(timestamp, relative offset)`` of each entry in ``buf`` (whole entries only)."""
    if len(buf) % ENTRY_SIZE:
        raise TimeIndexError(f"time index bytes {len(buf)} are not a multiple of {ENTRY_SIZE}")
    return list(ENTRY.iter_unpack(buf))


def lookup_entry(
    timestamps: array[int], offsets: array[int], target: int, base_offset: int
) -> TimestampOffset:
    """The last entry whose timestamp is <= ``target``; ``(-1, base_offset)`` if none is
    (Kafka's ``TimeIndex.lookup``). A scan for ``target`` may start at its offset."""
    slot = bisect.bisect_right(timestamps, target) - 1
    if slot < 0:
        return TimestampOffset(NO_TIMESTAMP, base_offset)
    return TimestampOffset(timestamps[slot], offsets[slot])


class SegmentTimeIndex:
    """The time index of one segment: a slice of the ``tim`` stream, plus the segment's max
    timestamp so far (Kafka's ``LogSegment.maxTimestampAndOffsetSoFar``).

    Entries are read from the stream on the first lookup and kept in memory after that.
    """

    def __init__(
        self,
        stream: S3Stream,
        base_offset: int,
        slice_range: SliceRange,
        last_entry: TimestampOffset,
        *,
        index_interval_bytes: int,
        max_entries: int,
    ) -> None:
        self.stream = stream
        self.base_offset = base_offset
        self.slice_start = slice_range.start
        self.slice_end = slice_range.end  # -1 while active: up to the stream's end
        self.last_entry = last_entry
        self.index_interval_bytes = index_interval_bytes
        self.max_entries = max_entries
        # a loaded (or empty) index shows its max so far in its last entry; see recover()
        self.max_so_far = last_entry if last_entry.timestamp != NO_TIMESTAMP else UNKNOWN
        self.bytes_since_last_entry = 0
        self._timestamps: array[int] | None = None
        self._offsets: array[int] | None = None
        # entries this process started while the arrays were not loaded yet: they may not be
        # durable (readable from the stream) when a lookup loads the arrays, so they are kept
        # here, from stream position ``_tail_start`` on, and appended after the loaded ones
        self._tail_start = -1
        self._tail_timestamps: array[int] = array("q")
        self._tail_offsets: array[int] = array("q")
        self._unwritten = bytearray()  # entries not appended to the stream yet

    @property
    def is_active(self) -> bool:
        return self.slice_end == NOOP_OFFSET

    @property
    def slice_range(self) -> SliceRange:
        return SliceRange(self.slice_start, self.slice_end)

    @property
    def entries(self) -> int:
        active = self.is_active
        end = self.stream.next_offset + len(self._unwritten) if active else self.slice_end
        return (end - self.slice_start) // ENTRY_SIZE

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    async def on_batch_appended(
        self, size: int, max_timestamp: int, base_offset: int, last_offset: int, *, after: int = -1
    ) -> None:
        """Account for a batch appended to the segment; add an entry by Kafka's rule. During
        recovery, ``after`` is the last indexed offset: batches up to it are indexed already."""
        pending = self.on_batch_submitted(
            size, max_timestamp, base_offset, last_offset, after=after
        )
        if pending is not None:
            await pending

    def on_batch_submitted(
        self, size: int, max_timestamp: int, base_offset: int, last_offset: int, *, after: int = -1
    ) -> asyncio.Future[None] | None:
        """:meth:`on_batch_appended` for a batch whose WAL write was just started: an entry
        due is added, and when that makes ``FLUSH_ENTRIES`` unwritten, they are appended to the
        stream (after the batch) and the future of their durability returned. The index holds
        the entry from now on: lookups may find offsets the log has not made durable yet, which
        readers bound by the high watermark."""
        if max_timestamp > self.max_so_far.timestamp:
            self.max_so_far = TimestampOffset(max_timestamp, last_offset)
        pending = None
        if self.bytes_since_last_entry > self.index_interval_bytes and base_offset > after:
            pending = self._start_entry(self.max_so_far)
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += size
        return pending

    async def maybe_append(self, entry: TimestampOffset) -> None:
        """Add ``entry`` if its timestamp is larger than the last entry's, and append every
        entry not yet in the stream; returns once they are durable."""
        self._start_entry(entry)
        pending = self._flush()
        if pending is not None:
            await asyncio.shield(pending)

    def _flush(self) -> asyncio.Future[None] | None:
        """Append the unwritten entries as one stream record; the future of its durability."""
        if not self._unwritten:
            return None
        data = bytes(self._unwritten)
        self._unwritten.clear()
        # no waiting for WAL cache room: the entries follow batches that just got it
        _, durable = self.stream.append_now(data, len(data))
        return durable

    def _start_entry(self, entry: TimestampOffset) -> asyncio.Future[None] | None:
        if entry.timestamp <= self.last_entry.timestamp:
            return None
        if self.entries and entry.offset < self.last_entry.offset:
            raise TimeIndexError(
                f"time index of segment {self.base_offset}: offset {entry.offset} is below the "
                f"last entry's {self.last_entry.offset}"
            )
        if not self.is_active:
            raise TimeIndexError(f"time index of segment {self.base_offset} is sealed")
        if (self.stream.next_offset - self.slice_start) % ENTRY_SIZE:
            raise TimeIndexError(
                f"time index stream {self.stream.stream_id} is at {self.stream.next_offset}, "
                f"not on an entry boundary of the slice starting at {self.slice_start}"
            )
        position = self.stream.next_offset + len(self._unwritten)
        self._unwritten += encode_entry(entry.timestamp, entry.offset - self.base_offset)
        if self._timestamps is not None and self._offsets is not None:
            self._timestamps.append(entry.timestamp)
            self._offsets.append(entry.offset)
        else:
            if self._tail_start < 0:
                self._tail_start = position
            self._tail_timestamps.append(entry.timestamp)
            self._tail_offsets.append(entry.offset)
        self.last_entry = entry
        if len(self._unwritten) >= FLUSH_ENTRIES * ENTRY_SIZE:
            return self._flush()
        return None

    def seal(self) -> SliceRange:
        """End the slice at the stream's end: the segment stops being active (after
        :meth:`maybe_append`, which leaves no entry unwritten)."""
        if self._unwritten:
            raise TimeIndexError(
                f"time index of segment {self.base_offset}: sealed with entries unwritten"
            )
        self.slice_end = self.stream.next_offset
        return self.slice_range

    async def lookup(self, target: int) -> TimestampOffset:
        """The last entry with timestamp <= ``target``, or ``(-1, base_offset)``."""
        timestamps, offsets = await self._load()
        return lookup_entry(timestamps, offsets, target, self.base_offset)

    async def recover(self) -> int:
        """Before re-scanning the segment after a crash: load the last entry from the stream
        and forget the max so far. Returns the offset up to which entries exist."""
        n = self.entries
        if n:
            pos = self.slice_start + (n - 1) * ENTRY_SIZE
            result = await self.stream.fetch(pos, pos + ENTRY_SIZE, ENTRY_SIZE)
            timestamp, relative = decode_entries(bytes(result.batches[0].payload))[0]
            self.last_entry = TimestampOffset(timestamp, self.base_offset + relative)
        else:
            self.last_entry = TimestampOffset(NO_TIMESTAMP, self.base_offset)
        self.max_so_far = UNKNOWN
        self.bytes_since_last_entry = 0
        self._unwritten.clear()
        self._timestamps = self._offsets = None
        self._forget_tail()
        return self.last_entry.offset

    def _forget_tail(self) -> None:
        self._tail_start = -1
        self._tail_timestamps = array("q")
        self._tail_offsets = array("q")

    async def _load(self) -> tuple[array[int], array[int]]:
        if self._timestamps is not None and self._offsets is not None:
            return self._timestamps, self._offsets
        timestamps, offsets = array("q"), array("q")
        pos = self.slice_start
        # what earlier runs wrote is durable; what this one started is in the tail
        tail_start = self._tail_start
        end = tail_start if tail_start >= 0 else self.slice_start + self.entries * ENTRY_SIZE
        while pos < end:
            result = await self.stream.fetch(pos, end, FETCH_BYTES)
            for batch in result.batches:
                if batch.base_offset != pos or len(batch.payload) != batch.count:
                    raise TimeIndexError(
                        f"time index stream {self.stream.stream_id}: unexpected record "
                        f"[{batch.base_offset}, {batch.last_offset}) at {pos}"
                    )
                for timestamp, relative in decode_entries(batch.payload):
                    timestamps.append(timestamp)
                    offsets.append(self.base_offset + relative)
                pos = batch.last_offset
            if not result.batches:
                raise TimeIndexError(
                    f"time index stream {self.stream.stream_id}: entries [{pos}, {end}) are "
                    "not readable"
                )
        if self._timestamps is not None and self._offsets is not None:
            return self._timestamps, self._offsets  # a concurrent lookup loaded them first
        # (the tail may have grown while the stream was read; nothing yields from here on)
        timestamps.extend(self._tail_timestamps)
        offsets.extend(self._tail_offsets)
        self._forget_tail()
        self._timestamps, self._offsets = timestamps, offsets
        return timestamps, offsets
