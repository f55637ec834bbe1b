"""S3Storage: the write path (WAL + LogCache + upload) and the read path (cache, then objects).

Write: a StreamRecordBatch goes to the WAL; once fsynced and once every earlier offset of its
stream is too, it enters the LogCache and the append is acknowledged. When the cache's active
block passes ``s3.wal.upload.threshold`` (or ``s3.wal.upload.interval.ms`` passes) it is sealed
and uploaded as one Stream Set Object plus a Stream Object per large stream. Up to
``UPLOADS_IN_FLIGHT`` blocks are written to object storage at once; their metadata commits, and
the WAL trims behind them, happen strictly in block order.

Start: everything in the WAL after its trim point is replayed and uploaded before the storage
serves, so a crash loses nothing that was acknowledged.

Read: what is still in the LogCache is served from it; what lies before comes from objects
through StreamReaders (``stream_reader.py``): blocks located across objects, merged ranged GETs,
read-ahead into the BlockCache for sequential readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from storage import stream_record_batch
from storage.block_cache import BlockCache
from storage.config import S3StreamConfig
from storage.errors import StorageFailedError, StreamClosedError
from storage.log_cache import LogCache, LogCacheBlock
from storage.metadata import control
from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    MetadataError,
    StreamState,
)
from storage.object_format import object_key
from storage.object_reader import ObjectReader
from storage.operator import open_object_store
from storage.operator.base import ObjectStore
from storage.operator.local import LocalObjectStore
from storage.stream_reader import StreamReaders
from storage.stream_record_batch import StreamRecordBatch
from storage.upload import build_object, plan_upload
from storage.upload_worker import RunSpec, UploadWorker, WorkerSettings
from storage.wal import FileWAL, WALAppendResult, WALError
from storage.wal.interface import WriteAheadLog
from storage.wal.object_wal import ObjectWAL, open_object_wal

log = logging.getLogger("automq.storage")

WAL_FILE = "wal.log"
UPLOADS_IN_FLIGHT = 2  # blocks being written to object storage at once (commits stay ordered)
_PUTS_IN_FLIGHT = 2  # objects one upload sends at once while it builds the next
# Objects smaller than this are built here, not by the upload worker: a copy this small costs
# the event loop less than a message to the worker, and a broker that only ever uploads small
# objects (a test's, an idle one's at its interval or its stop) never starts a worker. Not to a
# remote store once the worker runs: an S3 PUT costs the loop far more than its copy (the
# client's signing, parsing and the garbage they leave: a busy broker's every upload has one
# small object, its partitions' time indexes and MetaStreams)
INLINE_OBJECT_MAX = 1 << 20
# A stream's own upload (a partition handed over, upload_streams) builds its objects here up to
# this many bytes (about 1 ms of the loop per MiB): the worker may have to be started first,
# which would cost the hand-off a second or more
STREAMS_INLINE_MAX = 16 << 20
# Uploads are paced at the rate their block filled, measured over at most this long (AutoMQ's
# rule); a block sealed sooner after its first record than the floor is not paced
_PACE_WINDOW_S = 5.0
_PACE_FLOOR_S = 0.1
_LIFT_CHECK_S = 0.05  # a paced upload waiting for its next object's time re-checks this often
CLOSE_FLUSH_TIMEOUT_S = 60.0
# an object holding the data of several streams about to be read whole is fetched with one GET
# when at most this big (a broker taking many partitions over replays their MetaStreams)
PREFETCH_OBJECT_MAX = 16 << 20
# a commit refused for these streams drops their data from the upload instead of retrying
_UNWRITABLE = (ErrorCode.STREAM_FENCED, ErrorCode.STREAM_NOT_OPENED, ErrorCode.STREAM_NOT_EXIST)


@dataclass(slots=True)
class _Durable:
    """An append whose WAL write is fsynced, waiting for the offsets before it."""

    batch: StreamRecordBatch
    wal_offset: int
    wal_next: int
    done: asyncio.Future[None]
    on_done: Callable[[], object] | None = None


@dataclass(slots=True)
class _StreamState:
    """What the write path tracks for a stream opened on this node, at one epoch."""

    epoch: int
    confirmed: int  # every offset below is durable and readable
    waiting: dict[int, _Durable] = field(default_factory=dict)  # by base offset
    # each append not yet confirmed, with its ``on_done`` (see ``S3Storage.submit``)
    inflight: dict[asyncio.Future[None], Callable[[], object] | None] = field(default_factory=dict)
    # called once an append of the stream failed (``register_stream``)
    on_failed: Callable[[], object] | None = None


@dataclass(slots=True, frozen=True)
class _Staged:
    """Objects written for one block, ready to commit."""

    sso_id: int
    sso_size: int
    ranges: list[CommitRange]
    stream_objects: list[CommitStreamObject]
    seconds: float = 0.0  # from the first object's request to the last one written
    rate: float | None = None  # bytes/s the PUTs were paced at (None: full speed)
    revision: int = 0  # the block's revision the objects were built from


class S3Storage:
    """One node's stream store. Build it with :meth:`start`."""

    def __init__(
        self,
        config: S3StreamConfig,
        wal: WriteAheadLog,
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
        # a broker of a cluster fenced while it still held unuploaded data registers again
        # (a new node epoch) and its uploads commit then: they wait instead of failing
        self.rejoins_when_fenced = False
        self.cache = LogCache(config.wal_cache_size)
        self.block_cache = BlockCache(config.block_cache_size)
        self.reader = ObjectReader(store, config.namespace, self.block_cache)
        self.readers = StreamReaders(metadata, self.reader, self.block_cache, config.readahead_size)
        # builds and writes the objects in a process of its own (see storage/upload_worker.py)
        self.upload_worker = UploadWorker(
            WorkerSettings(
                # an object WAL has no file to read: its uploads are built here (see _put)
                wal_path=wal.path if isinstance(wal, FileWAL) else None,
                wal_capacity=wal.capacity,
                store_url=config.object_store_url,
                part_size=config.object_part_size,
                max_concurrency=config.max_concurrent_requests,
                retry_timeout_s=config.request_retry_timeout_ms / 1000,
                log_format=config.log_format,
                node_id=config.node_id,
                cluster_id=config.cluster_id,
            ),
            store.stats.add,
        )
        self.uploads = 0
        self._owns_metadata = owns_metadata
        self._owns_store = owns_store
        self._streams: dict[int, _StreamState] = {}
        self._upload_wanted = asyncio.Event()
        self._worker_readied_for = -1  # the cache block that last had the upload worker started
        self._changed = asyncio.Event()  # replaced on every notification: see _notify
        self._uploader: asyncio.Task[None] | None = None
        self._upload_tasks: dict[int, asyncio.Task[None]] = {}
        self._upload_slots = asyncio.Semaphore(UPLOADS_IN_FLIGHT)
        # streams' records taken out of the cache to be uploaded on their own (upload_streams):
        # the WAL keeps them until they are committed
        self._extracted: list[LogCacheBlock] = []
        self._stream_uploads: set[asyncio.Task[None]] = set()
        # the rates the latest blocks filled at, bytes/s
        self._unpaced_through = -1  # blocks up to this id upload at full speed (forced)
        # the objects the upload worker writes paced (forgotten once their pacing is lifted)
        self._paced_puts: set[int] = set()
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
        await store.connect()
        owns_metadata = metadata is None
        if metadata is None:
            metadata = await MetadataManager.open(config.metadata_url)
        node_epoch = await metadata.register_node(config.node_id)
        wal: WriteAheadLog
        if config.wal_object_store_url is not None:
            wal = await open_object_wal(config, node_epoch, store)
        else:
            os.makedirs(config.wal_path, exist_ok=True)
            wal = await FileWAL.open(
                os.path.join(config.wal_path, WAL_FILE),
                config.wal_capacity,
                node_id=config.node_id,
                init_zero=config.wal_init_zero,
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
        try:
            await storage._recover()
        except BaseException:
            await storage.abort()  # the WAL keeps what recovery could not upload
            raise
        storage._uploader = asyncio.create_task(storage._upload_loop(), name="s3storage-upload")
        log.info(
            "S3Storage started: node %d epoch %d, WAL %s, objects %s",
            config.node_id,
            node_epoch,
            config.wal_path,
            config.object_store_url.split("?", 1)[0],
        )
        return storage

    async def recover_node_wal(self, node_id: int) -> None:
        """Recover another node's object WAL on its behalf: the failover of a fenced broker.

        The node gets a new node epoch (its own commits are refused from then on), its WAL
        objects are replayed and uploaded as it would at its next start, every stream it still
        has open is closed (whoever leads its former partitions now opens them with every record
        it acknowledged) and the WAL objects are deleted. Every broker of a cluster keeps its WAL
        where ``s3.wal.path`` says, with this node's id in place of its own."""
        url = self.config.wal_object_store_url
        if url is None:
            raise WALError(
                f"node {node_id}: a file WAL is on that broker's disk only; it recovers it itself"
            )
        started = time.monotonic()
        node_epoch = await self.metadata.register_node(node_id)
        config = dataclasses.replace(self.config, node_id=node_id)
        wal_store = self.store
        if url != self.config.object_store_url:
            wal_store = open_object_store(
                url,
                part_size=self.config.object_part_size,
                max_concurrency=self.config.max_concurrent_requests,
                retry_timeout_s=self.config.request_retry_timeout_ms / 1000,
            )
            await wal_store.connect()
        try:
            wal = await ObjectWAL.open_for_recovery(
                wal_store, namespace=config.namespace, node_id=node_id, fence_epoch=node_epoch
            )
            other = S3Storage(
                config,
                wal,
                self.metadata,
                self.store,
                node_epoch,
                owns_metadata=False,
                owns_store=False,
            )
            try:
                await other._recover()
            finally:
                await other._stop()
                await wal.close(clean=other._failed is None)
            await self.metadata.change(
                lambda image: (control.close_node_streams(image, node_id, node_epoch), None)
            )
        finally:
            if wal_store is not self.store:
                await wal_store.close()
        log.info(
            "recovered node %d's WAL and closed its streams in %.0f ms",
            node_id,
            (time.monotonic() - started) * 1000,
        )

    async def close(self, flush_timeout: float = CLOSE_FLUSH_TIMEOUT_S) -> None:
        """Upload everything still in the cache, trim the WAL, and release resources.

        If the upload cannot finish within ``flush_timeout`` seconds (object storage down),
        the data stays in the WAL and the next start uploads it.
        """
        if self._closing:
            return
        clean = False
        if self._failed is None:
            deadline = time.monotonic() + flush_timeout
            try:
                await asyncio.wait_for(self.force_upload(), flush_timeout)
                if self._stream_uploads:
                    await asyncio.wait(self._stream_uploads, timeout=deadline - time.monotonic())
                clean = not self._extracted
            except (TimeoutError, StreamClosedError) as e:
                log.warning("close: cached data stays in the WAL for the next start (%r)", e)
        await self._stop()
        await self.wal.close(clean=clean and self._failed is None)
        await self._release()

    async def abort(self) -> None:
        """Stop at once without uploading, as a crash would: the WAL keeps the data for the
        next start's recovery."""
        if self._closing:
            return
        await self._stop()
        await self.wal.close(clean=False)
        await self._release()

    async def _stop(self) -> None:
        self._closing = True
        self._notify()
        tasks = [
            t
            for t in (self._uploader, *self._upload_tasks.values(), *self._stream_uploads)
            if t is not None
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.upload_worker.close()
        await self.readers.close()
        await self.reader.close()
        self._fail_waiting(StreamClosedError("storage is closed"))

    async def _release(self) -> None:
        counters = " ".join(f"{k} {v}" for k, v in self.store.stats.snapshot().items())
        log.info("object store requests: %s", counters)
        cache = self.block_cache
        log.info(
            "block cache: hits %d misses %d evicted_unread %d; reads that waited for object "
            "storage %d",
            cache.hits,
            cache.misses,
            cache.evicted_unread,
            self.reader.waited,
        )
        if self._owns_store:
            await self.store.close()
        if self._owns_metadata:
            await self.metadata.close()

    @property
    def failed(self) -> BaseException | None:
        """The error the write path could not get past, once it failed."""
        return self._failed

    def _notify(self) -> None:
        """Wake everything waiting for a change (uploads done, room freed, failure, close)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` holds; StreamClosedError if the storage fails or closes."""
        while not ready():
            if self._failed is not None:
                raise StorageFailedError(f"storage failed: {self._failed}")
            if self._closing:
                raise StreamClosedError("storage is closing")
            await self._changed.wait()

    def _fail(self, error: BaseException) -> None:
        """Stop accepting writes: an error the write path cannot get past (WAL, metadata)."""
        if self._failed is None:
            self._failed = error
            log.critical("S3Storage failed; no more appends are accepted: %s", error)
        self._fail_waiting(StorageFailedError(f"storage failed: {error}"))
        self._notify()

    def _fail_waiting(self, error: StreamClosedError) -> None:
        for state in self._streams.values():
            inflight = state.inflight
            state.waiting.clear()
            state.inflight = {}
            failed = False
            for done, on_done in inflight.items():
                if not done.done():
                    done.set_exception(error)
                    done.exception()  # seen: the appender may have stopped waiting
                    failed = True
                if on_done is not None:
                    _call_listener(on_done, "failure")
            if failed and state.on_failed is not None:
                state.on_failed()

    # -- recovery --------------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Replay the WAL past its trim point into the cache, upload it, then trim the WAL.

        Per stream, the last WAL record written at an offset wins (an earlier one may be an
        unacknowledged write that a later epoch replaced), records of older epochs than the
        stream's are dropped, and streams this node no longer owns are skipped.
        """
        runs: dict[int, dict[int, tuple[StreamRecordBatch, int, int]]] = {}
        replayed = 0
        for rec in self.wal.recover():
            batch, _ = stream_record_batch.decode(rec.body)
            batch = StreamRecordBatch(
                batch.stream_id, batch.epoch, batch.base_offset, batch.count, bytes(batch.payload)
            )
            runs.setdefault(batch.stream_id, {})[batch.base_offset] = (
                batch,
                rec.offset,
                rec.next_offset,
            )
            replayed += 1
        if not runs:
            return
        kept = 0
        for stream_id, by_offset in sorted(runs.items()):
            meta = self.metadata.stream(stream_id)
            if meta is None or meta.state != StreamState.OPENED or meta.owner != self.node_id:
                log.warning(
                    "WAL recovery: stream %d is %s; dropping its records",
                    stream_id,
                    "deleted" if meta is None else "closed or owned by another node",
                )
                continue
            expected = meta.end_offset
            for base in sorted(by_offset):
                batch, wal_offset, wal_next = by_offset[base]
                if batch.last_offset <= expected or batch.epoch < meta.epoch:
                    continue  # uploaded before the crash, or superseded by a newer epoch
                if batch.base_offset != expected:
                    log.error(
                        "WAL recovery: stream %d has a gap at %d (next record starts at %d); "
                        "dropping its records from there on",
                        stream_id,
                        expected,
                        batch.base_offset,
                    )
                    break
                self.cache.put(batch, wal_offset, wal_next)
                expected = batch.last_offset
                kept += 1
                if self.cache.active.size >= self.config.wal_upload_threshold:
                    self.cache.seal()
        log.info("WAL recovery: %d records replayed, %d to upload", replayed, kept)
        self.cache.seal()
        previous: asyncio.Future[None] | None = None
        for block in self.cache.sealed_blocks():
            committed = asyncio.get_running_loop().create_future()
            await self._upload_in_order(block, previous, committed)
            previous = committed
        if self._failed is not None:
            raise StorageFailedError(f"WAL recovery failed: {self._failed}")
        await self.wal.trim(self.wal.next_offset)

    # -- streams ---------------------------------------------------------------------------------

    def register_stream(
        self,
        stream_id: int,
        epoch: int,
        confirmed: int,
        on_failed: Callable[[], object] | None = None,
    ) -> None:
        """Track a stream opened on this node at ``epoch``, whose next offset is ``confirmed``;
        ``on_failed()`` is called when one of its appends fails."""
        self._streams[stream_id] = _StreamState(epoch, confirmed, on_failed=on_failed)

    def is_open_here(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def unregister_stream(self, stream_id: int, epoch: int | None = None) -> None:
        """Stop tracking the stream (only its registration at ``epoch``, when given)."""
        state = self._streams.get(stream_id)
        if state is not None and (epoch is None or state.epoch == epoch):
            del self._streams[stream_id]
            self.readers.forget(stream_id)

    def drop_stream(self, stream_id: int, epoch: int | None = None) -> None:
        """Forget the stream here, its records not yet uploaded included: this node may no
        longer write it (refused, fenced, or being deleted)."""
        self.cache.discard_stream(stream_id)
        self.unregister_stream(stream_id, epoch)

    def confirmed_offset(self, stream_id: int) -> int:
        state = self._streams.get(stream_id)
        if state is not None:
            return state.confirmed
        meta = self.metadata.stream(stream_id)
        return meta.end_offset if meta is not None else 0

    async def drain(self, stream_id: int) -> None:
        """Wait for the stream's appends in flight to be acknowledged or fail."""
        state = self._streams.get(stream_id)
        if state is not None and state.inflight:
            await asyncio.gather(*state.inflight, return_exceptions=True)

    # -- write path ------------------------------------------------------------------------------

    async def wait_for_room(self, timeout: float | None = None) -> None:
        """Backpressure: wait while data not yet in object storage fills ``s3.wal.cache.size``
        or the WAL ring; ``TimeoutError`` after ``timeout`` seconds (None: no limit).

        Callers wait *before* taking an offset, so appends reach the WAL in offset order and
        one that times out has taken nothing. (Waiting in the WAL instead, for ring space,
        an append would hold offsets that later appends queue behind however long object
        storage is down, and would still land after its request timed out.)
        """
        limit = self.config.wal_cache_size

        def room() -> bool:
            return self.cache.unuploaded_size < limit and self.wal.free_space > 0

        if not room():
            self._upload_wanted.set()
            try:
                await asyncio.wait_for(self._wait_until(room), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no room for appends for {timeout:.3f} s: {self.cache.unuploaded_size} "
                    f"bytes are not in object storage yet (s3.wal.cache.size {limit}; "
                    f"{max(self.wal.free_space, 0)} of s3.wal.capacity {self.wal.capacity} "
                    f"bytes free)"
                ) from None

    async def append(self, batch: StreamRecordBatch) -> None:
        """Make ``batch`` durable; return once it and every earlier offset of its stream are.

        The WAL write is started before this first yields, so calls made in offset order reach
        the WAL in that order; cancelling the caller does not cancel a write whose offset is
        taken.
        """
        await asyncio.shield(self.submit(batch))

    def submit(
        self, batch: StreamRecordBatch, on_done: Callable[[], object] | None = None
    ) -> asyncio.Future[None]:
        """Start the WAL write of ``batch`` now; the future is done once it and every earlier
        offset of its stream are durable. Submits made in offset order reach the WAL in that
        order, and writes submitted together share a group commit (one fsync).

        ``on_done()`` is called once the append is settled: right after the future is set
        done, or failed, in the same pass of the event loop (a done callback runs a pass
        later, behind whatever requests were read meanwhile: an acknowledgement that waits for
        it goes out sooner), and also when the caller had cancelled the future. A failed
        future's exception counts as seen (no "never retrieved" log): its appender may have
        stopped waiting."""
        if self._failed is not None:
            raise StorageFailedError(f"storage failed: {self._failed}")
        if self._closing:
            raise StreamClosedError("storage is closing")
        state = self._streams.get(batch.stream_id)
        if state is None or state.epoch != batch.epoch:
            raise StreamClosedError(f"stream {batch.stream_id} is not open at epoch {batch.epoch}")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        header = stream_record_batch.encode_header(batch)
        try:
            self.wal.submit(
                [header, batch.payload],
                lambda f: self._on_durable(state, batch, done, f, on_done),
            )
        except Exception as e:
            self._fail(e)
            raise StorageFailedError(f"storage failed: {e}") from e
        state.inflight[done] = on_done
        return done

    def _on_durable(
        self,
        state: _StreamState,
        batch: StreamRecordBatch,
        done: asyncio.Future[None],
        durable: asyncio.Future[WALAppendResult],
        on_done: Callable[[], object] | None,
    ) -> None:
        """The WAL write of ``batch`` finished: confirm it, and every write it held back, in
        offset order; they enter the cache and their appends return."""
        if durable.cancelled() or durable.exception() is not None:
            self._fail(durable.exception() or WALError("WAL write was cancelled"))
            return
        if done not in state.inflight:  # failed meanwhile (and settled then)
            return
        # (a caller that cancelled its future gave up waiting; the write is confirmed anyway,
        # or every later offset of the stream would wait behind it forever)
        result = durable.result()
        state.waiting[batch.base_offset] = _Durable(
            batch, result.offset, result.next_offset, done, on_done
        )
        while state.confirmed in state.waiting:
            record = state.waiting.pop(state.confirmed)
            self.cache.put(record.batch, record.wal_offset, record.wal_next)
            state.confirmed = record.batch.last_offset
            del state.inflight[record.done]
            if not record.done.done():
                record.done.set_result(None)
            if record.on_done is not None:
                _call_listener(record.on_done, "durability")
        active = self.cache.active
        if active.size >= self.config.wal_upload_threshold:
            # seal now, so objects stay near the threshold however busy the uploads are
            self.cache.seal()
            self._upload_wanted.set()
        elif (
            active.size >= self.config.wal_upload_threshold // 4
            and active.size > INLINE_OBJECT_MAX
            and active.block_id != self._worker_readied_for
        ):
            # an upload the worker builds is coming: its process starts now (a Python start,
            # ~0.1 s of CPU), not when the upload waits for it
            self._worker_readied_for = active.block_id
            self.upload_worker.prepare()

    def _wal_trim_point(self, fallback: int) -> int:
        """The WAL offset below which every durable record is in object storage."""
        point = self.cache.wal_trim_offset(fallback)
        for extracted in self._extracted:
            point = min(point, extracted.wal_start)
        for state in self._streams.values():
            for durable in state.waiting.values():
                point = min(point, durable.wal_offset)
        return point

    async def force_upload(self) -> None:
        """Seal the cache now and return once everything appended so far is in object storage
        (streams' records taken out by ``upload_streams`` included)."""
        stream_uploads = set(self._stream_uploads)
        block = self.cache.seal()
        sealed = self.cache.sealed_blocks()
        target = block.block_id if block is not None else (sealed[-1].block_id if sealed else -1)
        if target >= 0:
            self._unpaced_through = max(self._unpaced_through, target)
            self._lift_pacing()  # (that of later blocks too: they commit after these)
            self._upload_wanted.set()
            await self._wait_until(
                lambda: all(b.block_id > target for b in self.cache.sealed_blocks())
            )
        if stream_uploads:
            await asyncio.wait(stream_uploads)

    async def upload_streams(self, stream_ids: Collection[int]) -> None:
        """Upload what the cache holds of ``stream_ids`` now, in objects of their own, and return
        once it is committed. A stream handed to another node waits for its own tail only: the
        time a partition move leaves it unwritable does not grow with what the other streams
        have waiting for upload. The blocks they are taken from upload without them (one
        already being uploaded builds its objects again)."""
        block = self.cache.extract_streams(stream_ids)
        if block is None:
            return
        if block.size > STREAMS_INLINE_MAX:
            self.upload_worker.prepare()
        # a task of its own: the records are out of the cache, so a caller that stops waiting
        # must not stop their upload (close waits for it)
        upload = asyncio.create_task(self._upload_extracted(block), name="s3storage-upload-streams")
        self._stream_uploads.add(upload)
        upload.add_done_callback(self._stream_uploads.discard)
        await asyncio.shield(upload)

    async def _upload_extracted(self, block: LogCacheBlock) -> None:
        mine = [block]
        self._extracted.append(block)
        started = time.monotonic()
        delay = 0.5
        try:
            while block.records:
                try:
                    staged = await self._stage(block)
                    if await self._commit(block, staged) == "done":
                        log.info(
                            "uploaded %d bytes of %d streams on their own in %.3f s",
                            block.size,
                            len(block.records),
                            time.monotonic() - started,
                        )
                        return
                except MetadataError as e:
                    if e.code is ErrorCode.OFFSET_NOT_MATCHED:
                        # a block upload committed some of their records first
                        block = self._without_committed(block)
                        mine.append(block)
                        continue
                    if e.code is ErrorCode.NODE_EPOCH_EXPIRED and self.rejoins_when_fenced:
                        log.warning(
                            "upload of %d streams' records waits for this node to "
                            "register again: %s",
                            len(block.records),
                            e,
                        )
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
                        continue
                    self._fail(e)  # their records are nowhere else than in the WAL now
                    raise
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning(
                        "upload of %d streams' records failed, retrying in %.1fs: %s",
                        len(block.records),
                        delay,
                        e,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
        finally:
            self._extracted = [b for b in self._extracted if all(b is not m for m in mine)]
            self._notify()

    def _without_committed(self, block: LogCacheBlock) -> LogCacheBlock:
        """``block`` without the records whose offsets the metadata already has committed."""
        rest = LogCacheBlock(-1)
        for stream_id in list(block.records):
            meta = self.metadata.stream(stream_id)
            if meta is not None:
                block.move_to(stream_id, rest, from_offset=meta.end_offset)
        rest.sealed = True
        rest.sealed_at = block.sealed_at
        rest.wal_start = block.wal_start  # the WAL keeps what the first block held
        self._extracted.append(rest)
        return rest

    # -- upload ----------------------------------------------------------------------------------

    async def _upload_loop(self) -> None:
        """Start one upload task per sealed block; each commits after the one before it."""
        interval = self.config.wal_upload_interval_ms / 1000
        previous: asyncio.Future[None] | None = None
        while not self._closing and self._failed is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._upload_wanted.wait(), timeout=min(interval, 1.0))
            self._upload_wanted.clear()
            self._lift_pacing_if_behind()
            active = self.cache.active
            if active.records and time.monotonic() - active.first_put_at >= interval:
                self.cache.seal()
            for block in self.cache.sealed_blocks():
                if block.block_id in self._upload_tasks or self._failed is not None:
                    continue
                committed = asyncio.get_running_loop().create_future()
                committed.add_done_callback(_retrieve)
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
        then trim the WAL. Object storage errors are retried until they pass (an outage stalls
        uploads); a metadata refusal either drops the refused streams or fails the storage."""
        delay = 0.5
        started = time.monotonic()
        try:
            staged: _Staged | None = None
            while True:
                try:
                    if staged is None:
                        async with self._upload_slots:
                            staged = await self._stage(block)
                    if previous is not None:
                        await previous  # commits (and WAL trims) follow the WAL's order
                    if staged is not None and staged.revision != block.revision:
                        staged = None  # streams left the block meanwhile: build it again
                        continue
                    # finish a started metadata transaction even if the task is cancelled
                    commit = asyncio.ensure_future(self._commit(block, staged))
                    try:
                        outcome = await asyncio.shield(commit)
                    except asyncio.CancelledError:
                        with contextlib.suppress(BaseException):
                            await commit
                        raise
                    if outcome == "done":
                        if staged is not None:
                            log.info(
                                "uploaded cache block %d: %d bytes of %d streams in %d objects "
                                "in %.2f s (written in %.2f s; %s)",
                                block.block_id,
                                block.size,
                                len(block.records),
                                len(staged.stream_objects) + (staged.sso_id >= 0),
                                time.monotonic() - started,
                                staged.seconds,
                                "full speed"
                                if staged.rate is None
                                else f"paced at {staged.rate / 1e6:.1f} MB/s",
                            )
                        break
                    staged = None  # streams were dropped: build the objects again
                except asyncio.CancelledError:
                    raise
                except MetadataError as e:
                    if e.code is ErrorCode.NODE_EPOCH_EXPIRED and self.rejoins_when_fenced:
                        log.warning(
                            "upload of cache block %d waits for this node to register again: %s",
                            block.block_id,
                            e,
                        )
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
                        continue
                    self._fail(e)
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
            try:
                await self.wal.trim(self._wal_trim_point(fallback=block.wal_end))
            except Exception as e:
                self._fail(e)
                raise
            committed.set_result(None)
        except BaseException:
            committed.cancel()  # later blocks must not commit before this one
            raise
        finally:
            self._upload_tasks.pop(block.block_id, None)
            self._notify()

    async def _stage(self, block: LogCacheBlock) -> _Staged | None:
        """Reserve object ids and have the upload worker build and write the objects; None if
        there is nothing to upload."""
        revision = block.revision
        plan = plan_upload(block.records, self.config.stream_object_split_size, block.stream_sizes)
        if plan.object_count == 0:
            return None
        first_id = await self.metadata.prepare_object(
            plan.object_count, self.config.object_prepare_ttl_ms
        )
        if block.order_id < 0:
            block.order_id = first_id  # kept across retries: SSO order follows data order
        ids = iter(range(first_id, first_id + plan.object_count))
        sso_id = next(ids) if plan.stream_set else -1
        so_ids = [next(ids) for _ in plan.stream_objects]
        # one object at a time, at most _PUTS_IN_FLIGHT in the worker, paced: the upload's CPU
        # (the worker's, and an object store's on the same host) is spread out, not spent in
        # one burst that delays the appends meanwhile
        objects = [(oid, [run]) for oid, run in zip(so_ids, plan.stream_objects, strict=True)]
        if sso_id >= 0:
            objects.append((sso_id, plan.stream_set))
        sizes: dict[int, int] = {}
        started = time.monotonic()
        slots = asyncio.Semaphore(_PUTS_IN_FLIGHT)
        puts: list[asyncio.Task[None]] = []
        rate = self._upload_rate(block)
        sent = 0
        any_paced = False
        try:
            for oid, runs in objects:
                await slots.acquire()
                paced = rate if rate is not None and self._paced(block) else None
                if paced is not None:
                    any_paced = True
                    # (re-checked as it waits: the appends may leave the uploads behind)
                    due = started + sent / paced
                    while (wait := due - time.monotonic()) > 0 and self._paced(block):
                        await asyncio.sleep(min(wait, _LIFT_CHECK_S))
                    if not self._paced(block):
                        paced = None
                sent += sum(block.stream_sizes[run[0].stream_id] for run in runs)
                put = asyncio.create_task(
                    self._put(oid, block, runs, sizes, paced), name=f"put-object-{oid}"
                )
                put.add_done_callback(lambda _: slots.release())
                puts.append(put)
            await asyncio.gather(*puts)
        except BaseException:
            for put in puts:
                put.cancel()
            await asyncio.gather(*puts, return_exceptions=True)
            raise
        return _Staged(
            sso_id=sso_id,
            sso_size=sizes.get(sso_id, 0),
            ranges=[
                CommitRange(
                    run[0].stream_id,
                    block.stream_epochs[run[0].stream_id],
                    run[0].base_offset,
                    run[-1].last_offset,
                )
                for run in plan.stream_set
            ],
            stream_objects=[
                CommitStreamObject(
                    oid, run[0].stream_id, run[0].base_offset, run[-1].last_offset, sizes[oid]
                )
                for oid, run in zip(so_ids, plan.stream_objects, strict=True)
            ],
            seconds=time.monotonic() - started,
            rate=rate if any_paced else None,
            revision=revision,
        )

    def _upload_rate(self, block: LogCacheBlock) -> float | None:
        """Bytes/s to pace ``block``'s PUTs at, None for full speed: the rate the block filled
        at (over at most ``_PACE_WINDOW_S``). Paced, an upload's CPU (ours, and an object
        store's on the same host) and its writes are spread over about the time the data took
        to arrive instead of spent in one burst that delays the appends meanwhile; a pace at
        the fill rate keeps up with the appends, and once the uploads fall behind all the same
        the pacing is lifted (see ``_paced``).

        AutoMQ paces at the fastest rate it has ever seen: after one burst of appends every
        later upload would go at burst speed, the spike pacing is there to avoid (measured: a
        warm-up at 180 MB/s, then 20 MB/s of appends with PUTs at 180 MB/s, produce p99
        37 ms). Paced at the faster of its own rate and the block before's, the first block
        after a burst still went at burst speed (100 MB at 350-500 MB/s, while a producer
        went on at 20 MB/s)."""
        elapsed = block.sealed_at - block.first_put_at
        if block.block_id < 0 or block.first_put_at < 0 or elapsed <= _PACE_FLOOR_S:
            return None  # a stream's own upload (a hand-over) goes at full speed
        return block.size / min(_PACE_WINDOW_S, elapsed)

    def _paced(self, block: LogCacheBlock | None) -> bool:
        """Whether ``block`` (None: any upload) may still be paced: not once it is forced (a
        force_upload, a close), once the data waiting for upload fills half of
        ``s3.wal.cache.size``, or once the WAL ring has less than an upload threshold free."""
        return (
            (block is None or block.block_id > self._unpaced_through)
            and not self._closing
            and self.cache.unuploaded_size < self.config.wal_cache_size // 2
            and self.wal.free_space > self.config.wal_upload_threshold
        )

    async def _commit(self, block: LogCacheBlock, staged: _Staged | None) -> str:
        """Commit staged objects: "done", or "redo" when refused streams were dropped from
        ``block`` (the objects just written stay PREPARED and expire). Other metadata refusals
        raise; transient errors raise too and the same objects are committed again."""
        if staged is None:
            return "done"
        try:
            await self.metadata.commit_stream_set_object(
                self.node_id,
                self.node_epoch,
                staged.sso_id,
                block.order_id,
                staged.sso_size,
                staged.ranges,
                staged.stream_objects,
            )
        except MetadataError as e:
            if staged.revision != block.revision:
                return "redo"  # streams left the block meanwhile (handed over, dropped)
            if e.code in _UNWRITABLE and self._drop_unwritable(block):
                return "redo"
            if e.code is ErrorCode.OFFSET_NOT_MATCHED and self._already_committed(staged):
                return "done"  # an earlier attempt's transaction went through
            raise
        return "done"

    def _already_committed(self, staged: _Staged) -> bool:
        ends = [(r.stream_id, r.end_offset) for r in staged.ranges] + [
            (o.stream_id, o.end_offset) for o in staged.stream_objects
        ]
        for stream_id, end in ends:
            meta = self.metadata.stream(stream_id)
            if meta is None or meta.end_offset < end:
                return False
        return True

    def _drop_unwritable(self, block: LogCacheBlock) -> bool:
        """Drop from every unuploaded block the streams this node may no longer write: deleted,
        closed, or opened at a newer epoch or on another node."""
        dropped = []
        for stream_id in list(block.records):
            meta = self.metadata.stream(stream_id)
            if (
                meta is None
                or meta.state != StreamState.OPENED
                or meta.epoch > block.stream_epochs[stream_id]
                or meta.owner != self.node_id
            ):
                dropped.append(stream_id)
                self.drop_stream(stream_id, block.stream_epochs[stream_id])
                block.discard(stream_id)  # a block outside the cache (upload_streams) too
        for stream_id in dropped:
            log.error(
                "stream %d: this node's unuploaded records were refused (fenced, closed or "
                "deleted) and dropped",
                stream_id,
            )
        return bool(dropped)

    async def _put(
        self,
        object_id: int,
        block: LogCacheBlock,
        runs: list[Sequence[StreamRecordBatch]],
        sizes: dict[int, int],
        rate: float | None,
    ) -> None:
        """Write the object ``object_id`` of ``runs`` (whole streams of ``block``): a small one
        here, at once (its burst is too small to pace); any other by the upload worker, which
        reads it from the WAL file and sends its bytes at ``rate`` bytes/s. With an object WAL
        (no file to read) every object is built here."""
        key = object_key(self.config.namespace, object_id)
        size = sum(block.stream_sizes[run[0].stream_id] for run in runs)
        streams_own = block.block_id < 0 and block.size <= STREAMS_INLINE_MAX
        small = size < INLINE_OBJECT_MAX and (
            isinstance(self.store, LocalObjectStore) or not self.upload_worker.running
        )
        if small or streams_own or not isinstance(self.wal, FileWAL):
            built = build_object(runs, self.config.object_block_size)
            await self.store.put(key, built.parts)
            sizes[object_id] = built.size
            return
        specs = [
            RunSpec(
                run[0].stream_id,
                run[0].base_offset,
                run[-1].last_offset,
                block.wal_positions[run[0].stream_id],
            )
            for run in runs
        ]
        if rate is not None:
            self._paced_puts.add(object_id)
        try:
            sizes[object_id] = await self.upload_worker.put(
                key, specs, self.config.object_block_size, rate
            )
        finally:
            self._paced_puts.discard(object_id)

    def _lift_pacing_if_behind(self) -> None:
        """Paced puts in progress go on at full speed once the uploads fall behind (see
        ``_paced``): a block of one large object, paced from its start at the rate the data
        came at, would otherwise hold the uploads of the blocks after it, and the appends
        once the LogCache fills (a burst after a calm stalled producers for 4 s)."""
        if self._paced_puts and not self._paced(None):
            log.info(
                "uploads fell behind the appends (%d MiB waiting, %d MiB of WAL free): the "
                "paced ones go on at full speed",
                self.cache.unuploaded_size >> 20,
                self.wal.free_space >> 20,
            )
            self._lift_pacing()

    def _lift_pacing(self) -> None:
        """The paced puts in progress go on at full speed."""
        if self._paced_puts:
            self.upload_worker.lift_pacing()
            self._paced_puts.clear()

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

    async def prefetch_streams(self, stream_ids: Collection[int]) -> int:
        """Bring the data of these streams (each about to be read whole) into the block cache
        with one GET per object that holds several of them and is at most
        :data:`PREFETCH_OBJECT_MAX`: a broker opening 1,000 partitions handed over together
        reads their MetaStreams from the few objects their last owner uploaded, not with a GET
        per stream. Returns how many objects it read."""
        wanted: dict[int, tuple[int, int]] = {}  # object id -> (size, streams it holds)
        for stream_id in stream_ids:
            meta = self.metadata.stream(stream_id)
            if meta is None or meta.end_offset <= meta.start_offset:
                continue
            for obj in self.metadata.get_objects(stream_id, meta.start_offset, -1, 16):
                hot = self.cache.get(stream_id, obj.start_offset, obj.end_offset, 1)
                if hot and hot[0].base_offset <= obj.start_offset:
                    continue  # still in this broker's LogCache
                size, count = wanted.get(obj.object_id, (obj.object_size, 0))
                wanted[obj.object_id] = (size, count + 1)
        chosen = [
            (oid, size)
            for oid, (size, count) in wanted.items()
            if count > 1 and size <= PREFETCH_OBJECT_MAX
        ]
        await asyncio.gather(*(self.reader.load_whole(oid, size) for oid, size in chosen))
        return len(chosen)

    async def _read_cold(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        return await self.readers.read(stream_id, start, end, max_bytes)

    def drop_cache(self) -> None:
        """Forget uploaded data held in memory, so later reads go to object storage."""
        self.cache.drop_uploaded()
        self.readers.clear()
        self.block_cache.clear()
        self.reader.forget_all()


def _call_listener(listener: Callable[[], object], what: str) -> None:
    """Call an append's ``on_done``, logging what it raises, as the loop does for a failing
    callback."""
    try:
        listener()
    except Exception:
        log.exception("a %s listener of an append failed", what)


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a future's exception as seen: its caller may have been cancelled."""
    if not future.cancelled():
        future.exception()
