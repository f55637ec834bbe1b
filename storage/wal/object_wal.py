"""A write-ahead log in object storage (``s3.wal.path=0@s3://BUCKET?...``): no local disk.

Appends submitted within ``s3.wal.object.batch.interval.ms`` of the first one of a batch (or
until the batch reaches ``s3.wal.object.batch.size``) are written together as one WAL object,
one PUT; up to ``s3.wal.object.max.inflight.uploads`` PUTs are in flight at once. An append is
acknowledged once its object is written *and* every earlier object is, so acknowledgements
follow WAL offsets exactly as the file WAL's do. Batches that wait for a PUT slot are merged (up
to the size cap) before they go.

Offsets count record bytes as in the file WAL (``storage.wal.record``'s 24-byte header plus the
body); an object holds ``[start, end)`` and the next one starts at ``end``. Formats, keys and the
epoch records are in ``storage.wal.wal_object``; which objects make the log, and the fencing of
older incarnations, in ``storage.wal.object_chain``.

Open: list the node's prefix, read the epoch records and the live objects, walk the chain from
the trim point, then write this incarnation's epoch record (start = where the recovered log
ends, trim = the recovered trim point) before any append: from then on, objects an older
incarnation of the node still writes at or after that offset are fenced. ``recover()`` then
yields what was read. Stale, fenced and never-acknowledged objects are deleted in the background.

Trim: the epoch record is rewritten with the new trim point first, then the objects wholly below
it are deleted in the background; a crash between the two leaves objects that recovery ignores
and the next trim deletes.

``capacity`` (``s3.wal.capacity``) bounds the record bytes between the trim point and the end
of everything submitted, as the file WAL's ring does: ``free_space`` falls as appends are
submitted and rises as uploads let the WAL trim, which is what S3Storage's backpressure and
upload pacing read.

Another node's WAL: :meth:`ObjectWAL.open_for_recovery` opens node ``node_id``'s log at a
fencing epoch, to replay and trim it without appending (the controller recovering a fenced
broker).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from storage.config import S3StreamConfig
from storage.operator import open_object_store
from storage.operator.base import ObjectNotFoundError, ObjectStore
from storage.wal import record
from storage.wal.errors import CorruptWALError, WALError
from storage.wal.interface import WALAppendResult, WALRecord, WALStats, spread
from storage.wal.object_chain import ChainWalk, ListedObject, RecoveryPlan, plan_recovery
from storage.wal.record import Buffer
from storage.wal.wal_object import (
    EpochRecord,
    ObjectRecord,
    decode_epoch_record,
    encode_epoch_record,
    encode_object_header,
    epoch_record_key,
    node_prefix,
    object_key,
    parse_epoch_record_key,
    parse_object_key,
)

logger = logging.getLogger(__name__)

DEFAULT_BATCH_INTERVAL_MS = 5
DEFAULT_BATCH_SIZE = 4 << 20
DEFAULT_MAX_INFLIGHT = 8
_FETCHES_IN_FLIGHT = 16  # objects read at once while recovering
# listings a recovery plans from while objects vanish under it (trimmed by another incarnation)
LOAD_ATTEMPTS = 5
_CLOSE_TIMEOUT_S = 30.0  # longest a close waits for the PUTs of appends already submitted
_TIMINGS_KEPT = 100_000

_K = typing.TypeVar("_K")
_T = typing.TypeVar("_T")

Body = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[WALAppendResult]
    on_done: Callable[[asyncio.Future[WALAppendResult]], object] | None
    offset: int
    next_offset: int
    submitted: float  # time.perf_counter() at submit


@dataclass(slots=True)
class _Batch:
    """Appends written as one WAL object ``[start, end)``."""

    start: int
    end: int
    buffers: list[Buffer] = field(default_factory=list)
    pendings: list[_Pending] = field(default_factory=list)
    written: bool = False
    error: WALError | None = None
    task: asyncio.Task[None] | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(slots=True, frozen=True)
class _Written:
    """A WAL object of the log, deleted once the trim point passes its end."""

    key: str
    start: int
    end: int


class ObjectWAL:
    """The write-ahead log as WAL objects of one node; see the module docstring."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        capacity: int,
        batch_interval_ms: int,
        batch_size: int,
        max_inflight: int,
        owns_store: bool,
        location: str,
        recover_only: bool,
    ) -> None:
        if capacity < 1 or batch_size < 1 or max_inflight < 1 or batch_interval_ms < 0:
            raise WALError(
                f"object WAL settings out of range: capacity {capacity}, batch size {batch_size},"
                f" in-flight uploads {max_inflight}, batch interval {batch_interval_ms} ms"
            )
        self._store = store
        self._namespace = namespace
        self._node_id = node_id
        self._epoch = node_epoch
        self._capacity = capacity
        self._interval = batch_interval_ms / 1000
        self._batch_size = batch_size
        self._max_inflight = max_inflight
        self._owns_store = owns_store
        self._location = location
        self._recover_only = recover_only
        self._loop = asyncio.get_running_loop()
        self._start = 0  # where this incarnation's log begins (its epoch record says so)
        self._trim = 0
        self._durable = 0  # the end of the acknowledged log
        self._assigned = 0  # the offset the next submitted record gets
        self._recovered: list[ObjectRecord] | None = None
        self._open_batch: _Batch | None = None
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        # see WriteAheadLog.after_acknowledgements
        self.after_acknowledgements: list[Callable[[], object]] = []
        self._sealed: collections.deque[_Batch] = collections.deque()  # waiting for a PUT slot
        self._writing: collections.deque[_Batch] = collections.deque()  # PUT issued, in order
        self._puts_in_flight = 0
        self._written: collections.deque[_Written] = collections.deque()
        self._shadowed: list[_Written] = []  # off the chain but overlapping it: go by their end
        self._garbage: list[str] = []  # deleted at once: stale, fenced, never acknowledged
        self._older_records: list[str] = []  # older epochs' records, kept until trim >= _start
        self._delete_wanted = asyncio.Event()
        self._deleter: asyncio.Task[None] | None = None
        self._trim_lock = asyncio.Lock()
        self._failed: WALError | None = None
        self._closing = False
        self._closed = False
        self._appends = 0
        self._puts = 0
        self._bytes = 0
        self._record_writes = 0
        self._put_times: collections.deque[float] = collections.deque(maxlen=_TIMINGS_KEPT)
        self._wait_times: collections.deque[float] = collections.deque(maxlen=_TIMINGS_KEPT)

    # --- opening --------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        store: ObjectStore,
        *,
        namespace: str,
        node_id: int,
        node_epoch: int,
        capacity: int,
        batch_interval_ms: int = DEFAULT_BATCH_INTERVAL_MS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        owns_store: bool = False,
        location: str | None = None,
        recover_only: bool = False,
    ) -> ObjectWAL:
        """Open node ``node_id``'s WAL as its incarnation ``node_epoch``: read what it holds
        after the trim point (``recover()`` yields it) and fence older incarnations.

        Raises ``WALError`` if an incarnation with a higher epoch has written the log already
        (this one is the stale one). ``owns_store``: ``close()`` closes ``store``.
        """
        wal = cls(
            store,
            namespace=namespace,
            node_id=node_id,
            node_epoch=node_epoch,
            capacity=capacity,
            batch_interval_ms=batch_interval_ms,
            batch_size=batch_size,
            max_inflight=max_inflight,
            owns_store=owns_store,
            location=location or f"{store!r}/{node_prefix(namespace, node_id)}",
            recover_only=recover_only,
        )
        try:
            await wal._load()
        except BaseException:
            if owns_store:
                await store.close()
            raise
        wal._deleter = asyncio.create_task(wal._delete_loop(), name=f"wal-delete:{node_id}")
        if wal._garbage:
            wal._delete_wanted.set()
        return wal

    @classmethod
    async def open_for_recovery(
        cls, store: ObjectStore, *, namespace: str, node_id: int, fence_epoch: int
    ) -> ObjectWAL:
        """Open another node's WAL to replay it: ``recover()``, upload what it yields, ``trim()``
        to ``next_offset``, ``close()``; appends are refused.

        ``fence_epoch`` must be above every epoch the node has written its WAL at (its fenced
        node epoch + 1) and at most the epoch it registers with next: objects the fenced
        incarnation still writes are then never replayed, while the node's next incarnation
        continues the log. Run it only while the node is fenced (not registered again).
        """
        return await cls.open(
            store,
            namespace=namespace,
            node_id=node_id,
            node_epoch=fence_epoch,
            capacity=1 << 62,
            recover_only=True,
        )

    async def _load(self) -> None:
        for attempt in range(1, LOAD_ATTEMPTS + 1):
            plan, record_keys = await self._plan()
            fetched = await self._gather(self._read_object, plan.live)
            vanished = [o.key for o, d in zip(plan.live, fetched, strict=True) if d is None]
            if not vanished or attempt == LOAD_ATTEMPTS:
                break
            # Deleted since the listing: another incarnation trimmed the log meanwhile (a
            # trim's epoch record lands before its deletes). Planned again from a new listing,
            # the log starts past them; walked as listed, it would end at the first one, and
            # every acknowledged object after it would be taken for never acknowledged.
            logger.info(
                "WAL %s: %d listed objects vanished while recovering (%s): listing again",
                self._location,
                len(vanished),
                vanished[0],
            )
        data = {o.key: d for o, d in zip(plan.live, fetched, strict=True) if d is not None}
        walk = ChainWalk(plan, self._node_id, data)
        self._recovered = list(walk.records())
        end = walk.end_offset
        for problem in walk.problems:
            logger.warning(
                "WAL %s: recovery cut the log at offset %d: %s", self._location, end, problem
            )
        self._start = self._durable = self._assigned = end
        self._trim = plan.trim_offset
        # this incarnation's record fences what older ones write from `end` on: before any
        # append, and before the objects past the end are deleted
        await self._write_epoch_record(plan.trim_offset)
        self._plan_deletes(plan, walk)
        logger.info(
            "WAL %s: node %d epoch %d recovered %d records in [%d, %d) from %d objects"
            "%s; %d objects to delete",
            self._location,
            self._node_id,
            self._epoch,
            len(self._recovered),
            plan.trim_offset,
            end,
            len(walk.chain),
            f" (cut: {'; '.join(walk.problems)})" if walk.problems else "",
            len(self._garbage),
        )
        self._older_records = [k for e, k in record_keys if e < self._epoch]

    async def _plan(self) -> tuple[RecoveryPlan, list[tuple[int, str]]]:
        """The node's objects and epoch records as listed now, planned; and the records' keys
        (epoch, key)."""
        prefix = node_prefix(self._namespace, self._node_id)
        objects: list[ListedObject] = []
        record_keys: list[tuple[int, str]] = []
        async for info in self._store.list(prefix):
            name = parse_object_key(prefix, info.key)
            if name is not None:
                objects.append(ListedObject(info.key, name.start_offset, name.epoch, info.size))
                continue
            epoch = parse_epoch_record_key(prefix, info.key)
            if epoch is not None:
                record_keys.append((epoch, info.key))
            else:
                logger.warning("WAL %s: ignoring unexpected object %s", self._location, info.key)
        found = await self._gather(self._read_record, [epoch for epoch, _ in record_keys])
        plan = plan_recovery(objects, [r for r in found if r is not None])
        if plan.newest_epoch > self._epoch:
            raise WALError(
                f"WAL {self._location}: written at node epoch {plan.newest_epoch}, newer than"
                f" this incarnation's {self._epoch}: a newer incarnation of node"
                f" {self._node_id} owns it"
            )
        return plan, record_keys

    def _plan_deletes(self, plan: RecoveryPlan, walk: ChainWalk) -> None:
        chain = {o.key for o in walk.chain}
        self._written.extend(_Written(o.key, o.start_offset, o.end_offset) for o in walk.chain)
        past = {o.key for o in plan.past(walk.end_offset, walk.chain)}
        for obj in plan.live:
            if obj.key not in chain and obj.key not in past:
                self._shadowed.append(_Written(obj.key, obj.start_offset, obj.end_offset))
        self._garbage = [o.key for o in (*plan.stale, *plan.fenced)] + sorted(past)

    async def _gather(self, read: Callable[[_K], Awaitable[_T]], items: Sequence[_K]) -> list[_T]:
        """``read`` of every item, at most ``_FETCHES_IN_FLIGHT`` at once, in item order."""
        slots = asyncio.Semaphore(_FETCHES_IN_FLIGHT)

        async def one(item: _K) -> _T:
            async with slots:
                return await read(item)

        return list(await asyncio.gather(*(one(item) for item in items)))

    async def _read_record(self, epoch: int) -> EpochRecord | None:
        key = epoch_record_key(self._namespace, self._node_id, epoch)
        try:
            found = decode_epoch_record(await self._store.get(key))
        except ObjectNotFoundError:
            return None
        except CorruptWALError as exc:
            logger.warning("WAL %s: ignoring epoch record %s: %s", self._location, key, exc)
            return None
        if (found.node_id, found.epoch) != (self._node_id, epoch):
            logger.warning(
                "WAL %s: ignoring epoch record %s: it says node %d epoch %d",
                self._location,
                key,
                found.node_id,
                found.epoch,
            )
            return None
        return found

    async def _read_object(self, obj: ListedObject) -> bytes | None:
        try:
            return await self._store.get(obj.key)
        except ObjectNotFoundError:
            return None

    async def _write_epoch_record(self, trim: int) -> None:
        rec = EpochRecord(self._node_id, self._epoch, self._start, trim)
        await self._store.put(
            epoch_record_key(self._namespace, self._node_id, self._epoch), encode_epoch_record(rec)
        )
        self._record_writes += 1

    # --- what S3Storage reads ---------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._location

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def node_epoch(self) -> int:
        return self._epoch

    @property
    def trim_offset(self) -> int:
        """Records before this offset are in object storage; recovery starts here."""
        return self._trim

    @property
    def next_offset(self) -> int:
        """The end of the acknowledged log."""
        return self._durable

    @property
    def free_space(self) -> int:
        """Capacity neither live (after the trim point) nor taken by appends in flight."""
        return self._trim + self._capacity - self._assigned

    @property
    def stats(self) -> WALStats:
        """Acknowledged appends, WAL object PUTs (the ``fsyncs`` of a file WAL), bytes of WAL
        objects and epoch record writes (``header_writes``)."""
        return WALStats(self._appends, self._puts, self._bytes, self._record_writes)

    def latency_samples(self) -> dict[str, Sequence[float]]:
        """The recent samples (seconds, oldest first; not copies) of ``append`` (submitted
        to acknowledged) and ``sync`` (a WAL object's PUT)."""
        return {"append": self._wait_times, "sync": self._put_times}

    def timing_summary(self) -> str:
        """p50, p99 and max of the recent WAL object PUTs and of the appends' waits until
        acknowledged."""
        if not self._put_times:
            return "no WAL objects written"

        return (
            f"{len(self._put_times)} WAL objects: PUT {spread(self._put_times)};"
            f" {len(self._wait_times)} appends: acknowledged {spread(self._wait_times)}"
        )

    # --- recovery -------------------------------------------------------------------------

    def recover(self) -> Iterator[WALRecord]:
        """Yield every record from the trim point on, in order (read when the WAL opened).

        Runs once; appends may come before it (they continue after the recovered log)."""
        self._check_open()
        records, self._recovered = self._recovered, None
        if records is None:
            raise WALError(f"WAL {self._location}: recover() runs once")
        for rec in records:
            yield WALRecord(rec.offset, rec.next_offset, rec.body)

    # --- appends --------------------------------------------------------------------------

    async def append(self, body: Body) -> WALAppendResult:
        """Append one record; returns once it and every earlier record are durable."""
        return await self.submit(body)

    def submit(
        self,
        body: Body,
        on_done: Callable[[asyncio.Future[WALAppendResult]], object] | None = None,
    ) -> asyncio.Future[WALAppendResult]:
        """Queue one record now and return the future of its acknowledgement; ``on_done(future)``
        runs as soon as it is done (unless the caller cancelled it). The buffers are not copied:
        do not mutate them until then. A cancelled append is still written, unacknowledged."""
        self._check_open()
        if self._recover_only:
            raise WALError(f"WAL {self._location} is open for recovery only")
        if self._closing:
            raise WALError(f"WAL {self._location} is closing")
        parts = [body] if isinstance(body, bytes | bytearray | memoryview) else list(body)
        length = sum(memoryview(part).nbytes for part in parts)
        size = record.record_size(length)
        if size > self._capacity:
            raise WALError(
                f"record of {size} bytes (header included) is larger than"
                f" the WAL capacity {self._capacity} (s3.wal.capacity)"
            )
        offset = self._assigned
        self._assigned += size
        future: asyncio.Future[WALAppendResult] = self._loop.create_future()
        pending = _Pending(future, on_done, offset, offset + size, time.perf_counter())
        batch = self._open_batch
        if batch is None:
            batch = self._open_batch = _Batch(offset, offset)
            if self._interval > 0:
                self._timer = self._loop.call_later(self._interval, self._seal)
            else:
                self._timer = self._loop.call_soon(self._seal)
        batch.buffers.extend(record.encode(offset, parts))
        batch.pendings.append(pending)
        batch.end = offset + size
        if batch.size >= self._batch_size:
            self._seal()
        return future

    def _seal(self) -> None:
        """Close the open batch: it is written as soon as a PUT slot is free."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._open_batch = self._open_batch, None
        if batch is not None:
            self._sealed.append(batch)
            self._pump()

    def _pump(self) -> None:
        """Start a PUT for each sealed batch a slot is free for; batches that waited for a slot
        are merged (up to the size cap) into one object."""
        while self._sealed and self._puts_in_flight < self._max_inflight and not self._failed:
            batch = self._sealed.popleft()
            while self._sealed and batch.size + self._sealed[0].size <= self._batch_size:
                later = self._sealed.popleft()
                batch.buffers.extend(later.buffers)
                batch.pendings.extend(later.pendings)
                batch.end = later.end
            self._puts_in_flight += 1
            self._writing.append(batch)
            batch.task = self._loop.create_task(
                self._write(batch), name=f"wal-put:{self._node_id}:{batch.start}"
            )

    async def _write(self, batch: _Batch) -> None:
        key = object_key(self._namespace, self._node_id, batch.start, self._epoch)
        header = encode_object_header(self._node_id, self._epoch, batch.start, batch.size)
        started = time.perf_counter()
        try:
            await self._store.put(key, [header, *batch.buffers])
        except asyncio.CancelledError:
            batch.error = WALError(f"WAL {self._location} closed before {key} was written")
        except Exception as exc:
            batch.error = WALError(
                f"WAL {self._location}: writing {key} (offsets [{batch.start}, {batch.end}))"
                f" failed; the WAL accepts no more appends: {exc!r}"
            )
            batch.error.__cause__ = exc
        else:
            batch.written = True
            self._put_times.append(time.perf_counter() - started)
            self._puts += 1
            self._bytes += len(header) + batch.size
        finally:
            self._puts_in_flight -= 1
            self._acknowledge()
            self._pump()

    def _acknowledge(self) -> None:
        """Acknowledge the written batches at the head of the log, in offset order; a failed
        one fails itself and everything after it."""
        while self._writing and (self._writing[0].written or self._writing[0].error):
            batch = self._writing.popleft()
            if batch.error is not None:
                self._enter_failed(batch.error, batch)
                return
            self._durable = batch.end
            self._written.append(
                _Written(
                    object_key(self._namespace, self._node_id, batch.start, self._epoch),
                    batch.start,
                    batch.end,
                )
            )
            now = time.perf_counter()
            for pending in batch.pendings:
                self._finish(pending, None, now)
            for listener in self.after_acknowledgements:
                try:
                    listener()
                except Exception:
                    logger.exception("WAL %s: an acknowledgement listener failed", self._location)

    def acknowledge_completed(self) -> None:
        """(Uploads are acknowledged as their tasks finish.)"""

    def commit_now(self) -> None:
        """(Batches are sealed by their interval, not by the caller.)"""

    def _finish(self, pending: _Pending, failure: WALError | None, now: float) -> None:
        future = pending.future
        if future.done():  # cancelled by its caller
            return
        if failure is None:
            self._appends += 1
            self._wait_times.append(now - pending.submitted)
            future.set_result(WALAppendResult(pending.offset, pending.next_offset))
        else:
            future.set_exception(failure)
        if pending.on_done is not None:
            try:
                pending.on_done(future)
            except Exception:  # as the loop does for a failing callback: log, go on
                logger.exception("WAL %s: a completion callback failed", self._location)

    def _enter_failed(self, failure: WALError, first: _Batch | None = None) -> None:
        """Fail ``first`` and every batch after it, and every later append."""
        if self._failed is None:
            self._failed = failure
            if not self._closing:
                logger.error("WAL %s failed: %s", self._location, failure)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batches = [b for b in (first, *self._writing, *self._sealed, self._open_batch) if b]
        self._writing.clear()
        self._sealed.clear()
        self._open_batch = None
        now = time.perf_counter()
        for batch in batches:
            for pending in batch.pendings:
                self._finish(pending, failure, now)

    def _check_open(self) -> None:
        if self._closed:
            raise WALError(f"WAL {self._location} is closed")
        if self._failed is not None:
            raise WALError(
                f"WAL {self._location} is in a failed state after an earlier write error"
            ) from self._failed

    # --- trim -----------------------------------------------------------------------------

    async def trim(self, offset: int) -> None:
        """Let recovery start at ``offset`` (a record boundary at or before ``next_offset``),
        durably (the epoch record is written before this returns); the objects wholly before
        it are deleted in the background. A lower offset than the trim point is ignored."""
        self._check_open()
        if offset > self._durable:
            raise WALError(f"cannot trim to {offset}: the log ends at {self._durable}")
        async with self._trim_lock:
            if offset <= self._trim:
                return
            try:
                await self._write_epoch_record(offset)
            except Exception as exc:
                raise WALError(f"WAL {self._location}: trim to {offset} failed: {exc!r}") from exc
            self._trim = offset
        self._delete_wanted.set()

    async def _delete_loop(self) -> None:
        while True:
            await self._delete_wanted.wait()
            self._delete_wanted.clear()
            await self._delete_pass()

    async def _delete_pass(self) -> None:
        """Delete what the trim point has passed, and the garbage recovery found."""
        keys, self._garbage = self._garbage, []
        while self._written and self._written[0].end <= self._trim:
            keys.append(self._written.popleft().key)
        passed = [w for w in self._shadowed if w.end <= self._trim]
        if passed:
            self._shadowed = [w for w in self._shadowed if w.end > self._trim]
            keys.extend(w.key for w in passed)
        if self._trim >= self._start and self._older_records:
            # older incarnations' records fence nothing the trim point has not passed
            keys.extend(self._older_records)
            self._older_records = []
        if not keys:
            return
        try:
            await self._store.delete(keys)
        except Exception as exc:  # the next recovery finds them stale and deletes them
            logger.warning(
                "WAL %s: deleting %d trimmed objects failed: %r", self._location, len(keys), exc
            )

    # --- close ----------------------------------------------------------------------------

    async def close(self, *, clean: bool = True) -> None:
        """Write and acknowledge the appends already submitted (for at most 30 s; then they
        fail), delete what the trim point has passed, and close the store if this WAL owns it.

        ``clean`` changes nothing here: an object WAL has no shutdown state to record (after a
        crash, recovery reads the same objects as after a clean close)."""
        if self._closing or self._closed:
            return
        self._closing = True
        try:
            self._seal()
            deadline = self._loop.time() + _CLOSE_TIMEOUT_S
            while self._writing and self._failed is None:
                tasks = [b.task for b in self._writing if b.task is not None]
                remaining = deadline - self._loop.time()
                if not tasks or remaining <= 0:
                    break
                await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            unfinished = [b.task for b in self._writing if b.task is not None]
            for task in unfinished:
                task.cancel()
            for task in unfinished:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._writing or self._sealed or self._open_batch is not None:
                self._enter_failed(WALError(f"WAL {self._location} closed"))
            if self._deleter is not None:
                self._deleter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._deleter
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._delete_pass(), _CLOSE_TIMEOUT_S)
            logger.info("WAL %s: %s", self._location, self.timing_summary())
        finally:
            self._closed = True
            if self._owns_store:
                await self._store.close()


async def open_object_wal(
    config: S3StreamConfig, node_epoch: int, data_store: ObjectStore
) -> ObjectWAL:
    """Open this node's object WAL as ``s3.wal.path`` names it: on ``data_store`` when it is
    the data bucket (one client for both), else on a store of its own."""
    url = config.wal_object_store_url
    if url is None:
        raise WALError(f"s3.wal.path {config.wal_path!r} names a directory, not a bucket")
    if url == config.object_store_url:
        store, owns = data_store, False
    else:
        store = open_object_store(
            url,
            part_size=config.object_part_size,
            max_concurrency=config.max_concurrent_requests,
            retry_timeout_s=config.request_retry_timeout_ms / 1000,
        )
        await store.connect()
        owns = True
    return await ObjectWAL.open(
        store,
        namespace=config.namespace,
        node_id=config.node_id,
        node_epoch=node_epoch,
        capacity=config.wal_capacity,
        batch_interval_ms=config.wal_object_batch_interval_ms,
        batch_size=config.wal_object_batch_size,
        max_inflight=config.wal_object_max_inflight_uploads,
        owns_store=owns,
        location=config.wal_path.split("?", 1)[0],
    )
