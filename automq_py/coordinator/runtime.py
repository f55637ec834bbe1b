"""CoordinatorRuntime: a coordinator's state kept in the partitions of an internal topic.

Kafka's group and transaction coordinators work the same way, and so do ours: every state
change is a record appended to the partition of the internal topic (``__consumer_offsets``,
``__transaction_state``) that owns the key it is about, answered once durable; on start each
partition is read back from its log start to its high watermark and every record replayed into
the coordinator's memory. This module is that shared part:

* the topic, created on first use (FindCoordinator, or the first request that needs it) with
  the coordinator's partition count and configs, as Kafka does;
* placement: a key lives in partition ``abs(javaHashCode(key)) % partitions``
  (:func:`partition_for`);
* loading: each partition read back and handed to the coordinator batch by batch (the batch
  header says whether a batch is a transactional one or a transaction marker, which offsets
  committed inside transactions need); until its partition is loaded a key's requests are
  answered COORDINATOR_LOAD_IN_PROGRESS (:meth:`CoordinatorRuntime.ready`), except while a
  topic created here loads: its partitions are empty, and a request waits for its own;
* appends: records (key bytes, value bytes or ``None`` for a tombstone) written durably into a
  key's partition, with the error code a coordinator answers when that fails.

The coordinator itself (what the records mean, how requests change them) stays in its own
module and gives the runtime a :class:`Replayer`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from automq_py.partition import Partition
from automq_py.replica_manager import ReplicaManager
from automq_py.topics import TopicError, TopicInfo, TopicRegistry
from protocol import record_batch
from protocol.errors import ErrorCode
from protocol.record_batch import InvalidRecordBatchError, RecordBatchHeader
from protocol.records import Record, RecordInput, build_batch, parse_records

log = logging.getLogger("automq.coordinator")

LOAD_READ_BYTES = 1 << 20
LOAD_RETRY_S = 1.0  # a partition that failed to load is tried again after this
LOAD_WAIT_S = 2.0  # how long a request waits for its partition's load under way


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    raw = text.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + ((raw[i] << 8) | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitions``: where a group id or a transactional
    id lives in its coordinator's topic."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


def _load_failed(topic: TopicInfo, index: int, error: Exception) -> None:
    log.warning(
        "loading %s-%d failed, retrying in %g s: %s", topic.name, index, LOAD_RETRY_S, error
    )


class Replayer(Protocol):
    """What a coordinator gives the runtime to rebuild its state from its topic."""

    def replay_batch(
        self, partition: int, header: RecordBatchHeader, records: Sequence[Record]
    ) -> None:
        """Apply one batch read back from ``partition`` (records before the load's start
        offset already dropped)."""

    def partition_loaded(self, partition: int) -> None:
        """Every record of ``partition`` has been replayed."""

    def partition_unloaded(self, partition: int) -> None:
        """``partition`` is led by another broker now: forget its keys' state."""


