"""LogCache: durable-but-not-yet-uploaded stream data in memory, and recent data for hot reads.

Data arrives per stream in offset order after the WAL made it durable. It accumulates in the
*active* block; an upload seals the active block (a new one starts) and, once the block's
objects are committed, marks it uploaded. Uploaded blocks stay readable until the cache needs
their room, oldest records first: whole blocks while a whole block is over, then the oldest
records of the next (in WAL order), so the cache keeps ``s3.wal.cache.size`` of the newest data
rather than dropping an upload's worth (``s3.wal.upload.threshold``, 100 MiB) at once. Every
record is therefore either in the cache or committed to object storage, so a reader never sees a
gap.

A block keeps each stream's records column by column (:class:`CachedRun`): offsets and epochs
in arrays, payloads as ``bytes`` in a dict keyed by position. None of these is an object the
cyclic garbage collector tracks, so a full cache costs a collection nothing. Kept as one
``StreamRecordBatch`` per record, with its payload a ``memoryview`` of the request, a record was
three tracked objects (four with its time-index entry); a generation-1 collection walked 150,000
of them in a 20 MB/s produce and held the interpreter, the loop and the WAL writer with it, for
60-80 ms. A list of the payloads is one tracked object, but a collection that walks it visits
every payload it holds, each in memory of its own (a cache miss apiece): a young generation of
9,140 objects that held a filling block's lists took 9.5 ms to collect, 21-28 ms of the loop's
time with the collector's callbacks, in a per-record client's produce at 20 MB/s. A dict whose
keys and values are all untracked (ints, bytes) is left untracked by the interpreter.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from storage.stream_record_batch import StreamRecordBatch

# payloads freed per step of release_gradually: ~0.2 ms of the event loop's time
RELEASE_STEP = 128
# a fetch's read joins consecutive payloads under JOINED_PAYLOAD bytes into buffers of up to
# about JOINED_CHUNK (append_joined)
JOINED_PAYLOAD = 8 * 1024
JOINED_CHUNK = 64 * 1024


def release_gradually(payload_lists: list[dict[int, bytes]]) -> None:
    """Free the payloads of ``payload_lists`` (which no one else reads any more) a slice of
    RELEASE_STEP at a time, each slice in its own callback of the running event loop; at once
    when no loop runs. Dropped in one go, a block of the default upload threshold (100 MiB of
    payloads of ~12 KiB, 8,000 objects) held the loop for ~13 ms, and glibc handed the memory
    back to the kernel within that same call."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return

    def step() -> None:
        budget = RELEASE_STEP
        while payload_lists and budget > 0:
            last = payload_lists[-1]
            n = min(budget, len(last))
            for _ in range(n):
                last.popitem()
            budget -= n
            if not last:
                payload_lists.pop()
        if payload_lists:
            loop.call_soon(step)

    loop.call_soon(step)


