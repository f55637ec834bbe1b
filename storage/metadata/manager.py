"""MetadataManager: the controller the storage layer calls for stream, object, node and KV state.

Every change goes the same way: check the request against the image and make its records
(``control``, pure), persist the records in one transaction (``store``), then apply them to
the image. Changes run one at a time under a lock, so each is checked against the state the
previous one left. Reads are synchronous and come from the image.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from storage.metadata import control
from storage.metadata.image import MetadataImage
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    S3Object,
    S3ObjectMetadata,
    StreamMetadata,
)
from storage.metadata.records import Record
from storage.metadata.store import MetadataStore, open_store

Clock = Callable[[], int]


class WallClock:
    """Wall-clock milliseconds that never go backwards, even if the system clock does."""

    def __init__(self) -> None:
        self._last = 0

    def __call__(self) -> int:
        self._last = max(self._last, time.time_ns() // 1_000_000)
        return self._last


class MetadataManager:
    """The metadata controller: an image for reads over a durable store for changes."""

    def __init__(self, store: MetadataStore, image: MetadataImage, clock: Clock) -> None:
        self._store = store
        self.image = image
        self._clock = clock
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, clock: Clock | None = None) -> MetadataManager:
        """Open the store at ``url`` (``sqlite:///abs/path.db``, ``sqlite://:memory:``)."""
        return await cls.from_store(await open_store(url), clock)

    @classmethod
    async def from_store(cls, store: MetadataStore, clock: Clock | None = None) -> MetadataManager:
        """Serve the metadata held by an already opened store."""
        return cls(store, await store.load(), clock if clock is not None else WallClock())

    async def close(self) -> None:
        """Close the store once the change in progress, if any, is done."""
        async with self._lock:
            await self._store.close()

    async def _commit(self, records: Sequence[Record]) -> None:
        """Persist, then apply: the image only ever shows committed state."""
        if not records:
            return
        await self._store.persist(records)
        try:
            self.image.apply(records)
        except BaseException:
            # The store has the change but the image is half-changed: start over from the store.
            self.image = await self._store.load()
            raise

    # -- nodes -----------------------------------------------------------------------------------

    async def register_node(self, node_id: int) -> int:
        """Register a (re)starting node; return its new epoch (1 for a new node, else +1)."""
        async with self._lock:
            records, epoch = control.register_node(self.image, node_id)
            await self._commit(records)
            return epoch

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(self, node_id: int, node_epoch: int) -> int:
        """Create a stream (CLOSED, epoch -1, offsets 0) and return its id."""
        async with self._lock:
            records, stream_id = control.create_stream(self.image, node_id, node_epoch)
            await self._commit(records)
            return stream_id

    async def create_open_streams(
        self, node_id: int, node_epoch: int, epoch: int, count: int = 1
    ) -> list[StreamMetadata]:
        """Create ``count`` streams and open them at ``epoch``, in one transaction."""
        async with self._lock:
            records, ids = control.create_open_streams(
                self.image, node_id, node_epoch, epoch, count
            )
            await self._commit(records)
            return [self.image.streams[i] for i in ids]

    async def open_stream(
        self, node_id: int, node_epoch: int, stream_id: int, epoch: int
    ) -> StreamMetadata:
        """Open a stream at ``epoch`` on ``node_id`` (a newer epoch fences the previous owner)."""
        async with self._lock:
            await self._commit(
                control.open_stream(self.image, node_id, node_epoch, stream_id, epoch)
            )
            return self.image.streams[stream_id]

    async def close_stream(self, node_id: int, node_epoch: int, stream_id: int, epoch: int) -> None:
        """Close a stream this node owns at ``epoch``; closing a closed stream is a no-op."""
        async with self._lock:
            await self._commit(
                control.close_stream(self.image, node_id, node_epoch, stream_id, epoch)
            )

    async def trim_stream(
        self, node_id: int, node_epoch: int, stream_id: int, epoch: int, new_start_offset: int
    ) -> None:
        """Raise the start offset; objects wholly below it are freed (MARK_DESTROYED)."""
        async with self._lock:
            await self._commit(
                control.trim_stream(
                    self.image,
                    node_id,
                    node_epoch,
                    stream_id,
                    epoch,
                    new_start_offset,
                    self._clock(),
                )
            )

    async def delete_stream(
        self, node_id: int, node_epoch: int, stream_id: int, epoch: int
    ) -> None:
        """Delete a closed stream; its Stream Objects are freed and it leaves every SSO."""
        async with self._lock:
            await self._commit(
                control.delete_stream(
                    self.image, node_id, node_epoch, stream_id, epoch, self._clock()
                )
            )

    # -- objects ---------------------------------------------------------------------------------

    async def prepare_object(self, count: int, ttl_ms: int) -> int:
        """Reserve ``count`` consecutive object ids (PREPARED for ``ttl_ms``); return the first."""
        async with self._lock:
            records, first = control.prepare_object(self.image, count, ttl_ms, self._clock())
            await self._commit(records)
            return first

    async def commit_stream_set_object(
        self,
        node_id: int,
        node_epoch: int,
        object_id: int,
        order_id: int,
        object_size: int,
        stream_ranges: Sequence[CommitRange],
        stream_objects: Sequence[CommitStreamObject],
        compacted_object_ids: Sequence[int] = (),
    ) -> None:
        """Commit an upload, or with ``compacted_object_ids`` a compaction of this node's SSOs.

        ``object_id`` -1 commits Stream Objects only. See ``control.commit_stream_set_object``
        for the checks; committing the same objects again succeeds and changes nothing.
        """
        async with self._lock:
            await self._commit(
                control.commit_stream_set_object(
                    self.image,
                    node_id,
                    node_epoch,
                    object_id,
                    order_id,
                    object_size,
                    stream_ranges,
                    stream_objects,
                    compacted_object_ids,
                    self._clock(),
                )
            )

    async def commit_stream_object(
        self,
        object_id: int,
        stream_id: int,
        stream_epoch: int,
        start_offset: int,
        end_offset: int,
        object_size: int,
        source_object_ids: Sequence[int],
    ) -> None:
        """Replace Stream Objects of a stream by one merged object (the sources are freed)."""
        async with self._lock:
            await self._commit(
                control.commit_stream_object(
                    self.image,
                    object_id,
                    stream_id,
                    stream_epoch,
                    start_offset,
                    end_offset,
                    object_size,
                    source_object_ids,
                    self._clock(),
                )
            )

    async def mark_destroyed_done(self, object_ids: Sequence[int]) -> None:
        """Forget these MARK_DESTROYED objects: they are deleted from object storage."""
        async with self._lock:
            await self._commit(control.mark_destroyed_done(self.image, object_ids))

    async def expire_prepared(self, now_ms: int | None = None) -> list[int]:
        """Mark PREPARED objects past their deadline MARK_DESTROYED; return their ids."""
        async with self._lock:
            now = self._clock() if now_ms is None else now_ms
            records, expired = control.expire_prepared(self.image, now)
            await self._commit(records)
            return expired

    # -- reads -----------------------------------------------------------------------------------

    def get_objects(
        self, stream_id: int, start_offset: int, end_offset: int, limit: int
    ) -> list[S3ObjectMetadata]:
        """The objects holding ``[start_offset, end_offset)`` in offset order (seed 001).

        ``end_offset`` -1 means the stream's end; the answer may stop early (``limit``, or
        no object holds the next offset).
        """
        return self.image.get_objects(stream_id, start_offset, end_offset, limit)

    def stream(self, stream_id: int) -> StreamMetadata | None:
        """The stream's metadata, or None if it does not exist (or was deleted)."""
        return self.image.stream(stream_id)

    def objects_to_delete(self, marked_by_ms: int) -> list[S3Object]:
        """MARK_DESTROYED objects marked at or before ``marked_by_ms``: safe to delete."""
        return self.image.objects_to_delete(marked_by_ms)

    def streams_opened_by(self, node_id: int) -> list[StreamMetadata]:
        """The streams ``node_id`` has open (it must close or recover them on restart)."""
        return self.image.streams_opened_by(node_id)

    # -- kv --------------------------------------------------------------------------------------

    async def put_kv(self, key: str, value: bytes) -> None:
        """Set ``key`` to ``value`` (e.g. a partition's MetaStream id)."""
        async with self._lock:
            await self._commit(control.put_kv(key, value))

    def get_kv(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        return self.image.kv.get(key)

    def kv_keys(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, sorted."""
        return sorted(k for k in self.image.kv if k.startswith(prefix))

    async def delete_kv(self, key: str) -> None:
        """Drop ``key`` (no error if it is not set)."""
        async with self._lock:
            await self._commit(control.delete_kv(self.image, key))
