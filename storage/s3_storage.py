"""S3Storage: the write path (WAL + LogCache + upload) and the read path (cache, then objects).

Write: a StreamRecordBatch goes to the WAL; once fsynced it enters the LogCache and the append
is acknowledged. When the cache's active block passes ``s3.wal.upload.threshold`` (or
``s3.wal.upload.interval.ms`` passes) it is sealed and uploaded as one Stream Set Object plus a
Stream Object per large stream, committed to the metadata in one operation, and the WAL is
trimmed behind it. Uploads run one at a time, in order, retrying until they succeed.

Start: everything in the WAL after its trim point is replayed and uploaded before the storage
serves, so a crash loses nothing that was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from storage import stream_record_batch
from storage.block_cache import BlockCache
from storage.config import S3StreamConfig
from storage.errors import StreamClosedError
from storage.log_cache import LogCache, LogCacheBlock
from storage.metadata.manager import MetadataManager
from storage.metadata.model import CommitRange, CommitStreamObject, ErrorCode, MetadataError
from storage.object_format import object_key
from storage.object_reader import ObjectReader
from storage.object_writer import BuiltObject
from storage.operator import open_object_store
from storage.operator.base import ObjectStore
from storage.stream_record_batch import StreamRecordBatch
from storage.upload import build_object, plan_upload
from storage.wal import FileWAL

log = logging.getLogger("automq.storage")

WAL_FILE = "wal.log"
UPLOADS_IN_FLIGHT = 2  # blocks being written to object storage at once (commits stay ordered)


@dataclass(slots=True, frozen=True)
class _Staged:
    """Objects written for one block, ready to commit."""

    sso_id: int
    sso_size: int
    ranges: list[CommitRange]
    stream_objects: list[CommitStreamObject]


@dataclass(slots=True)
class _StreamState:
    """What the write path tracks per open stream on this node."""

    confirmed: int  # every offset below is durable and readable
    pending: dict[int, tuple[StreamRecordBatch, int, int]]  # acked out of order, by base offset


class S3Storage:
    """One node's stream store. Build it with :meth:`start`."""

    def __init__(
        self,
        config: S3StreamConfig,
        wal: FileWAL,
        metadata: MetadataManager,
        store: ObjectStore,
        node_epoch: int,
        *,
        owns_metadata: bool,
        owns_store: bool,
    ) -> None:
        self.config = config
        self.wal = wal
        self.metadata = metadata
        self.store = store
        self.node_id = config.node_id
        self.node_epoch = node_epoch
        self.cache = LogCache(config.wal_cache_size)
        self.block_cache = BlockCache(config.block_cache_size)
        self.reader = ObjectReader(store, config.namespace, self.block_cache)
        self.uploads = 0
        self._owns_metadata = owns_metadata
        self._owns_store = owns_store
        self._streams: dict[int, _StreamState] = {}
        self._last_cold_read_end: dict[int, int] = {}
        self._upload_wanted = asyncio.Event()
        self._changed = asyncio.Condition()  # uploads finished / cache room freed
        self._force_upto = -1  # seal and upload every block up to this block id
        self._uploader: asyncio.Task[None] | None = None
        self._upload_tasks: dict[int, asyncio.Task[None]] = {}
        self._upload_slots = asyncio.Semaphore(UPLOADS_IN_FLIGHT)
        self._closing = False
        self._failed: BaseException | None = None

    # -- life cycle ------------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        config: S3StreamConfig,
        *,
        store: ObjectStore | None = None,
        metadata: MetadataManager | None = None,
    ) -> S3Storage:
        """Open the WAL, object store and metadata, recover the WAL, then start uploading."""
        owns_store = store is None
        if store is None:
            store = open_object_store(
                config.object_store_url,
                part_size=config.object_part_size,
                max_concurrency=config.max_concurrent_requests,
                retry_timeout_s=config.request_retry_timeout_ms / 1000,
            )
        owns_metadata = metadata is None
        if metadata is None:
            metadata = await MetadataManager.open(config.metadata_url)
        node_epoch = await metadata.register_node(config.node_id)
        os.makedirs(config.wal_path, exist_ok=True)
        wal = await FileWAL.open(
            os.path.join(config.wal_path, WAL_FILE), config.wal_capacity, node_id=config.node_id
        )
        storage = cls(
            config,
            wal,
            metadata,
            store,
            node_epoch,
            owns_metadata=owns_metadata,
            owns_store=owns_store,
        )
        await storage._recover()
        storage._uploader = asyncio.create_task(storage._upload_loop(), name="s3storage-upload")
        log.info(
            "S3Storage started: node %d epoch %d, WAL %s, objects %s",
            config.node_id,
            node_epoch,
            config.wal_path,
            config.object_store_url.split("?", 1)[0],
        )
        return storage

    async def close(self) -> None:
        """Upload everything still in the cache, trim the WAL, and release resources."""
        if self._closing:
            return
        if self._failed is None:
            with contextlib.suppress(StreamClosedError):
                await self.force_upload()
        await self._stop_uploads()
        await self.wal.close(clean=self._failed is None)
        if self._owns_store:
            await self.store.close()
        if self._owns_metadata:
            await self.metadata.close()

    async def _stop_uploads(self) -> None:
        self._closing = True
        tasks = [t for t in (self._uploader, *self._upload_tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def abort(self) -> None:
        """Stop at once without uploading, as a crash would: the WAL keeps the data for the
        next start's recovery."""
        await self._stop_uploads()
        await self.wal.close(clean=False)
        if self._owns_store:
            await self.store.close()
        if self._owns_metadata:
            await self.metadata.close()

    # -- recovery --------------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Replay the WAL past its trim point into the cache, upload it, then trim the WAL."""
        runs: dict[int, list[tuple[StreamRecordBatch, int, int]]] = {}
        replayed = 0
        for rec in self.wal.recover():
            batch, _ = stream_record_batch.decode(rec.body)
            batch = StreamRecordBatch(
                batch.stream_id, batch.epoch, batch.base_offset, batch.count, bytes(batch.payload)
            )
            runs.setdefault(batch.stream_id, []).append((batch, rec.offset, rec.next_offset))
            replayed += 1
        if not runs:
            return
        kept = 0
        for stream_id, entries in sorted(runs.items()):
            meta = self.metadata.stream(stream_id)
            if meta is None:
                log.warning("WAL recovery: stream %d no longer exists; dropping it", stream_id)
                continue
            expected = meta.end_offset
            for batch, wal_offset, wal_next in sorted(entries, key=lambda e: e[0].base_offset):
                if batch.last_offset <= expected:
                    continue  # uploaded before the crash
                if batch.base_offset != expected:
                    log.error(
                        "WAL recovery: stream %d has a gap at %d (record starts at %d); "
                        "dropping its records from there on",
                        stream_id,
                        expected,
                        batch.base_offset,
                    )
                    break
                self.cache.put(batch, wal_offset, wal_next)
                expected = batch.last_offset
                kept += 1
        log.info("WAL recovery: %d records replayed, %d to upload", replayed, kept)
        block = self.cache.seal()
        if block is not None:
            await self._upload_in_order(block, None, asyncio.get_running_loop().create_future())
        await self.wal.trim(self.wal.next_offset)

    # -- streams ---------------------------------------------------------------------------------

    def register_stream(self, stream_id: int, confirmed: int) -> None:
        """Track a stream opened on this node, whose next offset is ``confirmed``."""
        self._streams[stream_id] = _StreamState(confirmed, {})

    def is_open_here(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def unregister_stream(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)
        self._last_cold_read_end.pop(stream_id, None)

    def confirmed_offset(self, stream_id: int) -> int:
        state = self._streams.get(stream_id)
        if state is not None:
            return state.confirmed
        meta = self.metadata.stream(stream_id)
        return meta.end_offset if meta is not None else 0

    # -- write path ------------------------------------------------------------------------------

    async def append(self, batch: StreamRecordBatch) -> None:
        """Make ``batch`` durable in the WAL, then readable; returns once it is durable."""
        if self._failed is not None:
            raise StreamClosedError(f"storage failed: {self._failed}")
        if self.cache.unuploaded_size >= self.config.wal_cache_size:
            await self._wait_for_cache_room()
        header = stream_record_batch.encode_header(batch)
        try:
            result = await self.wal.append([header, batch.payload])
        except Exception as e:
            self._failed = e
            raise
        self._confirm(batch, result.offset, result.next_offset)

    async def _wait_for_cache_room(self) -> None:
        # Backpressure: data not yet in object storage is bounded by s3.wal.cache.size.
        self._upload_wanted.set()
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    self.cache.unuploaded_size < self.config.wal_cache_size
                    or self._failed is not None
                )
            )

    def _confirm(self, batch: StreamRecordBatch, wal_offset: int, wal_next: int) -> None:
        # WAL acks arrive in order, but put records into the cache strictly in offset order even
        # if they did not (a sequencer, as AutoMQ's callback sequencer).
        state = self._streams.get(batch.stream_id)
        if state is None:
            state = self._streams[batch.stream_id] = _StreamState(batch.base_offset, {})
        state.pending[batch.base_offset] = (batch, wal_offset, wal_next)
        while state.confirmed in state.pending:
            record, offset, next_offset = state.pending.pop(state.confirmed)
            self.cache.put(record, offset, next_offset)
            state.confirmed = record.last_offset
        if self.cache.active.size >= self.config.wal_upload_threshold:
            # seal now, so objects stay near the threshold however busy the uploads are
            self.cache.seal()
            self._upload_wanted.set()

    async def force_upload(self) -> None:
        """Seal the cache now and return once everything appended so far is in object storage."""
        block = self.cache.seal()
        target = block.block_id if block is not None else self._last_sealed_id()
        if target < 0:
            return
        self._force_upto = max(self._force_upto, target)
        self._upload_wanted.set()
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    all(b.block_id > target for b in self.cache.sealed_blocks())
                    or self._failed is not None
                    or self._closing
                )
            )
        if self._failed is not None:
            raise StreamClosedError(f"storage failed: {self._failed}")

    def _last_sealed_id(self) -> int:
        sealed = self.cache.sealed_blocks()
        return sealed[-1].block_id if sealed else -1

    async def _upload_loop(self) -> None:
        """Start one upload task per sealed block; each commits after the one before it."""
        interval = self.config.wal_upload_interval_ms / 1000
        previous: asyncio.Future[None] | None = None
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._upload_wanted.wait(), timeout=min(interval, 1.0))
            self._upload_wanted.clear()
            active = self.cache.active
            if active.records and time.monotonic() - active.first_put_at >= interval:
                self.cache.seal()
            for block in self.cache.sealed_blocks():
                if block.block_id in self._upload_tasks:
                    continue
                committed = asyncio.get_running_loop().create_future()
                self._upload_tasks[block.block_id] = asyncio.create_task(
                    self._upload_in_order(block, previous, committed),
                    name=f"s3storage-upload-{block.block_id}",
                )
                previous = committed

    async def _upload_in_order(
        self,
        block: LogCacheBlock,
        previous: asyncio.Future[None] | None,
        committed: asyncio.Future[None],
    ) -> None:
        """Upload ``block`` (concurrently with others), commit it after ``previous`` committed,
        then trim the WAL; retried until it succeeds, as S3 outages are waited out."""
        delay = 0.5
        try:
            while True:
                try:
                    async with self._upload_slots:
                        staged = await self._stage(block)
                    if previous is not None:
                        await previous  # commits (and WAL trims) follow the WAL's order
                    if await self._commit(block, staged):
                        break
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning(
                        "upload of cache block %d (%d bytes) failed, retrying in %.1fs: %s",
                        block.block_id,
                        block.size,
                        delay,
                        e,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
            self.uploads += 1
            self.cache.mark_uploaded(block)
            await self.wal.trim(self.cache.wal_trim_offset(fallback=block.wal_end))
            committed.set_result(None)
        except BaseException:
            committed.cancel()  # later blocks must not commit before this one
            raise
        finally:
            self._upload_tasks.pop(block.block_id, None)
            async with self._changed:
                self._changed.notify_all()

    async def _stage(self, block: LogCacheBlock) -> _Staged | None:
        """Reserve object ids, build the objects and PUT them; None if there is nothing."""
        plan = plan_upload(block.records, self.config.stream_object_split_size)
        if plan.object_count == 0:
            return None
        first_id = await self.metadata.prepare_object(
            plan.object_count, self.config.object_prepare_ttl_ms
        )
        ids = iter(range(first_id, first_id + plan.object_count))
        sso_id = next(ids) if plan.stream_set else -1
        so_ids = [next(ids) for _ in plan.stream_objects]
        block_size = self.config.object_block_size
        # building walks every batch: keep that off the event loop
        sso, sos = await asyncio.to_thread(
            lambda: (
                build_object(plan.stream_set, block_size),
                [build_object([run], block_size) for run in plan.stream_objects],
            )
        )
        puts = [self._put(oid, built) for oid, built in zip(so_ids, sos, strict=True)]
        if sso_id >= 0:
            puts.append(self._put(sso_id, sso))
        await asyncio.gather(*puts)
        return _Staged(
            sso_id=sso_id,
            sso_size=sso.size if sso_id >= 0 else 0,
            ranges=[
                CommitRange(run[0].stream_id, _epoch(run), run[0].base_offset, run[-1].last_offset)
                for run in plan.stream_set
            ],
            stream_objects=[
                CommitStreamObject(
                    oid, run[0].stream_id, run[0].base_offset, run[-1].last_offset, built.size
                )
                for oid, run, built in zip(so_ids, plan.stream_objects, sos, strict=True)
            ],
        )

    async def _commit(self, block: LogCacheBlock, staged: _Staged | None) -> bool:
        """Commit staged objects; False when fenced streams were dropped and it must be redone
        (the objects just written stay PREPARED and expire)."""
        if staged is None:
            return True
        try:
            await self.metadata.commit_stream_set_object(
                self.node_id,
                self.node_epoch,
                staged.sso_id,
                staged.sso_id,
                staged.sso_size,
                staged.ranges,
                staged.stream_objects,
            )
        except MetadataError as e:
            if e.code is ErrorCode.STREAM_FENCED and self._drop_fenced(block):
                return False
            raise
        return True

    def _drop_fenced(self, block: LogCacheBlock) -> bool:
        """Remove from ``block`` the streams that a newer epoch or another node now owns."""
        dropped = []
        for stream_id, run in list(block.records.items()):
            meta = self.metadata.stream(stream_id)
            owner = meta.ranges[-1].node_id if meta is not None and meta.ranges else None
            if meta is None or meta.epoch > _epoch(run) or owner != self.node_id:
                dropped.append(stream_id)
                del block.records[stream_id]
                self.unregister_stream(stream_id)
        for stream_id in dropped:
            log.error(
                "stream %d is fenced by a newer owner: its records from this node were not "
                "uploaded",
                stream_id,
            )
        return bool(dropped)

    async def _put(self, object_id: int, built: BuiltObject) -> None:
        await self.store.put(object_key(self.config.namespace, object_id), built.parts)

    # -- read path -------------------------------------------------------------------------------

    async def read(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """Batches from the one holding ``start`` up to ``end``, about ``max_bytes`` (>= 1 batch).

        Hot data comes from the LogCache; what lies before the cache comes from objects.
        """
        hot = self.cache.get(stream_id, start, end, max_bytes)
        if hot and hot[0].base_offset <= start:
            return hot
        cold_end = hot[0].base_offset if hot else end
        cold = await self._read_cold(stream_id, start, cold_end, max_bytes)
        size = sum(b.size for b in cold)
        if hot and cold and cold[-1].last_offset == cold_end:
            for b in hot:
                if size >= max_bytes:
                    break
                cold.append(b)
                size += b.size
        return cold

    async def _read_cold(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        out: list[StreamRecordBatch] = []
        size = 0
        pos = start
        sequential = self._last_cold_read_end.get(stream_id) == start
        readahead = self.config.readahead_size if sequential else 0
        while pos < end and (not out or size < max_bytes):
            objects = self.metadata.get_objects(stream_id, pos, end, 16)
            progressed = False
            for obj in objects:
                if obj.start_offset > pos or obj.end_offset <= pos:
                    break
                got = await self.reader.read(
                    obj.object_id,
                    obj.object_size,
                    stream_id,
                    pos,
                    end,
                    max(max_bytes - size, 1),
                    readahead,
                )
                if not got:
                    break
                out.extend(got)
                size += sum(b.size for b in got)
                pos = got[-1].last_offset
                progressed = True
                if pos >= end or size >= max_bytes:
                    break
            if not progressed:
                break
        self._last_cold_read_end[stream_id] = pos
        return out

    def drop_cache(self) -> None:
        """Forget uploaded data held in memory, so later reads go to object storage."""
        self.cache.drop_uploaded()
        self.block_cache.clear()
        self.reader.forget_all()


def _epoch(run: Sequence[StreamRecordBatch]) -> int:
    return max(r.epoch for r in run)