class CachedRun(Sequence[StreamRecordBatch]):
    """One stream's records in a block, in offset order, stored column by column. Indexing
    builds the :class:`StreamRecordBatch` of a record on demand."""

    __slots__ = ("bases", "ends", "epochs", "first", "payloads", "stream_id")

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.first = 0  # the payloads' key of the run's first record (records evicted before it)
        self.bases = array("q")
        self.ends = array("q")  # each record's exclusive end offset, for bisection
        self.epochs = array("q")
        # position -> payload: a dict of ints and bytes is not tracked by the collector (a
        # list always is, and a collection walking it would touch every payload)
        self.payloads: dict[int, bytes] = {}

    def append(self, record: StreamRecordBatch) -> None:
        if self.ends and self.ends[-1] != record.base_offset:
            raise ValueError(
                f"stream {self.stream_id}: record at {record.base_offset} does not follow "
                f"{self.ends[-1]}"
            )
        self.bases.append(record.base_offset)
        self.ends.append(record.last_offset)
        self.epochs.append(record.epoch)
        payload = record.payload
        # a copy, unless it already is bytes: a memoryview is tracked by the collector, and
        # keeps the whole request it came from alive
        payloads = self.payloads
        payloads[self.first + len(payloads)] = payload if type(payload) is bytes else bytes(payload)

    def __len__(self) -> int:
        return len(self.bases)

    @overload
    def __getitem__(self, i: int) -> StreamRecordBatch: ...

    @overload
    def __getitem__(self, i: slice) -> list[StreamRecordBatch]: ...

    def __getitem__(self, i: int | slice) -> StreamRecordBatch | list[StreamRecordBatch]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self.bases)
        base = self.bases[i]
        return StreamRecordBatch(
            self.stream_id, self.epochs[i], base, self.ends[i] - base, self.payloads[self.first + i]
        )

    def __iter__(self) -> Iterator[StreamRecordBatch]:
        for i in range(len(self.bases)):
            yield self[i]

    def drop_first(self, n: int) -> dict[int, bytes]:
        """Remove the run's first ``n`` records; their payloads, for the caller to free."""
        first = self.first
        payloads = self.payloads
        dropped = {key: payloads.pop(key) for key in range(first, first + n)}
        del self.bases[:n]
        del self.ends[:n]
        del self.epochs[:n]
        self.first = first + n
        return dropped

    def get(self, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Records overlapping ``[start, end)``, at most about ``max_bytes``."""
        ends = self.ends
        if not ends or ends[-1] <= start:
            return []
        i = bisect.bisect_right(ends, start)
        out: list[StreamRecordBatch] = []
        size = 0
        while i < len(ends) and self.bases[i] < end and size < max_bytes:
            record = self[i]
            out.append(record)
            size += record.size
            i += 1
        return out

    def take_whole(
        self, i: int, end: int, max_bytes: int, taken: int, first_free: bool, out: list[memoryview]
    ) -> tuple[int, int, bool]:
        """Append to ``out`` the payloads of the records from position ``i`` on that start
        before ``end``, while the bytes taken (``taken`` so far) stay within ``max_bytes``; the
        first regardless when ``first_free``. Returns the bytes taken, the offset after the last
        record taken (-1 if none) and whether the budget stopped it. The fetch path's loop: no
        record objects are built; consecutive small payloads come joined
        (:func:`append_joined`)."""
        bases, ends, payloads = self.bases, self.ends, self.payloads
        key = self.first + i
        count = len(ends)
        stop = -1
        took: list[bytes] = []
        budget_hit = False
        while i < count and bases[i] < end:
            payload = payloads[key]
            size = len(payload)
            if taken + size > max_bytes and not first_free:
                budget_hit = True
                break
            first_free = False
            took.append(payload)
            taken += size
            stop = ends[i]
            i += 1
            key += 1
        append_joined(out, took)
        return taken, stop, budget_hit


def append_joined(out: list[memoryview], payloads: Sequence[bytes | memoryview]) -> None:
    """Append ``payloads`` to ``out`` (a fetch's read), consecutive ones under
    :data:`JOINED_PAYLOAD` bytes joined into buffers of about :data:`JOINED_CHUNK`: each buffer
    costs the fetch's response more than copying a few KiB does, and a consumer catching up
    with a producer's small batches reads hundreds of them a partition."""
    if len(payloads) == 1:
        out.append(memoryview(payloads[0]))
        return
    run: list[bytes | memoryview] = []
    run_size = 0
    for payload in payloads:
        size = len(payload)
        if size >= JOINED_PAYLOAD:
            if run:
                out.append(_joined(run))
                run, run_size = [], 0
            out.append(memoryview(payload))
            continue
        run.append(payload)
        run_size += size
        if run_size >= JOINED_CHUNK:
            out.append(_joined(run))
            run, run_size = [], 0
    if run:
        out.append(_joined(run))


def _joined(run: list[bytes | memoryview]) -> memoryview:
    return memoryview(run[0] if len(run) == 1 else b"".join(run))


@dataclass(slots=True)
class LogCacheBlock:
    """Records of many streams, in per-stream offset order, plus the WAL span they came from."""

    block_id: int
    first_put_at: float = -1.0  # time.monotonic() of the first record, -1 while empty
    sealed_at: float = -1.0  # time.monotonic() of the seal
    records: dict[int, CachedRun] = field(default_factory=dict)
    size: int = 0
    stream_sizes: dict[int, int] = field(default_factory=dict)  # bytes per stream
    stream_epochs: dict[int, int] = field(default_factory=dict)  # newest epoch per stream
    # per stream, each record's WAL offset and size, in pairs: where the upload worker reads it
    wal_positions: dict[int, array[int]] = field(default_factory=dict)
    wal_start: int = -1  # smallest WAL offset of a record in the block
    wal_end: int = -1  # WAL offset just past the block's last record
    sealed: bool = False
    uploaded: bool = False
    order_id: int = -1  # the SSO order id, fixed at the first upload attempt
    # bumped whenever streams leave the block: objects staged before no longer match it
    revision: int = 0

    def put(self, record: StreamRecordBatch, wal_offset: int, wal_next_offset: int) -> None:
        records = self.records.get(record.stream_id)
        if records is None:
            records = self.records[record.stream_id] = CachedRun(record.stream_id)
        records.append(record)
        if self.first_put_at < 0:
            self.first_put_at = time.monotonic()
        size = record.size
        self.size += size
        self.stream_sizes[record.stream_id] = self.stream_sizes.get(record.stream_id, 0) + size
        if record.epoch > self.stream_epochs.get(record.stream_id, -1):
            self.stream_epochs[record.stream_id] = record.epoch
        positions = self.wal_positions.get(record.stream_id)
        if positions is None:
            positions = self.wal_positions[record.stream_id] = array("q")
        positions.append(wal_offset)
        positions.append(size)
        if self.wal_start < 0 or wal_offset < self.wal_start:
            self.wal_start = wal_offset
        self.wal_end = max(self.wal_end, wal_next_offset)

    def get(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Records of ``stream_id`` overlapping ``[start, end)``, at most about ``max_bytes``."""
        records = self.records.get(stream_id)
        return records.get(start, end, max_bytes) if records is not None else []

    def discard(self, stream_id: int) -> int:
        """Remove the stream's records; the bytes they took."""
        records = self.records.pop(stream_id, None)
        self.wal_positions.pop(stream_id, None)
        self.stream_epochs.pop(stream_id, None)
        dropped = self.stream_sizes.pop(stream_id, 0)
        if records is None:
            return 0
        self.size -= dropped
        self.revision += 1
        return dropped

    def drop_oldest(self, nbytes: int) -> tuple[int, list[dict[int, bytes]]]:
        """Remove the block's oldest records, across its streams, up to a WAL offset that
        leaves about ``nbytes`` of them gone: the bytes removed and the removed payloads, for
        the caller to free. Only for an uploaded block: an upload reads the others at the WAL
        positions this trims.

        The block's records fill its WAL span in order, so the cut is the fraction of the span
        ``nbytes`` is of the block's bytes (the WAL's framing makes it a little more), and at
        least the oldest record goes. A pass over the streams, a bisection each."""
        if not self.wal_positions or nbytes <= 0:
            return 0, []
        start = min(positions[0] for positions in self.wal_positions.values())
        span = max(self.wal_end - start, 1)
        cut = start + max(-(-nbytes * span // max(self.size, 1)), 1)
        removed = 0
        payloads: list[dict[int, bytes]] = []
        for stream_id, positions in list(self.wal_positions.items()):
            if positions[0] >= cut:
                continue
            n = bisect.bisect_left(positions[0::2], cut)
            if 2 * n == len(positions):
                dropped = self.stream_sizes.pop(stream_id, 0)
                payloads.append(self.records.pop(stream_id).payloads)
                del self.wal_positions[stream_id]
                self.stream_epochs.pop(stream_id, None)
            else:
                dropped = sum(positions[1 : 2 * n : 2])
                self.stream_sizes[stream_id] -= dropped
                payloads.append(self.records[stream_id].drop_first(n))
                del positions[: 2 * n]
            removed += dropped
        self.size -= removed
        self.wal_start = min((p[0] for p in self.wal_positions.values()), default=self.wal_end)
        self.revision += 1
        return removed, payloads

    def move_to(self, stream_id: int, other: LogCacheBlock, from_offset: int = 0) -> None:
        """Append the stream's records ending past ``from_offset`` to ``other``."""
        records = self.records.get(stream_id)
        if records is None:
            return
        positions = self.wal_positions[stream_id]
        for i, record in enumerate(records):
            if record.last_offset > from_offset:
                wal_offset = positions[2 * i]
                other.put(record, wal_offset, wal_offset + positions[2 * i + 1])


class LogCache:
    """Ordered blocks; the last one is active (receiving appends)."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._next_block_id = 0
        self._blocks: deque[LogCacheBlock] = deque([self._new_block()])
        # running totals: append checks them on every call
        self.size = 0
        self.unuploaded_size = 0

    def _new_block(self) -> LogCacheBlock:
        block = LogCacheBlock(self._next_block_id)
        self._next_block_id += 1
        return block

    @property
    def active(self) -> LogCacheBlock:
        return self._blocks[-1]

    def put(self, record: StreamRecordBatch, wal_offset: int, wal_next_offset: int) -> None:
        self.active.put(record, wal_offset, wal_next_offset)
        self.size += record.size
        self.unuploaded_size += record.size  # bytes only in the WAL and here: bounds memory

    def seal(self) -> LogCacheBlock | None:
        """Seal the active block for upload and start a new one; None if it is empty."""
        block = self.active
        if not block.records:
            return None
        block.sealed = True
        block.sealed_at = time.monotonic()
        self._blocks.append(self._new_block())
        return block

    def sealed_blocks(self) -> list[LogCacheBlock]:
        return [b for b in self._blocks if b.sealed and not b.uploaded]

    def mark_uploaded(self, block: LogCacheBlock) -> None:
        block.uploaded = True
        self.unuploaded_size -= block.size
        self.evict()

    def evict(self, keep: int | None = None) -> None:
        """Drop uploaded records, oldest first, while the cache holds more than ``keep`` bytes:
        whole blocks while a whole block is over, then the oldest records of the next. Dropped
        records are gone at once; their memory is freed a slice at a time (see
        :func:`release_gradually`)."""
        limit = self.max_size if keep is None else keep
        # blocks are uploaded in order, so uploaded ones are at the front
        while self.size > limit and self._blocks[0].uploaded:
            block = self._blocks[0]
            over = self.size - limit
            if block.size > over:
                removed, payloads = block.drop_oldest(over)
                if removed:
                    self.size -= removed
                    release_gradually(payloads)
                    if not block.records:
                        self._blocks.popleft()
                    continue
            self._blocks.popleft()
            self.size -= block.size
            runs, block.records = block.records, {}
            release_gradually([run.payloads for run in runs.values()])

    def drop_uploaded(self) -> None:
        """Forget every uploaded block, so reads of that data go to object storage."""
        self.evict(keep=0)

    def discard_stream(self, stream_id: int) -> None:
        """Forget a stream's records that are not uploaded (the node lost the stream)."""
        for block in self._blocks:
            if not block.uploaded:
                dropped = block.discard(stream_id)
                self.size -= dropped
                self.unuploaded_size -= dropped

    def extract_streams(self, stream_ids: Iterable[int]) -> LogCacheBlock | None:
        """Take the records of ``stream_ids`` not yet uploaded out of every block into a new
        sealed block of their own (block id -1: outside the cache, which no longer counts
        them); None if there are none. A stream handed over is uploaded alone, without
        waiting for the rest of the cache."""
        out = LogCacheBlock(-1)
        for stream_id in stream_ids:
            for block in self._blocks:
                if not block.uploaded and stream_id in block.records:
                    block.move_to(stream_id, out)
                    dropped = block.discard(stream_id)
                    self.size -= dropped
                    self.unuploaded_size -= dropped
        if not out.records:
            return None
        out.sealed = True
        out.sealed_at = time.monotonic()
        return out

    def unuploaded(self, stream_ids: Iterable[int]) -> tuple[int, int]:
        """Bytes of ``stream_ids`` not yet uploaded, and how many of them have some."""
        pending = [b for b in self._blocks if not b.uploaded]
        total = holding = 0
        for stream_id in stream_ids:
            size = sum(b.stream_sizes.get(stream_id, 0) for b in pending)
            if size:
                total += size
                holding += 1
        return total, holding

    def wal_trim_offset(self, fallback: int) -> int:
        """The WAL offset below which every record has been uploaded."""
        pending = [b.wal_start for b in self._blocks if not b.uploaded and b.wal_start >= 0]
        return min(pending) if pending else fallback

    def read_whole(
        self,
        stream_id: int,
        start: int,
        end: int,
        max_bytes: int,
        min_one: bool,
        out: list[memoryview],
    ) -> tuple[int, int] | None:
        """Append to ``out`` the payloads of a stream's cached records from the one holding
        ``start``, whole, none starting at or after ``end``, while their bytes stay within
        ``max_bytes`` (the first however large when ``min_one``). Returns the bytes appended and
        the offset after the last record (``start`` if none); None, appending nothing, when the
        cache does not hold ``start``: the caller reads from object storage."""
        blocks = self._blocks
        # the block holding ``start``, found from the newest: a consumer keeping up reads the
        # newest records (a stream's records are in order, block after block)
        k = len(blocks) - 1
        while k >= 0:
            run = blocks[k].records.get(stream_id)
            if run is not None and run.bases and run.bases[0] <= start:
                break
            k -= 1
        else:
            return None  # the cache's records of the stream start after ``start``, if any
        if run.ends[-1] <= start:
            return None  # a gap: ``start`` is past this block's records, before the next one's
        taken, pos, full = run.take_whole(
            bisect.bisect_right(run.ends, start), end, max_bytes, 0, min_one, out
        )
        if pos < 0:
            return 0, start
        k += 1
        count = len(blocks)
        while not full and pos < end and k < count:  # on into the next blocks
            run = blocks[k].records.get(stream_id)
            k += 1
            if run is None or not run.ends or run.ends[-1] <= pos:
                continue
            i = bisect.bisect_right(run.ends, pos)
            if run.bases[i] != pos:
                break  # not contiguous (a stream's records are in order: never seen)
            taken, stop, full = run.take_whole(i, end, max_bytes, taken, min_one and not taken, out)
            if stop < 0:
                break
            pos = stop
        return taken, pos

    def get(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Cached records of a stream from ``start`` on: a contiguous run, possibly empty.

        The run starts at the record holding ``start`` when the cache has it, otherwise at the
        stream's first cached record (the caller reads the part before it from object storage).
        """
        out: list[StreamRecordBatch] = []
        size = 0
        pos = start
        for block in self._blocks:
            if size >= max_bytes:
                break
            got = block.get(stream_id, pos, end, max_bytes - size)
            if not got:
                continue
            if out and got[0].base_offset != out[-1].last_offset:
                break
            out.extend(got)
            size += sum(r.size for r in got)
            pos = got[-1].last_offset
        return out
