"""S3Storage: the write path (WAL + LogCache + upload) and the read path (cache, then objects).

Write: a StreamRecordBatch goes to the WAL; once fsynced and once every earlier offset of its
stream is too, it enters the LogCache and the append is acknowledged. When the cache's active
block passes ``s3.wal.upload.threshold`` (or ``s3.wal.upload.interval.ms`` passes) it is sealed
and uploaded as one Stream Set Object plus a Stream Object per large stream by the
:class:`~storage.uploader.Uploader`: several blocks are written to object storage at once;
their metadata commits, and the WAL trims behind them, happen strictly in block order.

Start: everything in the WAL after its trim point is replayed and uploaded before the storage
serves, so a crash loses nothing that was acknowledged.

Read: what is still in the LogCache is served from it; what lies before comes from objects
through StreamReaders (``stream_reader.py``): blocks located across objects, merged ranged GETs,
read-ahead into the BlockCache for sequential readers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from storage import stream_record_batch
from storage.block_cache import BlockCache
from storage.config import S3StreamConfig
from storage.errors import StorageFailedError, StreamClosedError
from storage.log_cache import LogCache, append_joined
from storage.metadata import control
from storage.metadata.manager import MetadataManager
from storage.metadata.model import (
    ErrorCode,
    MetadataError,
    StreamState,
)
from storage.object_reader import ObjectReader
from storage.operator import open_object_store
from storage.operator.base import ObjectStore
from storage.stream_reader import StreamReaders
from storage.stream_record_batch import StreamRecordBatch
from storage.upload_worker import UploadWorker
from storage.uploader import Uploader
from storage.wal import FileWAL, WALAppendResult, WALError
from storage.wal.interface import WriteAheadLog
from storage.wal.object_wal import ObjectWAL, open_object_wal

log = logging.getLogger("automq.storage")

WAL_FILE = "wal.log"
# starts tried when a failover fences the node while it recovers its own WAL
START_ATTEMPTS = 3
CLOSE_FLUSH_TIMEOUT_S = 60.0
# appends whose payloads commit_now copies ahead, at most (a burst of requests holds a few
# dozen); past it, or where nothing calls commit_now, they are copied as they become durable
COPY_AHEAD_MAX = 256
# an object holding the data of several streams about to be read whole is fetched with one GET
# when at most this big (a broker taking many partitions over replays their MetaStreams)
PREFETCH_OBJECT_MAX = 16 << 20


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
    # appends whose payload was copied out of its request while their write was in flight
    # (``S3Storage.commit_now``), by base offset: the cache keeps these
    copied: dict[int, StreamRecordBatch] = field(default_factory=dict)


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
        self._owns_metadata = owns_metadata
        self._owns_store = owns_store
        self._streams: dict[int, _StreamState] = {}
        # appends submitted with a payload that is a view of its request, for commit_now to copy
        self._uncopied: list[tuple[_StreamState, StreamRecordBatch]] = []
        self._changed = asyncio.Event()  # replaced on every notification: see _notify
        self._closing = False
        self._failed: BaseException | None = None
        self.uploader = Uploader(self)
        # metadata that can no longer follow the store can commit no upload and check no
        # fence: appends stop (and a cluster's broker its heartbeats) as for a WAL failure
        metadata.add_failure_listener(self.fail)

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
        for attempt in range(1, START_ATTEMPTS + 1):
            node_epoch = await metadata.register_node(config.node_id)
            wal = await _open_wal(config, node_epoch, store)
            storage = cls(
                config, wal, metadata, store, node_epoch, owns_metadata=False, owns_store=False
            )
            try:
                await storage._recover()
            except BaseException as e:
                await storage.abort()  # the WAL keeps what recovery could not upload
                if attempt < START_ATTEMPTS and _epoch_expired(e, storage.failed):
                    # a controller took this node's WAL over meanwhile (its start outlasted a
                    # session): what it uploaded stays uploaded, the rest is replayed again
                    log.warning(
                        "node %d epoch %d: fenced while recovering its WAL; starting again",
                        config.node_id,
                        node_epoch,
                    )
                    continue
                if owns_store:
                    await store.close()
                if owns_metadata:
                    await metadata.close()
                raise
            storage._owns_store, storage._owns_metadata = owns_store, owns_metadata
            break
        storage.uploader.start()
        log.info(
            "S3Storage started: node %d epoch %d, WAL %s, objects %s",
            config.node_id,
            node_epoch,
            config.wal_path,
            config.object_store_url.split("?", 1)[0],
        )
        return storage

    async def recover_node_wal(self, node_id: int, epoch: int) -> bool:
        """Recover another node's object WAL on its behalf: the failover of a fenced broker,
        while its node epoch is still ``epoch`` (the fence's). False, with nothing done, when
        the node has registered again since: it is recovering its WAL itself.

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
        try:
            node_epoch = await self.metadata.register_node(node_id, replacing=epoch)
        except MetadataError as e:
            if e.code != ErrorCode.NODE_EPOCH_EXPIRED:
                raise
            log.info("node %d restarted: it recovers its WAL itself (%s)", node_id, e)
            return False
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
        return True

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
                stream_uploads = self.uploader.stream_uploads
                if stream_uploads:
                    await asyncio.wait(stream_uploads, timeout=deadline - time.monotonic())
                clean = not self.uploader.extracted
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
        self.metadata.remove_failure_listener(self.fail)
        self.notify()
        await self.uploader.stop()
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

    @property
    def closing(self) -> bool:
        return self._closing

    def notify(self) -> None:
        """Wake everything waiting for a change (uploads done, room freed, failure, close)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait until ``ready()`` holds; StreamClosedError if the storage fails or closes."""
        while not ready():
            if self._failed is not None:
                raise StorageFailedError(f"storage failed: {self._failed}")
            if self._closing:
                raise StreamClosedError("storage is closing")
            await self._changed.wait()

    def fail(self, error: BaseException) -> None:
        """Stop accepting writes: an error the write path cannot get past (WAL, metadata)."""
        if self._failed is None:
            self._failed = error
            log.critical("S3Storage failed; no more appends are accepted: %s", error)
        self._fail_waiting(StorageFailedError(f"storage failed: {error}"))
        self.notify()

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
        await self.uploader.upload_sealed()
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

    def has_room(self) -> bool:
        """Whether an append may start now: the data not yet in object storage is under
        ``s3.wal.cache.size`` and the WAL ring has space (else :meth:`wait_for_room`)."""
        return self.cache.unuploaded_size < self.config.wal_cache_size and self.wal.free_space > 0

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

        if not self.has_room():
            self.uploader.wake()
            try:
                await asyncio.wait_for(self.wait_until(room), timeout)
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
            self.fail(e)
            raise StorageFailedError(f"storage failed: {e}") from e
        state.inflight[done] = on_done
        if type(batch.payload) is not bytes and len(self._uncopied) < COPY_AHEAD_MAX:
            self._uncopied.append((state, batch))
        return done

    def commit_now(self) -> None:
        """Have the WAL commit the appends queued so far now (``WriteAheadLog.commit_now``: the
        caller, a connection about to wait, has nothing more to add), then, while that write is
        in flight, copy out of their requests the payloads the cache will keep as bytes: made
        as each append became durable, the copies would come between the write and its
        acknowledgements."""
        self.wal.commit_now()
        uncopied, self._uncopied = self._uncopied, []
        for state, batch in uncopied:
            if batch.base_offset >= state.confirmed:  # (not confirmed meanwhile)
                state.copied[batch.base_offset] = StreamRecordBatch(
                    batch.stream_id,
                    batch.epoch,
                    batch.base_offset,
                    batch.count,
                    bytes(batch.payload),
                )

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
            self.fail(durable.exception() or WALError("WAL write was cancelled"))
            return
        if done not in state.inflight:  # failed meanwhile (and settled then)
            return
        # (a caller that cancelled its future gave up waiting; the write is confirmed anyway,
        # or every later offset of the stream would wait behind it forever)
        result = durable.result()
        if batch.base_offset == state.confirmed and not state.waiting:
            # the usual case: the stream's next write, none held back
            self._confirm(state, batch, result.offset, result.next_offset, done, on_done)
        else:
            state.waiting[batch.base_offset] = _Durable(
                batch, result.offset, result.next_offset, done, on_done
            )
            while state.confirmed in state.waiting:
                r = state.waiting.pop(state.confirmed)
                self._confirm(state, r.batch, r.wal_offset, r.wal_next, r.done, r.on_done)
        self.uploader.on_cached()

    def _confirm(
        self,
        state: _StreamState,
        batch: StreamRecordBatch,
        wal_offset: int,
        wal_next: int,
        done: asyncio.Future[None],
        on_done: Callable[[], object] | None,
    ) -> None:
        """``batch``, the next offsets of its stream, is durable: into the cache, and its
        append returns."""
        if state.copied:
            batch = state.copied.pop(batch.base_offset, batch)
        self.cache.put(batch, wal_offset, wal_next)
        state.confirmed = batch.base_offset + batch.count
        del state.inflight[done]
        if not done.done():
            done.set_result(None)
        if on_done is not None:
            _call_listener(on_done, "durability")

    def wal_trim_point(self, fallback: int) -> int:
        """The WAL offset below which every durable record is in object storage."""
        point = self.cache.wal_trim_offset(fallback)
        for extracted in self.uploader.extracted:
            point = min(point, extracted.wal_start)
        for state in self._streams.values():
            for durable in state.waiting.values():
                point = min(point, durable.wal_offset)
        return point

    # -- uploads (storage.uploader) --------------------------------------------------------------

    async def force_upload(self) -> None:
        """Seal the cache now and return once everything appended so far is in object storage
        (streams' records taken out by ``upload_streams`` included)."""
        await self.uploader.force_upload()

    async def upload_streams(self, stream_ids: Collection[int]) -> None:
        """Upload what the cache holds of ``stream_ids`` now, in objects of their own, and return
        once it is committed (see :meth:`Uploader.upload_streams`)."""
        await self.uploader.upload_streams(stream_ids)

    @property
    def uploads(self) -> int:
        """Cache blocks uploaded and committed so far."""
        return self.uploader.uploads

    @property
    def upload_worker(self) -> UploadWorker:
        return self.uploader.upload_worker

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

    async def read_whole(
        self, stream_id: int, start: int, end: int, max_bytes: int, min_one: bool
    ) -> tuple[list[memoryview], int]:
        """The payloads of the batches from the one holding ``start``, whole, none starting at
        or after ``end``, while their bytes stay within ``max_bytes`` (the first however large
        when ``min_one``), and the offset after the last (``start`` if none): a fetch's read.
        From the LogCache when it holds ``start``, without a batch object per record (a fetch
        of small batches takes hundreds); else as :meth:`read` reads."""
        out: list[memoryview] = []
        hot = self.cache.read_whole(stream_id, start, end, max_bytes, min_one, out)
        if hot is not None:
            return out, hot[1]
        took: list[bytes | memoryview] = []
        taken = 0
        pos = start
        for batch in await self.read(stream_id, start, end, max(max_bytes, 1)):
            if batch.base_offset >= end:
                break
            size = len(batch.payload)
            if taken + size > max_bytes and (took or not min_one):
                break
            took.append(batch.payload)
            taken += size
            pos = batch.last_offset
        append_joined(out, took)
        return out, pos

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


def _epoch_expired(*errors: BaseException | None) -> bool:
    """Whether the node's epoch was taken over: a metadata change refused NODE_EPOCH_EXPIRED."""
    return any(
        isinstance(e, MetadataError) and e.code == ErrorCode.NODE_EPOCH_EXPIRED for e in errors
    )


async def _open_wal(config: S3StreamConfig, node_epoch: int, store: ObjectStore) -> WriteAheadLog:
    """This node's WAL at ``node_epoch``, as ``s3.wal.path`` says: objects or a local file."""
    if config.wal_object_store_url is not None:
        return await open_object_wal(config, node_epoch, store)
    os.makedirs(config.wal_path, exist_ok=True)
    return await FileWAL.open(
        os.path.join(config.wal_path, WAL_FILE),
        config.wal_capacity,
        node_id=config.node_id,
        init_zero=config.wal_init_zero,
        realtime_io=config.wal_io_realtime,
    )
