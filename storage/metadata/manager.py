"""MetadataManager: the controller the storage layer calls for stream, object, node and KV state.

Every change goes the same way: check the request against the image and make its records
(``control``, pure), persist the records in one transaction (``store``), then apply them to
the image. Changes run one at a time under a lock, so each is checked against the state the
previous one left. Reads are synchronous and come from the image.

With a store several brokers share, another broker may have committed since the image was last
brought up to date: the store then refuses the records, and the change is checked again against
the caught-up image. A follower task applies the others' changes as they are committed, so the
image trails the store by the time a notification takes (milliseconds). Listeners hear every
applied record list, this broker's and the others'. An entry this version cannot read (written by
a newer one) is never skipped: the image stops there, every change is refused from then on, and
the failure listeners hear it once (the storage then takes no more appends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from storage.metadata import control
from storage.metadata.image import MetadataImage
from storage.metadata.model import (
    CommitRange,
    CommitStreamObject,
    S3Object,
    S3ObjectMetadata,
    StreamMetadata,
)
from storage.metadata.record_codec import UnreadableEntryError
from storage.metadata.records import KVRecord, Record, RemoveKV
from storage.metadata.store import (
    Condition,
    MetadataFailedError,
    MetadataStore,
    SnapshotNeededError,
    StaleImageError,
    open_store,
)

log = logging.getLogger("automq.metadata")

Clock = Callable[[], int]
Records = list[Record]
Listener = Callable[[Sequence[Record]], None]
T = TypeVar("T")
# a change refused this many times in a row (others keep committing first) gives up
MAX_ATTEMPTS = 50
# stream opens requested in the same moment share one change, at most this many
OPEN_BATCH_MAX = 1000


class WallClock:
    """Wall-clock milliseconds that never go backwards, even if the system clock does."""

    def __init__(self) -> None:
        self._last = 0

    def __call__(self) -> int:
        self._last = max(self._last, time.time_ns() // 1_000_000)
        return self._last


@dataclass(slots=True)
class _Open:
    """A stream open waiting to be batched."""

    node_id: int
    node_epoch: int
    stream_id: int
    epoch: int
    done: asyncio.Future[None]
    opened: bool = False  # the change opened it (it was not open at this epoch before)


class MetadataManager:
    """The metadata controller: an image for reads over a durable store for changes."""

    def __init__(self, store: MetadataStore, image: MetadataImage, clock: Clock) -> None:
        self._store = store
        self.image = image
        self._clock = clock
        self._lock = asyncio.Lock()
        self._listeners: list[Listener] = []
        self._kv_listeners: list[tuple[str, Callable[[], None]]] = []
        self._follower: asyncio.Task[None] | None = None
        self._opens: list[_Open] = []  # waiting for the next batch
        self._opening: asyncio.Task[None] | None = None
        self._changed: asyncio.Future[None] | None = None  # done at the next applied change
        # a log entry this version cannot read: the image can never pass it
        self._failed: UnreadableEntryError | None = None
        self._failure_listeners: list[Callable[[BaseException], object]] = []
        # record lists applied since this process opened the store (DescribeQuorum's high
        # watermark: the store keeps no offset of its own)
        self.changes_applied = 0

    @classmethod
    async def open(cls, url: str, clock: Clock | None = None) -> MetadataManager:
        """Open the store at ``url`` (``sqlite:///abs/path.db``, ``sqlite://:memory:``,
        ``postgresql://USER@HOST:PORT/DB``)."""
        return await cls.from_store(await open_store(url), clock)

    @classmethod
    async def from_store(cls, store: MetadataStore, clock: Clock | None = None) -> MetadataManager:
        """Serve the metadata held by an already opened store."""
        try:
            image = await store.load()
        except BaseException:
            await store.close()
            raise
        manager = cls(store, image, clock if clock is not None else WallClock())
        manager._follower = asyncio.create_task(manager._follow(), name="metadata-follow")
        return manager

    async def close(self) -> None:
        """Close the store once the change in progress, if any, is done."""
        if self._opening is not None:
            with contextlib.suppress(Exception):
                await self._opening  # a batch of opens in progress ends as any change does
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        async with self._lock:
            await self._store.close()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(records)`` after each record list is applied to the image."""
        self._listeners.append(listener)

    @property
    def failed(self) -> BaseException | None:
        """Why the image stopped following the store, once it did: an entry (another broker's,
        written by a newer version, or damaged) this version cannot read. The image stays
        where it was, so every change is refused from then on."""
        return self._failed

    def add_failure_listener(self, listener: Callable[[BaseException], object]) -> None:
        """Call ``listener(error)`` once, when the image stops following the store."""
        self._failure_listeners.append(listener)

    def remove_failure_listener(self, listener: Callable[[BaseException], object]) -> None:
        """Stop calling ``listener`` (its owner is closed: not kept alive by this manager)."""
        with contextlib.suppress(ValueError):
            self._failure_listeners.remove(listener)

    def _fail(self, error: UnreadableEntryError) -> None:
        if self._failed is not None:
            return
        self._failed = error
        log.critical(
            "the metadata log holds an entry this broker cannot read, so its metadata can no "
            "longer follow the cluster's (upgrade it to the version that wrote the entry): %s",
            error,
        )
        for listener in self._failure_listeners:
            try:
                listener(error)
            except Exception:
                log.exception("metadata failure listener failed")

    def add_kv_listener(self, prefix: str, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after a record list that sets or removes a KV key starting with
        ``prefix`` is applied, and after the image is reloaded whole. Every KV listener shares
        one scan of each list."""
        if not self._kv_listeners:
            self._listeners.append(self._dispatch_kv)
        self._kv_listeners.append((prefix, listener))

    def _dispatch_kv(self, records: Sequence[Record]) -> None:
        if records:
            keys = [r.key for r in records if isinstance(r, (KVRecord, RemoveKV))]
            if not keys:
                return
        for prefix, listener in self._kv_listeners:
            if not records or any(k.startswith(prefix) for k in keys):
                listener()

    async def wait_for_change(self, timeout: float) -> None:
        """Return once the image next changes (this broker's change or another's), or after
        ``timeout`` seconds: what waits for some state (a stream closed by another broker)
        looks again then, rather than polling."""
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._changed), timeout)

    def _announce_change(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def catch_up(self) -> None:
        """Apply what other brokers committed until now (the follower does so by itself)."""
        async with self._lock:
            await self._catch_up_locked()

    async def change(
        self,
        plan: Callable[[MetadataImage], tuple[Records, T]],
        condition: Condition | None = None,
    ) -> T:
        """Make the change ``plan`` describes (a pure function of the image returning records
        and a result, raising to refuse), checked as every change here is: against the latest
        image, again after catching up if another broker committed first. With ``condition``
        (a shared store only) the records are persisted only while it holds, else
        ``ConditionFailedError``."""
        return await self._change(plan, condition)

    async def _change(
        self,
        plan: Callable[[MetadataImage], tuple[Records, T]],
        condition: Condition | None = None,
    ) -> T:
        """Check ``plan`` against the image, persist its records, apply them; when another
        broker committed first, catch up and check again.

        A caller cancelled once the records are on their way to the store does not stop the
        change: it goes on in a task of its own until the image has it. The store may have
        committed it (SQLite's commit runs on in its thread), and a change planned from an
        image without it would write rows back as they were before it (a stream's start
        offset below its trimmed objects, say). Cancelled before that, nothing is changed."""
        persisting = [False]
        change = asyncio.ensure_future(self._change_locked(plan, condition, persisting))
        try:
            return await asyncio.shield(change)
        except asyncio.CancelledError:
            if not persisting[0]:
                change.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(change)
            raise

    async def _change_locked(
        self,
        plan: Callable[[MetadataImage], tuple[Records, T]],
        condition: Condition | None,
        persisting: list[bool],
    ) -> T:
        async with self._lock:
            for _ in range(MAX_ATTEMPTS):
                if self._failed is not None:
                    raise _stopped(self._failed)
                records, result = plan(self.image)
                if not records:
                    return result
                persisting[0] = True
                try:
                    await self._store.persist(records, condition)
                except StaleImageError:
                    await self._catch_up_locked()
                    continue
                await self._applied([records])
                return result
            raise StaleImageError(f"metadata change refused {MAX_ATTEMPTS} times: gave up")

    async def _applied(self, entries: Sequence[Sequence[Record]]) -> None:
        """Apply persisted entries in order (the image only ever shows committed state), then
        write a snapshot if one is due: only here, once the image holds every entry the store
        has handed over, is it the state at the store's offset that labels the snapshot."""
        for records in entries:
            try:
                self.image.apply(records)
            except BaseException:
                # The store has the change but the image is half-changed: start over from it.
                await self._reload()
                raise
            self._tell(records)
        if self._store.snapshot_due():
            try:
                await self._store.write_snapshot(self.image)
            except Exception as e:  # a cost saved next start, not a change: retried later
                log.warning("metadata snapshot failed: %s", e)

    async def _reload(self) -> None:
        """Load the image anew from the store, and tell every listener (with no records:
        they rebuild what they derive from the image)."""
        try:
            image = await self._store.load()
        except UnreadableEntryError as e:
            self._fail(e)
            raise _stopped(e) from e
        self.image = image
        self._tell([])

    def _tell(self, records: Sequence[Record]) -> None:
        """Announce a change of the image and hand its records to every listener."""
        self.changes_applied += 1
        self._announce_change()
        for listener in self._listeners:
            try:
                listener(records)
            except Exception:
                log.exception("metadata listener failed")

    async def _catch_up_locked(self) -> None:
        if self._failed is not None:
            raise _stopped(self._failed)
        try:
            entries = await self._store.catch_up()
        except UnreadableEntryError as e:
            self._fail(e)
            raise _stopped(e) from e
        except SnapshotNeededError as e:
            log.info("metadata image reloaded: %s", e)
            await self._reload()
            return
        await self._applied(entries)

    async def _follow(self) -> None:
        """Apply the other brokers' changes as the store announces them."""
        while self._failed is None:
            await self._store.wait_for_change()
            try:
                async with self._lock:
                    await self._catch_up_locked()
            except MetadataFailedError:
                return  # told once, by ``_fail``: no entry after it can be applied
            except Exception as e:  # the store unreachable: its next announcement retries
                log.warning("following the metadata log: %s", e)
                await asyncio.sleep(1.0)

    # -- nodes -----------------------------------------------------------------------------------

    async def register_node(
        self, node_id: int, replacing: int | None = None, rejoining: int | None = None
    ) -> int:
        """Register a (re)starting node; return its new epoch (1 for a new node, else +1).
        ``replacing`` (a failover) or ``rejoining`` (the node itself, still running): only
        while the node's epoch is still that one, else ``NODE_EPOCH_EXPIRED``."""
        return await self._change(
            lambda image: control.register_node(image, node_id, replacing, rejoining)
        )

    # -- streams ---------------------------------------------------------------------------------

    async def create_stream(self, node_id: int, node_epoch: int) -> int:
        """Create a stream (CLOSED, epoch -1, offsets 0) and return its id."""
        return await self._change(lambda image: control.create_stream(image, node_id, node_epoch))

    async def create_open_streams(
        self, node_id: int, node_epoch: int, epoch: int, count: int = 1
    ) -> list[StreamMetadata]:
        """Create ``count`` streams and open them at ``epoch``, in one transaction."""
        ids = await self._change(
            lambda image: control.create_open_streams(image, node_id, node_epoch, epoch, count)
        )
        return [self.image.streams[i] for i in ids]

    async def create_named_stream(
        self, node_id: int, node_epoch: int, epoch: int, key: str, value_of: Callable[[int], bytes]
    ) -> StreamMetadata | None:
        """Create a stream open at ``epoch`` and set KV ``key`` to ``value_of(its id)`` in one
        transaction; None (nothing created) when ``key`` is already set."""
        stream_id = await self._change(
            lambda image: control.create_named_stream(
                image, node_id, node_epoch, epoch, key, value_of
            )
        )
        return None if stream_id is None else self.image.streams[stream_id]

    async def open_stream(
        self, node_id: int, node_epoch: int, stream_id: int, epoch: int
    ) -> StreamMetadata:
        """Open a stream at ``epoch`` on ``node_id`` (a newer epoch fences the previous owner).

        Opens requested in the same moment (a broker taking many partitions over) are checked
        one by one and persisted as one change: one round trip to the store for all of them."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = _Open(node_id, node_epoch, stream_id, epoch, done)
        self._opens.append(item)
        if self._opening is None:
            self._opening = asyncio.create_task(self._open_batches(), name="metadata-open-streams")
        try:
            await done
        except asyncio.CancelledError:
            if item.opened and not done.cancelled():
                # opened, then its caller cancelled before it resumed to learn so: no one
                # holds the stream, closed as the batch closes the opens cancelled in flight
                closing = asyncio.ensure_future(self._close_abandoned([item]))
                with contextlib.suppress(BaseException):
                    await asyncio.shield(closing)
            raise
        return self.image.streams[stream_id]

    async def _open_batches(self) -> None:
        try:
            await asyncio.sleep(0)  # let the opens of this moment join
            while self._opens:
                batch: list[_Open] = []
                later: list[_Open] = []
                ids: set[int] = set()
                for item in self._opens:
                    if item.stream_id in ids or len(batch) >= OPEN_BATCH_MAX:
                        later.append(item)  # a second open of one stream waits for the first
                    else:
                        ids.add(item.stream_id)
                        batch.append(item)
                self._opens = later
                await self._open_batch(batch)
        finally:
            self._opening = None

    async def _open_batch(self, batch: list[_Open]) -> None:
        opened: list[_Open] = []  # the items the change opens (not open before)

        def plan(image: MetadataImage) -> tuple[Records, list[Exception | None]]:
            records: list[Record] = []
            outcomes: list[Exception | None] = []
            opened.clear()
            for item in batch:
                if item.done.done():  # its caller was cancelled: opened, no one would close it
                    outcomes.append(None)
                    continue
                try:
                    opening = control.open_stream(
                        image, item.node_id, item.node_epoch, item.stream_id, item.epoch
                    )
                    outcomes.append(None)
                except Exception as e:  # refused: the others go on
                    outcomes.append(e)
                    continue
                records += opening
                if opening:
                    opened.append(item)
            return records, outcomes

        try:
            outcomes = await self._change(plan)
        except Exception as e:
            outcomes = [e] * len(batch)
            opened.clear()
        for item in opened:
            item.opened = True
        for item, outcome in zip(batch, outcomes, strict=True):
            if item.done.done():
                continue
            if outcome is None:
                item.done.set_result(None)
            else:
                item.done.set_exception(outcome)
        # callers cancelled while the change was in flight: no one holds what it opened for them
        await self._close_abandoned([item for item in opened if item.done.cancelled()])

    async def _close_abandoned(self, items: list[_Open]) -> None:
        for item in items:
            try:
                await self.close_stream(item.node_id, item.node_epoch, item.stream_id, item.epoch)
            except Exception as e:  # fenced meanwhile, or the store away: this node's next
                # restart or fencing closes it
                log.warning("closing stream %d, whose open was cancelled: %s", item.stream_id, e)

    async def close_stream(self, node_id: int, node_epoch: int, stream_id: int, epoch: int) -> None:
        """Close a stream this node owns at ``epoch``; closing a closed stream is a no-op."""
        await self._change(
            lambda image: (
                control.close_stream(image, node_id, node_epoch, stream_id, epoch),
                None,
            )
        )

    async def close_streams(
        self, node_id: int, node_epoch: int, streams: Sequence[tuple[int, int]]
    ) -> None:
        """Close these ``(stream_id, epoch)`` streams this node owns, in one transaction."""
        await self._change(
            lambda image: (control.close_streams(image, node_id, node_epoch, streams), None)
        )

    async def trim_stream(
        self, node_id: int, node_epoch: int, stream_id: int, epoch: int, new_start_offset: int
    ) -> None:
        """Raise the start offset; objects wholly below it are freed (MARK_DESTROYED)."""
        await self._change(
            lambda image: (
                control.trim_stream(
                    image, node_id, node_epoch, stream_id, epoch, new_start_offset, self._clock()
                ),
                None,
            )
        )

    async def delete_stream(
        self, node_id: int, node_epoch: int, stream_id: int, epoch: int
    ) -> None:
        """Delete a closed stream; its Stream Objects are freed and it leaves every SSO."""
        await self._change(
            lambda image: (
                control.delete_stream(image, node_id, node_epoch, stream_id, epoch, self._clock()),
                None,
            )
        )

    # -- objects ---------------------------------------------------------------------------------

    async def prepare_object(self, count: int, ttl_ms: int) -> int:
        """Reserve ``count`` consecutive object ids (PREPARED for ``ttl_ms``); return the first."""
        return await self._change(
            lambda image: control.prepare_object(image, count, ttl_ms, self._clock())
        )

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
        await self._change(
            lambda image: (
                control.commit_stream_set_object(
                    image,
                    node_id,
                    node_epoch,
                    object_id,
                    order_id,
                    object_size,
                    stream_ranges,
                    stream_objects,
                    compacted_object_ids,
                    self._clock(),
                ),
                None,
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
        await self._change(
            lambda image: (
                control.commit_stream_object(
                    image,
                    object_id,
                    stream_id,
                    stream_epoch,
                    start_offset,
                    end_offset,
                    object_size,
                    source_object_ids,
                    self._clock(),
                ),
                None,
            )
        )

    async def mark_destroyed_done(self, object_ids: Sequence[int]) -> None:
        """Forget these MARK_DESTROYED objects: they are deleted from object storage."""
        await self._change(lambda image: (control.mark_destroyed_done(image, object_ids), None))

    async def expire_prepared(self, now_ms: int | None = None) -> list[int]:
        """Mark PREPARED objects past their deadline MARK_DESTROYED; return their ids."""
        return await self._change(
            lambda image: control.expire_prepared(
                image, self._clock() if now_ms is None else now_ms
            )
        )

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
        await self._change(lambda _image: (control.put_kv(key, value), None))

    def get_kv(self, key: str) -> bytes | None:
        """The value of ``key``, or None."""
        return self.image.kv.get(key)

    def kv_keys(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, sorted."""
        return sorted(k for k in self.image.kv if k.startswith(prefix))

    async def delete_kv(self, key: str) -> None:
        """Drop ``key`` (no error if it is not set)."""
        await self._change(lambda image: (control.delete_kv(image, key), None))


def _stopped(reason: BaseException) -> MetadataFailedError:
    return MetadataFailedError(f"metadata stopped following: {reason}")
