"""ObjectReader: reads objects in object storage, block by block.

The footer and index of an object are fetched once (one ranged GET of the object's tail, a
second only when the index is larger than the tail) and kept in a bounded cache. Blocks are
loaded with one ranged GET per run of adjacent blocks missing from the block cache; a block
already being read is waited for rather than read twice. Which blocks to load, and read-ahead
for sequential readers, is the StreamReader's business (``storage/stream_reader.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from storage import object_format
from storage.block_cache import Block, BlockCache, SharedBuffer
from storage.object_format import CorruptObjectError, DataBlockIndex
from storage.operator.base import ObjectStore
from storage.stream_record_batch import StreamRecordBatch

TAIL_READ = 64 * 1024
# largest merged ranged GET: 8-16 MiB is where a GET's time-to-first-byte stops mattering
MAX_GET_BYTES = 16 << 20

T = TypeVar("T")


class ObjectReader:
    def __init__(
        self,
        store: ObjectStore,
        namespace: str,
        block_cache: BlockCache,
        *,
        index_cache_entries: int = 1 << 20,
        max_get_bytes: int = MAX_GET_BYTES,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.block_cache = block_cache
        self._indexes: OrderedDict[int, list[DataBlockIndex]] = OrderedDict()
        self._index_cache_entries = index_cache_entries  # index entries, summed over objects
        self._index_entries = 0
        self.max_get_bytes = max_get_bytes
        self._inflight: dict[tuple[int, ...], asyncio.Future[Any]] = {}
        self._loading: dict[tuple[int, int], asyncio.Future[Block]] = {}  # block being read
        self._runs: set[asyncio.Future[dict[int, Block]]] = set()  # GETs in flight
        self.prefetching = 0  # bytes of read-ahead GETs in flight
        self.waited = 0  # load_blocks calls that waited for object storage

    def key(self, object_id: int) -> str:
        return object_format.object_key(self.namespace, object_id)

    async def _once(self, key: tuple[int, ...], make: Callable[[], Awaitable[T]]) -> T:
        """Share one in-flight request among concurrent callers asking for the same thing.

        The request runs as its own task and callers wait on it shielded, so a cancelled
        caller (a fetch that timed out) cancels neither the request nor the other callers.
        """
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(make())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._forget_inflight(key, t))
        return await asyncio.shield(task)

    def _forget_inflight(self, key: tuple[int, ...], task: asyncio.Future[Any]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # seen: every caller may have gone

    async def index(self, object_id: int, object_size: int) -> list[DataBlockIndex]:
        cached = self._indexes.get(object_id)
        if cached is not None:
            self._indexes.move_to_end(object_id)
            return cached
        index = await self._once((object_id,), lambda: self._load_index(object_id, object_size))
        if object_id not in self._indexes:
            self._indexes[object_id] = index
            self._index_entries += len(index)
        while self._index_entries > self._index_cache_entries and len(self._indexes) > 1:
            self._index_entries -= len(self._indexes.popitem(last=False)[1])
        return index

    async def load_whole(self, object_id: int, object_size: int) -> None:
        """Read a (small) object with one GET: its index and every block (into the block
        cache, as read-ahead), for many reads of its streams about to follow (a broker taking
        over many partitions replays each one's MetaStream from the same objects)."""
        if object_id in self._indexes:
            index = await self.index(object_id, object_size)
            for run in merge_runs(index, max(self.max_get_bytes, object_size)):
                self.prefetch(object_id, run)
            return
        index = await self._once(
            (object_id,), lambda: self._load_index(object_id, object_size, object_size)
        )
        if object_id not in self._indexes:
            self._indexes[object_id] = index
            self._index_entries += len(index)

    async def _load_index(
        self, object_id: int, object_size: int, tail_read: int = TAIL_READ
    ) -> list[DataBlockIndex]:
        key = self.key(object_id)
        if object_size < object_format.FOOTER_SIZE:
            raise CorruptObjectError(f"object {key}: size {object_size} is below the footer size")
        tail_start = max(0, object_size - tail_read)
        tail = await self.store.get(key, tail_start, object_size)
        if len(tail) != object_size - tail_start:
            raise CorruptObjectError(
                f"object {key} is truncated: expected {object_size} bytes, "
                f"read ends at {tail_start + len(tail)}"
            )
        try:
            footer = object_format.decode_footer(tail[-object_format.FOOTER_SIZE :], object_size)
        except CorruptObjectError as e:
            raise CorruptObjectError(f"object {key}: {e}") from e
        pos, length = footer.index_start_position, footer.index_block_length
        if pos >= tail_start:
            raw: bytes | memoryview = memoryview(tail)[pos - tail_start : pos - tail_start + length]
        else:
            raw = await self.store.get(key, pos, pos + length)
        index = object_format.decode_index(raw)
        for entry in index:
            if entry.start_position < 0 or entry.end_position > pos:
                raise CorruptObjectError(
                    f"object {key}: index entry {entry} points outside the data"
                )
        if tail_start == 0 and index:
            # the tail read was the whole (small) object: its blocks need no GET of their own
            whole = tail_read > TAIL_READ  # read whole for the reads to follow: read-ahead
            buffer = SharedBuffer(len(tail))
            view = memoryview(tail)
            for entry in index:
                block = view[entry.start_position : entry.end_position]
                try:
                    object_format.check_block(block, entry)
                except CorruptObjectError as e:
                    raise CorruptObjectError(f"object {key}: {e}") from e
                self.block_cache.put(
                    object_id, entry.start_position, block, unread=whole, buffer=buffer
                )
        return index

    async def read(
        self,
        object_id: int,
        object_size: int,
        stream_id: int,
        start: int,
        end: int,
        max_bytes: int,
    ) -> list[StreamRecordBatch]:
        """Batches of ``stream_id`` in this object from the one holding ``start`` on, up to
        ``end`` (exclusive, -1 = no bound) and about ``max_bytes`` (at least one batch)."""
        index = await self.index(object_id, object_size)
        blocks = object_format.find_blocks(index, stream_id, start, end)
        wanted: list[DataBlockIndex] = []
        budget = max_bytes
        for b in blocks:
            if wanted and budget <= 0:
                break
            wanted.append(b)
            budget -= b.size
        loaded = await self.load_blocks(object_id, wanted)
        out: list[StreamRecordBatch] = []
        size = 0
        for b in wanted:
            if out and size >= max_bytes:
                break
            got = object_format.block_batches(
                loaded[b.start_position], start, end, max_bytes - size
            )
            out.extend(got)
            size += sum(x.size for x in got)
            if got and end >= 0 and got[-1].last_offset >= end:
                break
        return out

    async def load_blocks(
        self, object_id: int, blocks: list[DataBlockIndex], *, unread: bool = False
    ) -> dict[int, Block]:
        """The bytes of each block (by start position), from the block cache or object storage.

        Blocks missing from the cache are read with one ranged GET per run of adjacent blocks
        (at most ``max_get_bytes``); a block another caller is already reading is waited for, not
        read again. ``unread`` puts the blocks in the cache as read-ahead (see BlockCache).
        """
        out: dict[int, Block] = {}
        waits: list[tuple[int, asyncio.Future[Block]]] = []
        missing: list[DataBlockIndex] = []
        for b in blocks:
            data = self.block_cache.get(object_id, b.start_position)
            if data is not None:
                out[b.start_position] = data
                continue
            loading = self._loading.get((object_id, b.start_position))
            if loading is not None:
                waits.append((b.start_position, loading))
            else:
                missing.append(b)
        for run in merge_runs(missing, self.max_get_bytes):
            futures = self._start_run(object_id, run, unread)
            waits.extend((b.start_position, f) for b, f in zip(run, futures, strict=True))
        if waits:
            self.waited += 1
            for position, future in waits:
                out[position] = await asyncio.shield(future)
        return out

    def prefetch(self, object_id: int, blocks: list[DataBlockIndex]) -> None:
        """Start loading the blocks that are neither cached nor being read, as unread read-ahead;
        do not wait for them."""
        missing = [
            b
            for b in blocks
            if (object_id, b.start_position) not in self.block_cache
            and (object_id, b.start_position) not in self._loading
        ]
        for run in merge_runs(missing, self.max_get_bytes):
            self._start_run(object_id, run, True)

    def has_block(self, object_id: int, position: int) -> bool:
        """Whether the block is in the cache or being read."""
        key = (object_id, position)
        return key in self.block_cache or key in self._loading

    def _start_run(
        self, object_id: int, run: list[DataBlockIndex], unread: bool
    ) -> list[asyncio.Future[Block]]:
        """Start the GET of a run of adjacent blocks as its own task (a cancelled caller cancels
        neither it nor other callers); one future per block, done when the GET is."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Block]] = []
        for b in run:
            future: asyncio.Future[Block] = loop.create_future()
            future.add_done_callback(_retrieve)
            self._loading[(object_id, b.start_position)] = future
            futures.append(future)
        task = asyncio.ensure_future(self._read_run(object_id, run, unread))
        self._runs.add(task)
        size = run[-1].end_position - run[0].start_position if unread else 0
        self.prefetching += size

        def finish(task: asyncio.Future[dict[int, Block]]) -> None:
            self._runs.discard(task)
            self.prefetching -= size
            for b, future in zip(run, futures, strict=True):
                if self._loading.get((object_id, b.start_position)) is future:
                    del self._loading[(object_id, b.start_position)]
                if future.done():
                    continue
                if task.cancelled():
                    future.cancel()
                elif (error := task.exception()) is not None:
                    future.set_exception(error)
                else:
                    future.set_result(task.result()[b.start_position])

        task.add_done_callback(finish)
        return futures

    async def _read_run(
        self, object_id: int, run: list[DataBlockIndex], unread: bool
    ) -> dict[int, Block]:
        first, last = run[0].start_position, run[-1].end_position
        key = self.key(object_id)
        data = await self.store.get_view(key, first, last)
        if len(data) != last - first:
            raise CorruptObjectError(
                f"object {key} is truncated: blocks {first}-{last} returned {len(data)} bytes"
            )
        view = memoryview(data)
        buffer = SharedBuffer(len(data))  # the blocks are views of it, not copies
        out: dict[int, Block] = {}
        for b in run:
            rel = b.start_position - first
            block = view[rel : rel + b.size]
            try:
                object_format.check_block(block, b)
            except CorruptObjectError as e:
                raise CorruptObjectError(f"object {key}: {e}") from e
            out[b.start_position] = block
        for b in run:
            self.block_cache.put(
                object_id, b.start_position, out[b.start_position], unread=unread, buffer=buffer
            )
        return out

    async def close(self) -> None:
        """Cancel the GETs in flight (their waiters see them cancelled)."""
        runs = list(self._runs)
        for task in runs:
            task.cancel()
        for task in runs:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def forget(self, object_id: int) -> None:
        self._index_entries -= len(self._indexes.pop(object_id, []))

    def forget_all(self) -> None:
        self._indexes.clear()
        self._index_entries = 0


def merge_runs(blocks: list[DataBlockIndex], max_bytes: int) -> list[list[DataBlockIndex]]:
    """Group blocks of one object into runs of adjacent blocks, each one ranged GET of at most
    ``max_bytes`` (a single larger block is a run of its own)."""
    runs: list[list[DataBlockIndex]] = []
    for b in sorted(blocks, key=lambda b: b.start_position):
        last = runs[-1] if runs else None
        if (
            last is not None
            and last[-1].end_position == b.start_position
            and b.end_position - last[0].start_position <= max_bytes
        ):
            last.append(b)
        else:
            runs.append([b])
    return runs


def _retrieve(future: asyncio.Future[Block]) -> None:
    """Mark a future's exception as seen: every caller waiting on it may have gone."""
    if not future.cancelled():
        future.exception()
