"""Uploader: the LogCache's sealed blocks to object storage, committed in the WAL's order.

A sealed block becomes a Stream Set Object plus a Stream Object per large stream
(``storage.upload`` plans them); the upload worker (``storage.upload_worker``) builds and writes
the large ones from the WAL file, small ones are built here. Up to ``UPLOADS_IN_FLIGHT`` blocks
are written at once; their metadata commits, and the WAL's trims behind them, follow block
order. Uploads are paced at the rate their block filled, the pacing lifted once they fall
behind the appends. A stream handed to another node uploads its own records at once
(``upload_streams``). AutoMQ's ``DeltaWALUploadTask`` and the upload half of its S3Storage.

The :class:`~storage.s3_storage.S3Storage` it serves owns the WAL, the cache and the streams;
the uploader reads them, and tells the storage when an upload failed past retrying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storage.log_cache import LogCacheBlock
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    ErrorCode,
    MetadataError,
    StreamState,
)
from storage.object_format import object_key
from storage.operator.local import LocalObjectStore
from storage.stream_record_batch import StreamRecordBatch
from storage.upload import build_object, plan_upload
from storage.upload_worker import RunSpec, UploadWorker, WorkerSettings
from storage.wal import FileWAL

if TYPE_CHECKING:
    from storage.s3_storage import S3Storage

log = logging.getLogger("automq.storage")

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
# a commit refused for these streams drops their data from the upload instead of retrying
_UNWRITABLE = (ErrorCode.STREAM_FENCED, ErrorCode.STREAM_NOT_OPENED, ErrorCode.STREAM_NOT_EXIST)


class _BlockChanged(Exception):
    """Streams left a block while its objects were being written (a topic deleted, a stream
    closed or handed over): what was written no longer matches it, and it is staged again."""


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


class Uploader:
    """The uploads of one :class:`~storage.s3_storage.S3Storage`: started by :meth:`start`,
    woken by :meth:`wake` (or every ``s3.wal.upload.interval.ms``), stopped by :meth:`stop`."""

    def __init__(self, storage: S3Storage) -> None:
        self._storage = storage
        self._config = config = storage.config
        self._cache = storage.cache
        self._wal = wal = storage.wal
        self._metadata = storage.metadata
        self._store = store = storage.store
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
        self.uploads = 0  # blocks uploaded and committed
        self._wanted = asyncio.Event()
        self._worker_readied_for = -1  # the cache block that last had the upload worker started
        self._task: asyncio.Task[None] | None = None
        self._tasks: dict[int, asyncio.Task[None]] = {}  # by block id
        self._slots = asyncio.Semaphore(UPLOADS_IN_FLIGHT)
        # streams' records taken out of the cache to be uploaded on their own (upload_streams):
        # the WAL keeps them until they are committed
        self.extracted: list[LogCacheBlock] = []
        self.stream_uploads: set[asyncio.Task[None]] = set()
        self._unpaced_through = -1  # blocks up to this id upload at full speed (forced)
        # the objects the upload worker writes paced (forgotten once their pacing is lifted)
        self._paced_puts: set[int] = set()

    def start(self) -> None:
        """Upload the sealed blocks from now on, as they come."""
        self._task = asyncio.create_task(self._upload_loop(), name="s3storage-upload")
        self._task.add_done_callback(self._upload_loop_ended)

    async def stop(self) -> None:
        """Cancel every upload in progress (what they had not committed stays in the WAL) and
        stop the upload worker."""
        tasks = [t for t in (self._task, *self._tasks.values(), *self.stream_uploads) if t]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as e:  # the rest of the stop goes on
                log.warning("upload task %s had failed: %s", task.get_name(), e)
        await self.upload_worker.close()

    def wake(self) -> None:
        """Look for blocks to upload now (the appends wait for room)."""
        self._wanted.set()

    def on_cached(self) -> None:
        """Records entered the cache: seal its active block once it passes the upload
        threshold, and start the upload worker ahead of the block that will need it."""
        active = self._cache.active
        if active.size >= self._config.wal_upload_threshold:
            # seal now, so objects stay near the threshold however busy the uploads are
            self._cache.seal()
            self._wanted.set()
        elif (
            active.size >= self._config.wal_upload_threshold // 4
            and active.size > INLINE_OBJECT_MAX
            and active.block_id != self._worker_readied_for
        ):
            # an upload the worker builds is coming: its process starts now (a Python start,
            # ~0.1 s of CPU), not when the upload waits for it
            self._worker_readied_for = active.block_id
            self.upload_worker.prepare()

    async def upload_sealed(self) -> None:
        """Upload every sealed block, one after the other (recovery's, before the storage
        serves)."""
        previous: asyncio.Future[None] | None = None
        for block in self._cache.sealed_blocks():
            committed = asyncio.get_running_loop().create_future()
            await self.upload_in_order(block, previous, committed)
            previous = committed

    async def force_upload(self) -> None:
        """Seal the cache now and return once everything appended so far is in object storage
        (streams' records taken out by ``upload_streams`` included)."""
        stream_uploads = set(self.stream_uploads)
        block = self._cache.seal()
        sealed = self._cache.sealed_blocks()
        target = block.block_id if block is not None else (sealed[-1].block_id if sealed else -1)
        if target >= 0:
            self._unpaced_through = max(self._unpaced_through, target)
            self._lift_pacing()  # (that of later blocks too: they commit after these)
            self._wanted.set()
            await self._storage.wait_until(
                lambda: all(b.block_id > target for b in self._cache.sealed_blocks())
            )
        if stream_uploads:
            await asyncio.wait(stream_uploads)

    async def upload_streams(self, stream_ids: Collection[int]) -> None:
        """Upload what the cache holds of ``stream_ids`` now, in objects of their own, and return
        once it is committed. A stream handed to another node waits for its own tail only: the
        time a partition move leaves it unwritable does not grow with what the other streams
        have waiting for upload. The blocks they are taken from upload without them (one
        already being uploaded builds its objects again)."""
        block = self._cache.extract_streams(stream_ids)
        if block is None:
            return
        if block.size > STREAMS_INLINE_MAX:
            self.upload_worker.prepare()
        # a task of its own: the records are out of the cache, so a caller that stops waiting
        # must not stop their upload (close waits for it)
        upload = asyncio.create_task(self._upload_extracted(block), name="s3storage-upload-streams")
        self.stream_uploads.add(upload)
        upload.add_done_callback(self.stream_uploads.discard)
        await asyncio.shield(upload)

    async def _upload_extracted(self, block: LogCacheBlock) -> None:
        mine = [block]
        self.extracted.append(block)
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
                    if e.code is ErrorCode.NODE_EPOCH_EXPIRED and self._storage.rejoins_when_fenced:
                        log.warning(
                            "upload of %d streams' records waits for this node to "
                            "register again: %s",
                            len(block.records),
                            e,
                        )
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
                        continue
                    self._storage.fail(e)  # their records are nowhere else than in the WAL now
                    raise
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning(
                        "upload of %d streams' records failed, retrying in %.1fs: %s: %s",
                        len(block.records),
                        delay,
                        type(e).__name__,
                        e,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
        finally:
            self.extracted = [b for b in self.extracted if all(b is not m for m in mine)]
            self._storage.notify()

    def _without_committed(self, block: LogCacheBlock) -> LogCacheBlock:
        """``block`` without the records whose offsets the metadata already has committed."""
        rest = LogCacheBlock(-1)
        for stream_id in list(block.records):
            meta = self._metadata.stream(stream_id)
            if meta is not None:
                block.move_to(stream_id, rest, from_offset=meta.end_offset)
        rest.sealed = True
        rest.sealed_at = block.sealed_at
        rest.wal_start = block.wal_start  # the WAL keeps what the first block held
        self.extracted.append(rest)
        return rest

    def _upload_loop_ended(self, task: asyncio.Task[None]) -> None:
        """An upload loop that ended with an error leaves nothing to empty the WAL: the storage
        fails then (appends refused, the broker not ready), rather than stalling unseen once
        the WAL is full."""
        error = None if task.cancelled() else task.exception()
        if error is None:
            return
        log.error("the upload loop failed: %s", error, exc_info=error)
        self._storage.fail(error)

    async def _upload_loop(self) -> None:
        """Start one upload task per sealed block; each commits after the one before it."""
        interval = self._config.wal_upload_interval_ms / 1000
        previous: asyncio.Future[None] | None = None
        while not self._storage.closing and self._storage.failed is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), timeout=min(interval, 1.0))
            self._wanted.clear()
            self._lift_pacing_if_behind()
            active = self._cache.active
            # the ring filling while no upload is under way to free it (see _wal_filling)
            filling = self._wal_filling() and not self._cache.sealed_blocks()
            if active.records and (time.monotonic() - active.first_put_at >= interval or filling):
                self._cache.seal()
            elif filling:  # nothing to upload: records dropped from the cache fill the ring
                try:
                    point = self._storage.wal_trim_point(fallback=self._wal.next_offset)
                    await self._wal.trim(point)
                except Exception as e:  # (the next commit trims it)
                    log.warning("trimming the WAL failed: %s: %s", type(e).__name__, e)
            for block in self._cache.sealed_blocks():
                if block.block_id in self._tasks or self._storage.failed is not None:
                    continue
                committed = asyncio.get_running_loop().create_future()
                committed.add_done_callback(_retrieve)
                self._tasks[block.block_id] = asyncio.create_task(
                    self.upload_in_order(block, previous, committed),
                    name=f"s3storage-upload-{block.block_id}",
                )
                previous = committed

    def _wal_filling(self) -> bool:
        """Whether the WAL ring is three quarters full. Records of streams dropped from the
        cache (a deleted topic's) keep their room there until a block after them is committed,
        however small the active block stays; so the block is sealed then, as AutoMQ forces an
        upload when its WAL is over capacity, rather than after the upload interval, while the
        appends wait for room."""
        return self._wal.free_space < self._wal.capacity // 4

    async def upload_in_order(
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
                        async with self._slots:
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
                except _BlockChanged:
                    staged = None  # (the objects written stay PREPARED and expire)
                except asyncio.CancelledError:
                    raise
                except MetadataError as e:
                    if e.code is ErrorCode.NODE_EPOCH_EXPIRED and self._storage.rejoins_when_fenced:
                        log.warning(
                            "upload of cache block %d waits for this node to register again: %s",
                            block.block_id,
                            e,
                        )
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
                        continue
                    self._storage.fail(e)
                    raise
                except Exception as e:
                    log.warning(
                        "upload of cache block %d (%d bytes) failed, retrying in %.1fs: %s: %s",
                        block.block_id,
                        block.size,
                        delay,
                        type(e).__name__,
                        e,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 10.0)
            self.uploads += 1
            self._cache.mark_uploaded(block)
            try:
                await self._wal.trim(self._storage.wal_trim_point(fallback=block.wal_end))
            except Exception as e:
                # the block is committed: a trim not made only makes recovery read more (an
                # object WAL's epoch record whose PUT failed), and the next commit trims past
                # it; a WAL that failed fails the storage through its appends
                log.warning(
                    "trimming the WAL after cache block %d failed (the next commit trims it): "
                    "%s: %s",
                    block.block_id,
                    type(e).__name__,
                    e,
                )
            committed.set_result(None)
        except BaseException:
            committed.cancel()  # later blocks must not commit before this one
            raise
        finally:
            self._tasks.pop(block.block_id, None)
            self._storage.notify()

    async def _stage(self, block: LogCacheBlock) -> _Staged | None:
        """Reserve object ids and have the upload worker build and write the objects; None if
        there is nothing to upload."""
        revision = block.revision
        plan = plan_upload(block.records, self._config.stream_object_split_size, block.stream_sizes)
        if plan.object_count == 0:
            return None
        first_id = await self._metadata.prepare_object(
            plan.object_count, self._config.object_prepare_ttl_ms
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
                if block.revision != revision:
                    raise _BlockChanged
                sent += sum(block.stream_sizes[run[0].stream_id] for run in runs)
                put = asyncio.create_task(
                    self._put(oid, block, runs, sizes, paced), name=f"put-object-{oid}"
                )
                put.add_done_callback(lambda _: slots.release())
                puts.append(put)
            await asyncio.gather(*puts)
            if block.revision != revision:
                raise _BlockChanged
        except BaseException as e:
            for put in puts:
                put.cancel()
            await asyncio.gather(*puts, return_exceptions=True)
            if block.revision != revision and isinstance(e, Exception):
                raise _BlockChanged from e
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
            and not self._storage.closing
            and self._cache.unuploaded_size < self._config.wal_cache_size // 2
            and self._wal.free_space > self._config.wal_upload_threshold
        )

    async def _commit(self, block: LogCacheBlock, staged: _Staged | None) -> str:
        """Commit staged objects: "done", or "redo" when refused streams were dropped from
        ``block`` (the objects just written stay PREPARED and expire). Other metadata refusals
        raise; transient errors raise too and the same objects are committed again."""
        if staged is None:
            return "done"
        try:
            await self._metadata.commit_stream_set_object(
                self._config.node_id,
                self._storage.node_epoch,
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
            meta = self._metadata.stream(stream_id)
            if meta is None or meta.end_offset < end:
                return False
        return True

    def _drop_unwritable(self, block: LogCacheBlock) -> bool:
        """Drop from every unuploaded block the streams this node may no longer write: deleted,
        closed, or opened at a newer epoch or on another node."""
        dropped = []
        for stream_id in list(block.records):
            meta = self._metadata.stream(stream_id)
            if (
                meta is None
                or meta.state != StreamState.OPENED
                or meta.epoch > block.stream_epochs[stream_id]
                or meta.owner != self._config.node_id
            ):
                dropped.append(stream_id)
                self._storage.drop_stream(stream_id, block.stream_epochs[stream_id])
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
        key = object_key(self._config.namespace, object_id)
        size = sum(block.stream_sizes[run[0].stream_id] for run in runs)
        streams_own = block.block_id < 0 and block.size <= STREAMS_INLINE_MAX
        small = size < INLINE_OBJECT_MAX and (
            isinstance(self._store, LocalObjectStore) or not self.upload_worker.running
        )
        if small or streams_own or not isinstance(self._wal, FileWAL):
            built = build_object(runs, self._config.object_block_size)
            await self._store.put(key, built.parts)
            sizes[object_id] = built.size
            return
        specs = [RunSpec.of(run, block) for run in runs]
        if rate is not None:
            self._paced_puts.add(object_id)
        try:
            sizes[object_id] = await self.upload_worker.put(
                key, specs, self._config.object_block_size, rate
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
                self._cache.unuploaded_size >> 20,
                self._wal.free_space >> 20,
            )
            self._lift_pacing()

    def _lift_pacing(self) -> None:
        """The paced puts in progress go on at full speed."""
        if self._paced_puts:
            self.upload_worker.lift_pacing()
            self._paced_puts.clear()


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a future's exception as seen: its caller may have been cancelled."""
    if not future.cancelled():
        future.exception()
