"""StreamReader: one sequential reader's position in a stream, with read-ahead across objects
(AutoMQ's ``StreamReader``), and StreamReaders, the node's set of them.

A reader keeps the stream's data blocks located from its position on, in offset order and
across object boundaries: a few objects at a time from the metadata (``get_objects``), their
indexes from the ObjectReader. A read takes the blocks holding its offsets, loads the ones the
block cache lacks (one ranged GET per run of adjacent blocks of an object) and parses only what
it returns. After each read the reader may read ahead in the background (:class:`Readahead`):
the next blocks of the stream, in whichever objects they lie, are loaded into the block cache
as *unread*, so a consumer catching up finds its next fetch already in memory.

StreamReaders finds the reader a read continues: the one whose last read began at or before
the read's start and ended at or after it (Kafka re-reads the tail of a fetch that did not fit
its byte limit). Readers idle for ``READER_IDLE_S`` are dropped. Each reader's read-ahead is
capped so that the read-ahead of every active reader fits in the block cache at once. A reader
shares that room from the first read-ahead it starts until it finds no further object in the
stream (a MetaStream read when a partition opens, a consumer that caught up with the uploads) or
stays unused for ``READER_ACTIVE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from storage import object_format
from storage.block_cache import Block, BlockCache
from storage.metadata.manager import MetadataManager
from storage.object_format import DataBlockIndex
from storage.object_reader import ObjectReader
from storage.operator.base import ObjectNotFoundError
from storage.stream_record_batch import StreamRecordBatch

log = logging.getLogger("automq.storage.read")

MIN_READAHEAD = 1 << 20  # the first read-ahead: a Kafka fetch's 1 MiB per partition
GET_OBJECTS_STEP = 4  # objects located per metadata lookup
READER_IDLE_S = 60.0  # a reader not used for this long is dropped
READER_ACTIVE_S = 10.0  # readers used this recently share the cache's room for read-ahead
READERS_PER_STREAM = 8  # most readers kept for one stream (consumers at different positions)
# Read-ahead not read yet (or still being read) fills at most this share of the block cache; the
# rest holds blocks being read. Each active reader gets an equal part of it for the two
# read-aheads it keeps in front of it.
UNREAD_SHARE = 0.75


@dataclass(slots=True)
class Readahead:
    """When to read ahead and how much: a pure rule (after AutoMQ's StreamReader.Readahead).

    ``end`` is the stream offset where the data read ahead so far ends, ``size`` the size of the
    next read-ahead. After a read that ended at ``read_end``, with ``ahead`` bytes read ahead
    beyond it (:meth:`plan`):

    * a reader that caught up with the read-ahead (``read_end >= end``) gets the next one from
      ``read_end``;
    * a reader with less than ``size`` bytes ahead of it gets the next one from ``end``;
    * otherwise it has enough ahead and nothing is read.

    So a sequential reader keeps between one and two read-aheads in front of it: the one it is
    reading into and the next, on its way while it does (AutoMQ keeps one). Each read-ahead is
    twice the size of the one before, up to ``cap``: a reader that keeps reading sequentially
    soon reads in large ranged GETs.

    :meth:`advanced` records where a planned read-ahead ended (it ends on a block boundary), and
    :meth:`reset` starts over small when read-ahead was evicted before it was read.
    """

    size: int = MIN_READAHEAD
    end: int = 0

    def plan(self, read_end: int, ahead: int, cap: int) -> tuple[int, int] | None:
        """``(start offset, bytes)`` to read ahead after a read ending at ``read_end``, or None.
        ``cap`` below MIN_READAHEAD still allows MIN_READAHEAD."""
        cap = max(cap, MIN_READAHEAD)
        if read_end >= self.end:
            self.end = read_end
        elif ahead >= min(self.size, cap):
            return None
        size = min(self.size, cap)
        self.size = min(self.size * 2, cap)
        return self.end, size

    def advanced(self, end_offset: int) -> None:
        """The read-ahead just planned covers the stream up to ``end_offset``."""
        self.end = max(self.end, end_offset)

    def reset(self) -> None:
        self.size, self.end = MIN_READAHEAD, 0


@dataclass(slots=True, frozen=True)
class LocatedBlock:
    """A data block of the stream and the object it lies in."""

    object_id: int
    object_size: int
    index: DataBlockIndex


def select_blocks(
    blocks: list[LocatedBlock], start: int, end: int, max_bytes: int
) -> tuple[list[LocatedBlock], bool]:
    """The blocks a read of ``[start, end)`` (``end`` -1: no bound) of about ``max_bytes`` needs,
    from ``blocks`` (located, in offset order), and whether they are enough: False when the
    located blocks ran out first. The block holding ``start`` counts towards ``max_bytes`` only
    when the read starts at its beginning (AutoMQ's rule: its head is not returned)."""
    out: list[LocatedBlock] = []
    budget = max_bytes
    for b in blocks:
        idx = b.index
        if idx.end_offset <= start:
            continue
        if (end >= 0 and idx.start_offset >= end) or (out and budget <= 0):
            return out, True
        out.append(b)
        if len(out) > 1 or idx.start_offset >= start:
            budget -= idx.size
        if end >= 0 and idx.end_offset >= end:
            return out, True
    return out, bool(out) and budget <= 0


class StreamReader:
    """A sequential reader of one stream; see the module's docstring."""

    def __init__(
        self,
        stream_id: int,
        offset: int,
        metadata: MetadataManager,
        objects: ObjectReader,
        cache: BlockCache,
        readahead_cap: Callable[[StreamReader], int],
        sharing: set[StreamReader],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream_id = stream_id
        self.last_start = offset  # where the last read began
        self.next_offset = offset  # where the last read ended
        self._clock = clock
        self.last_access = clock()
        self.busy = False
        self.readahead = Readahead()
        self._metadata = metadata
        self._objects = objects
        self._cache = cache
        self._readahead_cap = readahead_cap
        self._sharing = sharing  # the readers that share the cache's room for read-ahead
        self._closed = False
        self._blocks: list[LocatedBlock] = []  # contiguous offsets, up to _located_end
        self._located_end = offset
        self._passed = 0  # blocks before this index are marked read in the cache
        self._generation = 0  # bumped when the located blocks are thrown away
        self._locating: asyncio.Future[bool] | None = None
        self._readahead_task: asyncio.Task[None] | None = None
        self._ahead: set[tuple[int, int]] = set()  # blocks read ahead, not read yet

    def continues(self, start: int) -> bool:
        """Whether a read at ``start`` continues this reader's last read."""
        return not self.busy and self.last_start <= start <= self.next_offset

    def close(self) -> asyncio.Task[None] | None:
        """Stop reading ahead; returns the read-ahead task, cancelled, if one was running."""
        self._closed = True
        self._sharing.discard(self)
        task, self._readahead_task = self._readahead_task, None
        if task is not None:
            task.cancel()
        return task

    # -- reading ---------------------------------------------------------------------------------

    async def read(self, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Batches from the one holding ``start`` towards ``end`` (exclusive, -1: no bound),
        about ``max_bytes`` (at least one when any is in objects); then maybe read ahead."""
        self.busy = True
        self.last_access = self._clock()
        try:
            try:
                out = await self._read(start, end, max_bytes)
            except ObjectNotFoundError:
                # compaction replaced an object and it was deleted since it was located
                self._forget_blocks(start)
                out = await self._read(start, end, max_bytes)
        finally:
            self.busy = False
        self.last_start = start
        self.next_offset = out[-1].last_offset if out else start
        self._pass()
        self._maybe_read_ahead(end)
        return out

    async def _read(self, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        if not self._blocks or not self._blocks[0].index.start_offset <= start <= self._located_end:
            self._forget_blocks(start)
        out: list[StreamRecordBatch] = []
        size = 0
        pos = start
        while (end < 0 or pos < end) and (not out or size < max_bytes):
            blocks = await self._blocks_for(pos, end, max_bytes - size)
            if not blocks:
                break
            if any(
                (b.object_id, b.index.start_position) in self._ahead
                and not self._objects.has_block(b.object_id, b.index.start_position)
                for b in blocks
            ):
                self.readahead.reset()  # read-ahead was evicted unread: the cache is too small
            loaded = await self._load(blocks, unread=False)
            progressed = False
            for b in blocks:
                if out and size >= max_bytes:
                    break
                got = object_format.block_batches(
                    loaded[(b.object_id, b.index.start_position)], pos, end, max_bytes - size
                )
                if not got:
                    break
                out.extend(got)
                size += sum(x.size for x in got)
                pos = got[-1].last_offset
                progressed = True
            if not progressed:
                break
        return out

    async def _blocks_for(self, start: int, end: int, max_bytes: int) -> list[LocatedBlock]:
        """Located blocks for a read (see :func:`select_blocks`), locating more as needed."""
        while True:
            generation = self._generation
            blocks, enough = select_blocks(self._blocks, start, end, max_bytes)
            if enough or (end >= 0 and self._located_end >= end):
                return blocks
            if not await self._locate_more():
                return blocks
            if generation != self._generation:
                return []

    def _forget_blocks(self, offset: int) -> None:
        self._blocks = []
        self._located_end = offset
        self._passed = 0
        self._generation += 1
        self._locating = None
        self._ahead.clear()
        self.readahead.reset()

    async def _locate_more(self) -> bool:
        """Locate the blocks of the next few objects; False if there are none (one lookup at a
        time: concurrent callers share it)."""
        if self._locating is None:
            self._locating = asyncio.ensure_future(self._locate(self._generation))
        locating = self._locating
        try:
            return await asyncio.shield(locating)
        finally:
            if self._locating is locating and locating.done():
                self._locating = None

    async def _locate(self, generation: int) -> bool:
        offset = self._located_end
        objects = self._metadata.get_objects(self.stream_id, offset, -1, GET_OBJECTS_STEP)
        if not objects:
            self._sharing.discard(self)  # nothing further to read ahead, for now
            return False
        indexes = await asyncio.gather(
            *(self._objects.index(o.object_id, o.object_size) for o in objects)
        )
        if generation != self._generation:
            return True  # thrown away meanwhile: the caller looks again
        found = False
        for obj, index in zip(objects, indexes, strict=True):
            for idx in object_format.find_blocks(index, self.stream_id, offset, obj.end_offset):
                if idx.end_offset <= offset:
                    continue
                if idx.start_offset > offset:
                    log.error(
                        "stream %d: object %d has no block at offset %d (next block starts at %d)",
                        self.stream_id,
                        obj.object_id,
                        offset,
                        idx.start_offset,
                    )
                    return found
                self._blocks.append(LocatedBlock(obj.object_id, obj.object_size, idx))
                offset = idx.end_offset
                found = True
        self._located_end = offset
        return found

    async def _load(
        self, blocks: list[LocatedBlock], *, unread: bool
    ) -> dict[tuple[int, int], Block]:
        """The bytes of ``blocks``, one ObjectReader call per object, objects concurrently."""
        by_object: dict[int, list[DataBlockIndex]] = {}
        for b in blocks:
            by_object.setdefault(b.object_id, []).append(b.index)
        loaded = await asyncio.gather(
            *(self._objects.load_blocks(oid, idx, unread=unread) for oid, idx in by_object.items())
        )
        return {
            (oid, position): data
            for oid, got in zip(by_object, loaded, strict=True)
            for position, data in got.items()
        }

    def _pass(self) -> None:
        """Mark blocks the reader has read past as read in the cache (evicted first), and drop
        those before its last read's start from the located list."""
        blocks = self._blocks
        while (
            self._passed < len(blocks) and blocks[self._passed].index.end_offset <= self.next_offset
        ):
            b = blocks[self._passed]
            self._cache.mark_read(b.object_id, b.index.start_position)
            self._ahead.discard((b.object_id, b.index.start_position))
            self._passed += 1
        drop = 0
        while drop < self._passed and blocks[drop].index.end_offset <= self.last_start:
            drop += 1
        if drop:
            del blocks[:drop]
            self._passed -= drop

    # -- read-ahead ------------------------------------------------------------------------------

    def _maybe_read_ahead(self, limit: int) -> None:
        """Start a read-ahead if the reader needs one, of data before ``limit`` (-1: no bound):
        what a read's caller gets elsewhere (the LogCache's) is not read ahead."""
        if self._closed:
            return  # dropped while its last read ran
        if self._readahead_task is not None and not self._readahead_task.done():
            return  # AutoMQ's rule too: one read-ahead being planned at a time
        if 0 <= limit <= self.next_offset:
            return
        cap = self._readahead_cap(self)
        if cap < MIN_READAHEAD:
            return  # the cache holds as much unread read-ahead as it may: try after a later read
        ahead = sum(
            b.index.size
            for b in self._blocks[self._passed :]
            if b.index.end_offset <= self.readahead.end
        )
        plan = self.readahead.plan(self.next_offset, ahead, cap)
        if plan is not None:
            self._sharing.add(self)
            self._readahead_task = asyncio.create_task(
                self._read_ahead(*plan, limit), name=f"readahead-{self.stream_id}"
            )

    async def _read_ahead(self, start: int, max_bytes: int, limit: int) -> None:
        """Locate ``max_bytes`` of blocks from ``start`` (those before ``limit``, -1: no
        bound) and start loading them as unread."""
        generation = self._generation
        try:
            blocks = await self._blocks_for(start, limit, max_bytes)
            if generation != self._generation or not blocks:
                return
            self.readahead.advanced(blocks[-1].index.end_offset)
            by_object: dict[int, list[DataBlockIndex]] = {}
            for b in blocks:
                by_object.setdefault(b.object_id, []).append(b.index)
            for object_id, indexes in by_object.items():
                self._objects.prefetch(object_id, indexes)
            self._ahead.update((b.object_id, b.index.start_position) for b in blocks)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the read that needs the data will try again and report
            log.debug("stream %d: read-ahead from %d failed: %r", self.stream_id, start, e)


class StreamReaders:
    """The node's StreamReaders: finds or makes the reader a read continues, drops idle ones,
    and caps each one's read-ahead by the block cache's room."""

    def __init__(
        self,
        metadata: MetadataManager,
        objects: ObjectReader,
        cache: BlockCache,
        max_readahead: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metadata = metadata
        self._objects = objects
        self._cache = cache
        self._max_readahead = max_readahead
        self._clock = clock
        self._readers: dict[int, list[StreamReader]] = {}
        # readers that read ahead, used in the last READER_ACTIVE_S (the sweep drops the others)
        self._sharing: set[StreamReader] = set()
        self._swept_at = clock()

    def __len__(self) -> int:
        return sum(len(r) for r in self._readers.values())

    async def read(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        self._sweep()
        return await self.reader_for(stream_id, start).read(start, end, max_bytes)

    def reader_for(self, stream_id: int, start: int) -> StreamReader:
        readers = self._readers.setdefault(stream_id, [])
        for reader in readers:
            if reader.continues(start):
                return reader
        reader = StreamReader(
            stream_id,
            start,
            self._metadata,
            self._objects,
            self._cache,
            self.readahead_cap,
            self._sharing,
            self._clock,
        )
        readers.append(reader)
        if len(readers) > READERS_PER_STREAM:
            oldest = min(readers, key=lambda r: r.last_access)
            readers.remove(oldest)
            oldest.close()
        return reader

    def readahead_cap(self, reader: StreamReader | None = None) -> int:
        """The most ``reader`` may read ahead now: ``s3.block.cache.readahead.size``, less
        when the active readers' read-ahead (``reader``'s counted) would not fit in the block
        cache, and never more than the room left for unread read-ahead (counting GETs in
        flight)."""
        budget = int(self._cache.max_bytes * UNREAD_SHARE)
        sharing = len(self._sharing) + (reader is not None and reader not in self._sharing)
        share = budget // (2 * max(sharing, 1))
        room = budget - self._cache.unread_size - self._objects.prefetching
        return min(self._max_readahead, share, room)

    def _sweep(self) -> None:
        now = self._clock()
        if now - self._swept_at < 1.0:
            return
        self._swept_at = now
        for stream_id, readers in list(self._readers.items()):
            for reader in list(readers):
                idle = now - reader.last_access
                if idle > READER_IDLE_S and not reader.busy:
                    readers.remove(reader)
                    reader.close()
                elif idle > READER_ACTIVE_S:
                    self._sharing.discard(reader)
            if not readers:
                del self._readers[stream_id]

    def forget(self, stream_id: int) -> None:
        """Drop the stream's readers (the stream closed here or was deleted)."""
        for reader in self._readers.pop(stream_id, []):
            reader.close()

    def clear(self) -> list[asyncio.Task[None]]:
        """Drop every reader; returns their read-ahead tasks, cancelled."""
        tasks = []
        for readers in self._readers.values():
            for reader in readers:
                task = reader.close()
                if task is not None:
                    tasks.append(task)
        self._readers.clear()
        self._sharing.clear()
        return tasks

    async def close(self) -> None:
        """Drop every reader and wait for their read-ahead to stop."""
        for task in self.clear():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
