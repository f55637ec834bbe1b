"""ObjectReader: the cold read path over objects in object storage.

The footer and index of an object are fetched once (one ranged GET of the object's tail, a
second only when the index is larger than the tail) and kept in a bounded cache. A read binary-
searches the index for the blocks holding the wanted offsets and issues one ranged GET per run
of adjacent blocks that are not in the block cache. Sequential readers get read-ahead: the GET
is stretched over the stream's following blocks, which land in the block cache.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from storage import object_format
from storage.block_cache import BlockCache
from storage.object_format import CorruptObjectError, DataBlockIndex
from storage.operator.base import ObjectStore
from storage.stream_record_batch import StreamRecordBatch

TAIL_READ = 64 * 1024

T = TypeVar("T")


class ObjectReader:
    def __init__(
        self,
        store: ObjectStore,
        namespace: str,
        block_cache: BlockCache,
        *,
        index_cache_entries: int = 1 << 20,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.block_cache = block_cache
        self._indexes: OrderedDict[int, list[DataBlockIndex]] = OrderedDict()
        self._index_cache_entries = index_cache_entries  # index entries, summed over objects
        self._index_entries = 0
        self._inflight: dict[tuple[int, ...], asyncio.Future[Any]] = {}

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

    async def _load_index(self, object_id: int, object_size: int) -> list[DataBlockIndex]:
        key = self.key(object_id)
        if object_size < object_format.FOOTER_SIZE:
            raise CorruptObjectError(f"object {key}: size {object_size} is below the footer size")
        tail_start = max(0, object_size - TAIL_READ)
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
        return index

    async def read(
        self,
        object_id: int,
        object_size: int,
        stream_id: int,
        start: int,
        end: int,
        max_bytes: int,
        readahead: int = 0,
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
        ahead: list[DataBlockIndex] = []
        extra = readahead
        for b in blocks[len(wanted) :]:
            if extra <= 0:
                break
            ahead.append(b)
            extra -= b.size
        decoded = await self.read_blocks(object_id, wanted, ahead)
        out: list[StreamRecordBatch] = []
        size = 0
        for batches in decoded:
            for batch in batches:
                if batch.last_offset <= start:
                    continue
                if (end >= 0 and batch.base_offset >= end) or (out and size >= max_bytes):
                    return out
                out.append(batch)
                size += batch.size
        return out

    async def read_blocks(
        self,
        object_id: int,
        blocks: list[DataBlockIndex],
        readahead: list[DataBlockIndex] | None = None,
    ) -> list[list[StreamRecordBatch]]:
        """Decoded batches of each block in ``blocks``; ``readahead`` blocks only fill the cache."""
        results: dict[int, list[StreamRecordBatch]] = {}
        missing: list[DataBlockIndex] = []
        for b in blocks:
            hit = self.block_cache.get(object_id, b.start_position)
            if hit is None:
                missing.append(b)
            else:
                results[b.start_position] = hit
        if missing:
            fetch = missing + [
                b
                for b in readahead or []
                if self.block_cache.get(object_id, b.start_position) is None
            ]
            runs = _adjacent_runs(fetch)
            loaded = await asyncio.gather(*(self._read_run(object_id, run) for run in runs))
            for run_result in loaded:
                results.update(run_result)
        return [results[b.start_position] for b in blocks]

    async def _read_run(
        self, object_id: int, run: list[DataBlockIndex]
    ) -> dict[int, list[StreamRecordBatch]]:
        first, last = run[0].start_position, run[-1].end_position
        key = self.key(object_id)

        async def get() -> bytes:
            data = await self.store.get(key, first, last)
            if len(data) != last - first:
                raise CorruptObjectError(
                    f"object {key} is truncated: blocks {first}-{last} returned {len(data)} bytes"
                )
            return data

        data = await self._once((object_id, first, last), get)
        out: dict[int, list[StreamRecordBatch]] = {}
        view = memoryview(data)
        for b in run:
            rel = b.start_position - first
            try:
                batches, pos = object_format.decode_block(view[rel : rel + b.size])
            except CorruptObjectError as e:
                raise CorruptObjectError(f"object {key}: {e}") from e
            if pos != b.size or (batches and batches[0].stream_id != b.stream_id):
                raise CorruptObjectError(
                    f"object {key}: block at {b.start_position} mismatches index"
                )
            self.block_cache.put(object_id, b.start_position, b.size, batches)
            out[b.start_position] = batches
        return out

    def forget(self, object_id: int) -> None:
        self._index_entries -= len(self._indexes.pop(object_id, []))

    def forget_all(self) -> None:
        self._indexes.clear()
        self._index_entries = 0


def _adjacent_runs(blocks: list[DataBlockIndex]) -> list[list[DataBlockIndex]]:
    runs: list[list[DataBlockIndex]] = []
    for b in sorted(blocks, key=lambda b: b.start_position):
        if runs and runs[-1][-1].end_position == b.start_position:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs
