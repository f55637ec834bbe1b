"""The Stream API (AutoMQ's ``Stream``/``StreamClient``): create, open with an epoch, append,
fetch, trim, close.

A stream offset counts records: appending a Kafka record batch of ``n`` records advances the
stream by ``n``. Opening a stream with a newer epoch fences any previous owner: its appends
fail with :class:`StreamFencedError` and its uploads of the stream are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from storage.errors import (
    OffsetOutOfRangeError,
    StorageFailedError,
    StreamClosedError,
    StreamFencedError,
)
from storage.metadata.model import ErrorCode, MetadataError, StreamMetadata, StreamState
from storage.s3_storage import S3Storage
from storage.stream_record_batch import StreamRecordBatch


@dataclass(slots=True, frozen=True)
class FetchResult:
    batches: list[StreamRecordBatch]
    start_offset: int  # the stream's start offset when fetched
    confirmed_offset: int  # the stream's readable end when fetched


class S3Stream:
    def __init__(
        self, storage: S3Storage, stream_id: int, epoch: int, start_offset: int, next_offset: int
    ) -> None:
        self.storage = storage
        self.stream_id = stream_id
        self.epoch = epoch
        self.start_offset = start_offset
        self.next_offset = next_offset
        self.closed = False
        # a close that failed partway: the next close tries again (one still in progress is not
        # joined by another)
        self.close_failed = False
        storage.register_stream(stream_id, epoch, next_offset, self._append_failed)

    @property
    def confirmed_offset(self) -> int:
        """Offsets below this are durable and readable."""
        return self.storage.confirmed_offset(self.stream_id)

    def _check_writable(self) -> None:
        if self.storage.failed is not None:  # what closed the stream, if a write failed
            raise StorageFailedError(
                f"stream {self.stream_id}: storage failed: {self.storage.failed}"
            )
        if self.closed:
            raise StreamClosedError(f"stream {self.stream_id} is closed")
        self._check_not_fenced()

    def _check_not_fenced(self) -> None:
        meta = self.storage.metadata.stream(self.stream_id)
        if meta is None or meta.epoch > self.epoch:
            self.closed = True
            raise StreamFencedError(
                f"stream {self.stream_id}: epoch {self.epoch} is fenced by "
                f"{'deletion' if meta is None else f'epoch {meta.epoch}'}"
            )

    async def append(self, payload: bytes | memoryview, count: int) -> int:
        """Append one batch covering ``count`` offsets; return its base offset once durable."""
        base, durable = await self.start_append(payload, count)
        # the caller may be cancelled; the write, whose offset is taken, goes on
        await asyncio.shield(durable)
        return base

    async def start_append(
        self,
        payload: bytes | memoryview,
        count: int,
        *,
        room_timeout: float | None = None,
        backpressure: bool = True,
        on_done: Callable[[], object] | None = None,
    ) -> tuple[int, asyncio.Future[None]]:
        """Take the batch's offsets and start its WAL write; return its base offset and the
        future of its durability (done once it and every earlier offset are durable; a
        waiter that cancels it gives up waiting, the write goes on). What is started next on
        this loop (another stream's batch, a time-index entry) joins the same WAL group
        commit when it can.

        Before taking offsets it waits for room in the WAL cache (``TimeoutError`` after
        ``room_timeout`` seconds, nothing taken); a small record that must follow another
        (a time-index entry) passes ``backpressure=False`` and never waits. ``on_done()``: as
        :meth:`S3Storage.submit` calls it, once the append is settled (durable or failed)."""
        if backpressure:
            await self.wait_for_room(room_timeout)
        return self.append_now(payload, count, on_done)

    async def wait_for_room(self, timeout: float | None = None) -> None:
        """Wait until the WAL cache has room for an append (:meth:`S3Storage.wait_for_room`),
        failing first if this stream cannot take one."""
        if not self.storage.has_room():
            self._check_writable()
            await self.storage.wait_for_room(timeout)

    def append_now(
        self,
        payload: bytes | memoryview,
        count: int,
        on_done: Callable[[], object] | None = None,
    ) -> tuple[int, asyncio.Future[None]]:
        """:meth:`start_append` without waiting for room in the WAL cache: for a caller that
        has just seen there is some (:meth:`S3Storage.has_room`), or a small record that must
        follow another (a time-index entry). Nothing yields from the offsets taken to the WAL
        write."""
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        self._check_writable()
        base = self.next_offset
        self.next_offset += count
        batch = StreamRecordBatch(self.stream_id, self.epoch, base, count, payload)
        try:
            done = self.storage.submit(batch, on_done)
        except BaseException:
            self.closed = True  # offsets after a failed append can no longer be trusted
            raise
        return base, done

    def _append_failed(self) -> None:
        self.closed = True  # offsets after a failed append can no longer be trusted

    async def fetch(self, start: int, end: int = -1, max_bytes: int = 1 << 20) -> FetchResult:
        """Batches from the one holding ``start`` towards ``end`` (-1: the confirmed end), about
        ``max_bytes`` but at least one batch when any is available."""
        confirmed = self.confirmed_offset
        stop = self._read_end(start, end, confirmed)
        batches = (
            [] if start >= stop else await self.storage.read(self.stream_id, start, stop, max_bytes)
        )
        return FetchResult(batches, self.start_offset, confirmed)

    async def read_whole(
        self, start: int, end: int, max_bytes: int, min_one: bool
    ) -> tuple[list[memoryview], int]:
        """The payloads of the batches from the one holding ``start``, whole, none starting at
        or after ``end`` (-1: the confirmed end), while their bytes stay within ``max_bytes``
        (the first however large when ``min_one``), and the offset after the last (``start``
        if none): a consumer's fetch (``S3Storage.read_whole``)."""
        stop = self._read_end(start, end, self.confirmed_offset)
        if start >= stop:
            return [], start
        return await self.storage.read_whole(self.stream_id, start, stop, max_bytes, min_one)

    def read_whole_cached(
        self, start: int, end: int, max_bytes: int, min_one: bool, out: list[memoryview]
    ) -> tuple[int, int] | None:
        """:meth:`read_whole` at once, when the LogCache holds ``start``, its payloads appended
        to ``out``: the bytes appended and the offset after the last; None, appending nothing,
        when the read would go to object storage."""
        stop = self._read_end(start, end, self.confirmed_offset)
        if start >= stop:
            return 0, start
        return self.storage.cache.read_whole(self.stream_id, start, stop, max_bytes, min_one, out)

    def _read_end(self, start: int, end: int, confirmed: int) -> int:
        """Where a read from ``start`` towards ``end`` (-1: the confirmed end) stops; raises
        OffsetOutOfRangeError when ``start`` is outside the stream."""
        self._check_not_fenced()  # a fenced owner's cache may hold offsets the new owner reused
        if start < self.start_offset or start > confirmed:
            raise OffsetOutOfRangeError(
                f"stream {self.stream_id}: offset {start} outside [{self.start_offset}, "
                f"{confirmed}]"
            )
        return confirmed if end < 0 else min(end, confirmed)

    async def trim(self, new_start_offset: int) -> None:
        """Discard offsets below ``new_start_offset``; their objects are freed once unused."""
        if new_start_offset <= self.start_offset:
            return
        if new_start_offset > self.confirmed_offset:
            raise OffsetOutOfRangeError(
                f"stream {self.stream_id}: cannot trim to {new_start_offset} past the end "
                f"{self.confirmed_offset}"
            )
        meta = self.storage.metadata.stream(self.stream_id)
        if meta is not None and new_start_offset > meta.end_offset:
            await self.storage.upload_streams([self.stream_id])
        await _fenced_as_error(
            self.storage.metadata.trim_stream(
                self.storage.node_id,
                self.storage.node_epoch,
                self.stream_id,
                self.epoch,
                new_start_offset,
            )
        )
        self.start_offset = new_start_offset

    async def close(self) -> None:
        """Upload this stream's cached data and close it in the metadata (again, after a
        close that failed partway)."""
        await close_streams(self.storage, [self])


async def close_streams(storage: S3Storage, streams: Sequence[S3Stream]) -> None:
    """Close many streams as one: their cached data uploaded together (and nothing else the
    cache holds), then one metadata change closing them all (a broker handing many partitions
    over, or stopping). Streams already closed, or closing, are left out, but for those whose
    close failed: this one tries again."""
    open_streams = [s for s in streams if not s.closed or s.close_failed]
    if not open_streams:
        return
    for stream in open_streams:
        stream.closed = True
        stream.close_failed = False
    try:
        await asyncio.gather(*(storage.drain(s.stream_id) for s in open_streams))
        await storage.upload_streams([s.stream_id for s in open_streams])
        await _fenced_as_error(
            storage.metadata.close_streams(
                storage.node_id, storage.node_epoch, [(s.stream_id, s.epoch) for s in open_streams]
            )
        )
    except BaseException:
        for stream in open_streams:
            stream.close_failed = True
        raise
    for stream in open_streams:
        storage.unregister_stream(stream.stream_id, stream.epoch)


async def _fenced_as_error(op: Awaitable[None]) -> None:
    try:
        await op
    except MetadataError as e:
        if e.code is ErrorCode.STREAM_FENCED:
            raise StreamFencedError(str(e)) from e
        raise


class StreamClient:
    """Creates and opens streams on one node's S3Storage."""

    def __init__(self, storage: S3Storage) -> None:
        self.storage = storage

    async def create_and_open(self, epoch: int = 0) -> S3Stream:
        return (await self.create_and_open_many(1, epoch))[0]

    async def create_and_open_many(self, count: int, epoch: int = 0) -> list[S3Stream]:
        """``count`` new streams, open here at ``epoch``: one metadata transaction."""
        s = self.storage
        metas = await self._created(
            s.metadata.create_open_streams(s.node_id, s.node_epoch, epoch, count), epoch
        )
        return [S3Stream(s, m.stream_id, epoch, m.start_offset, m.end_offset) for m in metas]

    async def create_and_open_named(
        self, key: str, value_of: Callable[[int], bytes], epoch: int = 0
    ) -> S3Stream | None:
        """A new stream, open here at ``epoch``, that KV ``key`` names (``value_of(id)``), in one
        metadata transaction; None when ``key`` already names one (nothing created)."""
        s = self.storage

        async def create() -> list[StreamMetadata]:
            meta = await s.metadata.create_named_stream(
                s.node_id, s.node_epoch, epoch, key, value_of
            )
            return [] if meta is None else [meta]

        created = await self._created(create(), epoch)
        if not created:
            return None
        meta = created[0]
        return S3Stream(s, meta.stream_id, epoch, meta.start_offset, meta.end_offset)

    async def _created(
        self, create: Awaitable[list[StreamMetadata]], epoch: int
    ) -> list[StreamMetadata]:
        """What ``create`` created and opened. A caller cancelled meanwhile leaves no stream
        open behind it: the creation goes on to its end, and what it opened is closed again
        (no other opener can hold a stream just created). Left open, a partition's stream
        would keep the broker taking the partition over waiting for this one to close it."""
        creation = asyncio.ensure_future(create)
        try:
            return await asyncio.shield(creation)
        except asyncio.CancelledError:
            s = self.storage
            with contextlib.suppress(BaseException):
                metas = await asyncio.shield(creation)
                if metas:
                    await s.metadata.close_streams(
                        s.node_id, s.node_epoch, [(m.stream_id, epoch) for m in metas]
                    )
            raise

    async def open(self, stream_id: int, epoch: int) -> S3Stream:
        """Open ``stream_id`` at ``epoch``; a newer epoch than the current one fences the owner."""
        s = self.storage
        if s.is_open_here(stream_id):
            # a hand-off on this node: what the old epoch acknowledged goes first
            await s.drain(stream_id)
            await s.upload_streams([stream_id])
        try:
            meta = await s.metadata.open_stream(s.node_id, s.node_epoch, stream_id, epoch)
        except MetadataError as e:
            if e.code is ErrorCode.STREAM_FENCED:
                raise StreamFencedError(str(e)) from e
            raise
        return S3Stream(s, stream_id, epoch, meta.start_offset, meta.end_offset)

    async def destroy(self, stream_id: int, epoch: int) -> None:
        """Delete ``stream_id`` for good (its topic was deleted): a stream still open (by an
        owner that crashed, another node, or here) is first taken over at ``epoch`` or one past
        its own, whichever is newer, and closed, without uploading what this node cached of it;
        the metadata then frees its objects for the GC job. A stream already gone is fine
        (retries are safe)."""
        s = self.storage
        meta = s.metadata.stream(stream_id)
        if meta is None:
            return
        if s.is_open_here(stream_id):
            await s.drain(stream_id)
        s.drop_stream(stream_id)
        # (at its own epoch, another node's range would refuse it)
        epoch = max(epoch, meta.epoch + 1)
        if meta.state is not StreamState.CLOSED:
            await s.metadata.open_stream(s.node_id, s.node_epoch, stream_id, epoch)
            await s.metadata.close_stream(s.node_id, s.node_epoch, stream_id, epoch)
        else:
            epoch = meta.epoch
        await s.metadata.delete_stream(s.node_id, s.node_epoch, stream_id, epoch)