class CoordinatorRuntime:
    """The internal topic of one coordinator: creation, placement, loading and appends."""

    def __init__(
        self,
        topic_name: str,
        partitions: int,
        topic_configs: dict[str, str],
        topics: TopicRegistry,
        replicas: ReplicaManager,
        replayer: Replayer,
    ) -> None:
        self.topic_name = topic_name
        self.partitions = partitions  # used when the topic is created here
        self.topic_configs = topic_configs
        self.topics = topics
        self.replicas = replicas
        self.replayer = replayer
        self._topic: TopicInfo | None = None
        self._loaded: set[int] = set()
        self._loading: set[int] = set()
        self._load_tasks: dict[int, asyncio.Task[Any]] = {}  # partition -> its load under way
        # a topic created here loads one partition at a time, the ones requests wait for first
        self._new_load: asyncio.Task[Any] | None = None
        self._load_waiters: dict[int, asyncio.Future[None]] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopped = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start loading every partition of the topic, if it exists already."""
        topic = self.topics.get(self.topic_name)
        if topic is not None:
            self._topic = topic
            self._load_in_background(topic)

    async def stop(self) -> None:
        """Requests get COORDINATOR_NOT_AVAILABLE from now on; loads and the coordinator's
        other background work (:meth:`spawn`) are cancelled and waited for."""
        self._stopped = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _load_in_background(self, topic: TopicInfo) -> None:
        for index in range(topic.partitions):
            if self.leads(index) and index not in self._loading:
                task = self.spawn(
                    self._load_retrying(topic, index), f"loading {topic.name}-{index}"
                )
                self._load_tasks[index] = task
                task.add_done_callback(functools.partial(self._load_ended, index))

    def _load_ended(self, index: int, task: asyncio.Task[Any]) -> None:
        if self._load_tasks.get(index) is task:
            del self._load_tasks[index]

    async def _wait_for_loads(self, indexes: Sequence[int]) -> None:
        """Wait up to ``LOAD_WAIT_S`` for the loads under way of partitions ``indexes``."""
        tasks = [self._load_tasks[i] for i in indexes if i in self._load_tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=LOAD_WAIT_S)

    async def _load_retrying(self, topic: TopicInfo, index: int) -> None:
        """Load partition ``index``, again every ``LOAD_RETRY_S`` after a failure while this
        broker leads it (its keys' requests get COORDINATOR_LOAD_IN_PROGRESS meanwhile): a
        previous leader slow to hand it over, or the object store down while it is read."""
        while True:
            try:
                await self._load_partition(topic, index)
                return
            except Exception as e:
                if self._stopped or not self.leads(index):
                    return  # stopping, or led elsewhere now: not ours to load
                _load_failed(topic, index, e)
            self._loading.add(index)  # not started again by a leader change meanwhile
            try:
                await asyncio.sleep(LOAD_RETRY_S)
            finally:
                self._loading.discard(index)
            if self._stopped or not self.leads(index) or index in self._loaded:
                return

    def leads(self, index: int) -> bool:
        """Whether this broker leads partition ``index`` of the topic (coordinates its keys)."""
        return self.replicas.leader_epoch(self.topic_name, index) is not None

    def leaders_changed(self, topics: set[str]) -> None:
        """Load the partitions this broker now leads, unload the ones it no longer does (a
        cluster's leadership moved)."""
        topic = self._topic
        if self.topic_name not in topics or topic is None or self._stopped:
            return
        for index in sorted(self._loaded):
            if not self.leads(index):
                self._unload(index)
        self._load_in_background(topic)

    def _unload(self, index: int) -> None:
        self._loaded.discard(index)
        self.replayer.partition_unloaded(index)
        log.info("unloaded %s-%d: led by another broker", self.topic_name, index)

    def spawn(self, coro: Coroutine[Any, Any, object], what: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background until it ends or :meth:`stop`; a failure is
        logged with ``what`` it was doing. After :meth:`stop` it is cancelled at once."""
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        if self._stopped:
            task.cancel()
        self._tasks.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("%s failed", what, exc_info=task.exception())

        task.add_done_callback(done)
        return task

    async def _load_new(self, topic: TopicInfo) -> None:
        """Load a topic just created: one partition at a time, so that the metadata
        transactions that create its streams leave room for other requests' (a partition
        opened by a Fetch meanwhile waits for one of them, not for all), and the partitions
        requests are waiting for first (:meth:`_loaded_new`)."""
        pending = dict.fromkeys(i for i in range(topic.partitions) if self.leads(i))
        retry_at: dict[int, float] = {}  # partitions that failed, and when to try them again
        try:
            while pending:
                now = time.monotonic()
                ready = [i for i in pending if retry_at.get(i, 0.0) <= now]
                if not ready:
                    await asyncio.sleep(min(retry_at[i] for i in pending) - now)
                    continue
                index = next((i for i in self._load_waiters if i in ready), ready[0])
                if not self.leads(index):  # moved to another broker meanwhile
                    del pending[index]
                    continue
                try:
                    await self._load_partition(topic, index)
                    del pending[index]
                except Exception as e:  # its requests get LOAD_IN_PROGRESS meanwhile
                    _load_failed(topic, index, e)
                    retry_at[index] = time.monotonic() + LOAD_RETRY_S
                waiter = self._load_waiters.pop(index, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
        finally:
            for waiter in self._load_waiters.values():
                if not waiter.done():
                    waiter.set_result(None)
            self._load_waiters.clear()

    async def _loaded_new(self, index: int) -> None:
        """While a topic created here loads: have partition ``index`` loaded next and wait
        for it (a few ms: a new partition is empty)."""
        task = self._new_load
        if task is None or task.done() or index in self._loaded:
            return
        waiter = self._load_waiters.get(index)
        if waiter is None:
            waiter = self._load_waiters[index] = asyncio.get_running_loop().create_future()
        # the task too: cancelled before it ran (a stop), it resolves no waiter
        await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)

    # --- the topic ---------------------------------------------------------------------------

    async def topic(self) -> TopicInfo:
        """The topic, created on first use (its partitions then load in the background,
        those that requests wait for first)."""
        if self._topic is not None:
            return self._topic
        async with self._lock:
            if self._topic is None:
                topic = self.topics.get(self.topic_name)
                if topic is None:
                    try:
                        topic = await self.topics.create(
                            self.topic_name, self.partitions, self.topic_configs
                        )
                        log.info("created %s with %d partitions", self.topic_name, topic.partitions)
                    except TopicError:
                        topic = self.topics.get(self.topic_name)
                        if topic is None:
                            raise
                    # a new topic is empty: a request for a key waits for its partition only
                    self._new_load = self.spawn(self._load_new(topic), f"loading {topic.name}")
                else:
                    self._load_in_background(topic)
                self._topic = topic
            return self._topic

    async def ensure_topic(self) -> ErrorCode:
        """Make sure the topic exists (FindCoordinator): NONE or COORDINATOR_NOT_AVAILABLE."""
        try:
            await self.topic()
        except Exception as e:
            log.warning("cannot create %s: %s", self.topic_name, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE

    async def ready(self, key: str) -> ErrorCode:
        """NONE when ``key``'s partition is loaded; else the error to answer with."""
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            topic = await self.topic()
        except Exception as e:
            log.warning("cannot create %s: %s", self.topic_name, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        index = partition_for(key, topic.partitions)
        if not self.leads(index):
            return ErrorCode.NOT_COORDINATOR
        await self._loaded_new(index)
        if index not in self._loaded:
            await self._wait_for_loads([index])
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if not self.leads(index):
            return ErrorCode.NOT_COORDINATOR
        if index not in self._loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    async def all_ready(self) -> ErrorCode:
        """NONE when every partition is loaded (for requests that list every key)."""
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            topic = await self.topic()
        except Exception:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._new_load is not None and not self._new_load.done():
            await asyncio.wait([self._new_load])  # a topic created here: every partition soon
        await self._wait_for_loads(
            [i for i in range(topic.partitions) if self.leads(i) and i not in self._loaded]
        )
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if any(i not in self._loaded for i in range(topic.partitions) if self.leads(i)):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    @property
    def topic_info(self) -> TopicInfo | None:
        """The topic once it exists (created or found), else None."""
        return self._topic or self.topics.get(self.topic_name)

    def coordinator_of(self, key: str) -> int:
        """The node id of the broker leading ``key``'s partition (the topic must exist)."""
        assert self._topic is not None
        index = partition_for(key, self._topic.partitions)
        cluster = self.replicas.cluster
        if cluster is None:
            return self.replicas.storage.node_id
        return cluster.leadership(self.topic_name, index).leader

    def coordinates(self, key: str) -> bool:
        """Whether this broker leads the partition of ``key`` now (a record just written for
        it, once unloaded, is the new leader's to load: not kept here)."""
        topic = self._topic
        return topic is None or self.leads(partition_for(key, topic.partitions))

    def owns(self, key: str, partition: int) -> bool:
        """Whether ``key`` lives in ``partition`` (the topic must exist)."""
        assert self._topic is not None
        return partition_for(key, self._topic.partitions) == partition

    async def partition(self, key: str) -> Partition:
        """The partition that holds ``key``."""
        topic = await self.topic()
        return await self.replicas.partition(topic, partition_for(key, topic.partitions))

    # --- loading -----------------------------------------------------------------------------

    async def _load_partition(self, topic: TopicInfo, index: int) -> None:
        self._loading.add(index)
        try:
            await self._replay_partition(topic, index)
        finally:
            self._loading.discard(index)
        if not self.leads(index):  # led elsewhere now: what was replayed is not ours
            self._unload(index)

    async def _replay_partition(self, topic: TopicInfo, index: int) -> None:
        started = time.perf_counter()
        if index in self._loaded:
            return
        partition = await self.replicas.partition(topic, index, background=True)
        offset, end, count = partition.log_start_offset, partition.high_watermark, 0
        while offset < end:
            views = await partition.read(offset, LOAD_READ_BYTES)
            if not views:
                break
            for view in views:
                for header, batch in record_batch.iter_batches(view):
                    next_offset = header.base_offset + header.last_offset_delta + 1
                    if next_offset <= offset:
                        continue
                    try:
                        recs = parse_records(batch, check_crc=False)
                    except InvalidRecordBatchError as e:
                        log.warning("%s-%d: skipping a bad batch: %s", topic.name, index, e)
                        recs = []
                    recs = [r for r in recs if r.offset >= offset]
                    self.replayer.replay_batch(index, header, recs)
                    count += len(recs)
                    offset = max(offset, next_offset)
        self.replayer.partition_loaded(index)
        self._loaded.add(index)
        if count:
            log.info(
                "loaded %d records of %s-%d in %.0f ms",
                count,
                topic.name,
                index,
                (time.perf_counter() - started) * 1000,
            )

    # --- appends -----------------------------------------------------------------------------

    async def append(
        self,
        key: str,
        entries: Sequence[tuple[bytes, bytes | None]],
        *,
        what: str = "",
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> ErrorCode:
        """Append records (key bytes, value bytes or None) to ``key``'s partition, durably;
        the error code to answer with (NONE once durable). ``what`` names the writer in logs.
        With a ``producer_id`` the batch is part of that producer's transaction (offsets
        committed in a transaction): it counts once the transaction's COMMIT marker follows.
        A fenced producer epoch is INVALID_PRODUCER_EPOCH."""
        if not entries:
            return ErrorCode.NONE
        now = int(time.time() * 1000)
        batch = build_batch(
            [RecordInput(value, k, timestamp=now) for k, value in entries],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            is_transactional=producer_id >= 0,
        )
        try:
            partition = await self.partition(key)
            result = await partition.append_records(memoryview(batch), from_coordinator=True)
        except Exception as e:
            log.warning("cannot write %s for %s: %s", self.topic_name, what or key, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if result.error == ErrorCode.NONE:
            # durable, but acknowledged only by a broker not fenced meanwhile: a fenced one's
            # write may be lost to the broker that leads the partition now (as Kafka's deposed
            # leader's write never gathers its in-sync replicas)
            settled = await self.replicas.session_settled_soon()
            if settled == ErrorCode.NONE:
                return ErrorCode.NONE
            log.warning(
                "%s for %s written out of this broker's session: %s",
                what or key,
                self.topic_name,
                settled.name,
            )
            return (
                ErrorCode.NOT_COORDINATOR
                if settled == ErrorCode.NOT_LEADER_OR_FOLLOWER
                else ErrorCode.COORDINATOR_NOT_AVAILABLE
            )
        log.warning(
            "writing %s to %s failed: %s %s",
            what or key,
            self.topic_name,
            result.error.name,
            result.message or "",
        )
        if result.error in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_TXN_STATE):
            return result.error
        if result.error in (
            ErrorCode.MESSAGE_TOO_LARGE,
            ErrorCode.RECORD_LIST_TOO_LARGE,
            ErrorCode.INVALID_FETCH_SIZE,
        ):
            return ErrorCode.UNKNOWN_SERVER_ERROR
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
