"""ReplicaManager: the partitions this broker leads, opened lazily over S3Storage; appends and
fetches are orchestrated here, as in Kafka's ReplicaManager.

``append_records`` checks each entry (acks, topic, partition, internal topics), starts every
partition's append in request order (offsets assigned, WAL writes started) and returns the
future of the results: the wait for durability is the only part that runs concurrently with
what the connection does next. ``fetch_messages`` hands the partitions asked for to
:class:`automq_py.fetch_reader.FetchReader` (Kafka's readFromLog and delayed fetch), which opens
them through :meth:`ReplicaManager.partition`. A storage failure is the failing partition's
error code (one mapping, :mod:`automq_py.errors`); the other partitions carry on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from automq_py.controller import membership
from automq_py.errors import NotLeaderError, describe, kafka_error, partition_failed
from automq_py.fetch_reader import FetchEntry, FetchReader
from automq_py.log.elastic_log import ElasticLog
from automq_py.log.log_config import LogConfig
from automq_py.log.log_loader import (
    LogCreatedElsewhereError,
    destroy_log,
    meta_stream_key,
    open_log,
)
from automq_py.loop_lag import collector_paused
from automq_py.metadata_cache import ClusterMetadataCache
from automq_py.metrics.topic_stats import BrokerTopicStats
from automq_py.partition import AppendResult, Partition, PendingAppend
from automq_py.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from automq_py.refused_batches import RETRIED, RefusedBatches
from automq_py.topic_config import effective_topic_config
from automq_py.topics import TopicError, TopicInfo
from protocol.errors import ErrorCode
from storage.errors import StorageFailedError
from storage.metadata.image import MetadataImage
from storage.metadata.model import StreamState
from storage.metadata.records import Record
from storage.s3_storage import S3Storage
from storage.stream import StreamClient

log = logging.getLogger("automq.replica")

# how long a broker taking a partition over waits for its previous leader to close it (make its
# tail durable and close its streams) before telling the client to retry
HANDOFF_TIMEOUT_S = 10.0
# how long a client's request waits for a partition this broker is taking over to open; past
# it the client is told to retry (NOT_LEADER_OR_FOLLOWER): a request held longer would hold up
# the other partitions' requests behind it on the client's connection (a dead broker's
# partitions on the file WAL open only once it returns)
REQUEST_OPEN_WAIT_S = 0.5
# how long closing the broker waits for partitions still opening
CLOSE_OPEN_WAIT_S = 3.0
# a close of partitions led elsewhere now that failed (the metadata store or the object store
# unreachable) is tried again after this, doubling up to CLOSE_RETRY_MAX_S: until it is
# closed, the partition's new leader waits for it (see _await_handoff)
CLOSE_RETRY_S = 0.5
CLOSE_RETRY_MAX_S = 10.0
# how long a leader uploads the tails of partitions it is to hand over before it hands them over
# regardless (their close then uploads what is left)
HANDOVER_PREPARE_S = 10.0
# how long a durable write that is not an append of a client's (a coordinator's record, a
# transaction marker) waits, in a cluster, for this broker's session to be sure again (a
# heartbeat through, or the fence seen) before its requester is told to retry
SESSION_WAIT_S = 10.0
# partitions opened at once when leadership of many arrives together (their streams' opens
# share metadata changes, their appends WAL group commits: the more at once, the fewer round
# trips to the store)
OPEN_CONCURRENCY = 1000
# partitions gained at once from which their opening pauses the cyclic collector (see
# loop_lag.collector_paused): what they build lives as long as they are led here
BULK_OPEN = 500


@dataclass(slots=True, frozen=True)
class AppendEntry:
    """One partition's records in an append: ``topic`` None when the name did not resolve
    (``error`` says why)."""

    topic: TopicInfo | None
    index: int
    records: memoryview | None
    error: ErrorCode = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    name: str | None = None  # the topic's name as the request gave it, when ``topic`` is None
    message: str | None = None  # with ``error``, for the response
    # the transaction verification the Produce holds for this partition's batches, if any
    # (ProducerStateManager.verification_guard)
    guard: object | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic.name if self.topic is not None else self.name or "", self.index)


@dataclass(slots=True, frozen=True)
class ReplicaInfo:
    """One partition's log as DescribeLogDirs shows it."""

    topic: str
    index: int
    size: int  # bytes of its segments
    offset_lag: int  # how far the log end offset is behind the high watermark


@dataclass(slots=True, frozen=True)
class LogDirInfo:
    """The broker's one log directory (Kafka's ``DescribeLogDirsResult``): its absolute path,
    the volume's total and usable bytes, the partition logs described."""

    path: str
    error: ErrorCode
    total_bytes: int = -1
    usable_bytes: int = -1
    replicas: tuple[ReplicaInfo, ...] = ()


class BrokerSession(Protocol):
    """What the replica manager asks a cluster broker's membership before acknowledging."""

    def in_session(self) -> bool: ...

    @property
    def fenced(self) -> bool: ...


class ReplicaManager:
    def __init__(
        self,
        storage: S3Storage,
        topic_defaults: dict[str, str],
        cluster: ClusterMetadataCache | None = None,
    ) -> None:
        self.storage = storage
        self.client = StreamClient(storage)
        self.topic_defaults = topic_defaults
        # None: a single broker, which leads every partition at its node epoch
        self.cluster = cluster
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._closing: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._batch: dict[tuple[str, int], Partition] | None = None  # joining the next close
        self._batch_task: asyncio.Task[None] | None = None
        self._open_slots = asyncio.Semaphore(OPEN_CONCURRENCY)
        self._topics: Callable[[str], TopicInfo | None] | None = None
        # a cluster broker's membership: acknowledgements wait while it may be fenced
        self.session: BrokerSession | None = None
        self.topic_stats = BrokerTopicStats()
        # idempotent batches refused before they were appended: a later batch of the same
        # producer waits for them (see automq_py.refused_batches)
        self.refusals = RefusedBatches()
        self._opening: dict[tuple[str, int], asyncio.Task[Partition]] = {}
        # reassignments this broker is to carry out as the partitions' leader: key -> target
        self._handovers: dict[tuple[str, int], int] = {}
        self._handing_over: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.producer_id_expiration_ms = DEFAULT_PRODUCER_ID_EXPIRATION_MS
        self._stopping = False  # close() has begun: failed closes are not tried again
        # topics whose partitions were closed to be deleted, by id (a new topic may take the
        # name): never opened again; a request that raced the deletion is told the topic is
        # gone, as Kafka's getPartitionOrException does once the metadata dropped it
        self._deleted: set[uuid.UUID] = set()
        self._destroying = asyncio.Lock()  # one pass over deleted topics' logs at a time
        self._configs: dict[tuple[uuid.UUID, tuple[tuple[str, str], ...]], LogConfig] = {}
        self._configs_of: dict[str, str] | None = None  # the defaults _configs were parsed from
        # partitions taken over whose MetaStreams are being read into memory together: their
        # opens wait for it rather than each reading its own
        self._prefetching: dict[tuple[str, int], asyncio.Future[None]] = {}
        # a fetch's read and its wait for data (Kafka's readFromLog and delayed fetch)
        self.fetch_messages = FetchReader(
            self.partition, self._read_failed, self.topic_stats, self.partition_if_open
        ).fetch

    def log_config(self, topic: TopicInfo) -> LogConfig:
        if self._configs_of is not self.topic_defaults:  # the defaults changed: parse anew
            self._configs.clear()
            self._configs_of = self.topic_defaults
        key = (topic.topic_id, tuple(sorted(topic.configs.items())))
        config = self._configs.get(key)
        if config is None:  # parsed once per topic: a broker opens thousands of its partitions
            config = effective_topic_config(self.topic_defaults, topic.configs).log_config
            self._configs[key] = config
        return config

    def apply_config(self, topic: TopicInfo) -> LogConfig:
        """Hand ``topic``'s settings in effect to its open partitions, after a change of its
        configs or of the broker's defaults: ``max.message.bytes``, ``segment.bytes`` and
        ``segment.ms`` act on the next append, what a segment fixes when it is created
        (``index.interval.bytes``, ``segment.index.bytes``) from the next segment on."""
        config = self.log_config(topic)
        for partition in self.opened(topic.name):
            partition.log.config = config
            partition.max_message_bytes = config.max_message_bytes
        return config

    def set_producer_id_expiration_ms(self, expiration_ms: int) -> None:
        """Take ``producer.id.expiration.ms`` (a dynamic config) in the open partitions and
        the ones opened from now on."""
        self.producer_id_expiration_ms = expiration_ms
        for partition in self._partitions.values():
            partition.log.producer_id_expiration_ms = expiration_ms

    def expire_producers(self) -> int:
        """Forget the producers idle past ``producer.id.expiration.ms`` in every partition led
        here; how many were."""
        return sum(partition.log.expire_producers() for partition in self.open_partitions())

    def expire_producers_every(self, interval_s: float) -> None:
        """Check for idle producers every ``interval_s`` (Kafka's
        ``producer.id.expiration.check.interval.ms``) until :meth:`close`."""

        async def every() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    expired = self.expire_producers()
                except Exception:  # the next check tries again
                    log.exception("expiring idle producer ids failed")
                    continue
                if expired:
                    log.info(
                        "forgot %d producer ids idle for producer.id.expiration.ms (%d ms)",
                        expired,
                        self.producer_id_expiration_ms,
                    )

        self._in_background(every(), "expire-producer-ids")

    def open_in_background(self, topic: TopicInfo) -> asyncio.Task[None]:
        """Open a new topic's partitions now, as Kafka creates a topic's logs when the topic
        is created, rather than inside the first produce to each (which would wait for it)."""
        return self._in_background(self._open_all(topic), f"open-{topic.name}")

    def _in_background(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` as a task that ``close`` cancels."""
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _open_all(self, topic: TopicInfo) -> None:
        for index in range(topic.partitions):
            if self.leader_epoch(topic.name, index) is None:
                continue  # another broker leads it
            try:
                await self.partition(topic, index, background=True)
            except Exception as e:  # the first request to it opens it again, or says why
                log.info("opening %s-%d after its creation: %s", topic.name, index, e)
                return

    def destroy_deleted_in_background(self, is_live: Callable[[uuid.UUID], bool]) -> None:
        """Delete, in the background, the streams of every partition log whose topic is gone
        (``is_live`` says which topic ids still exist): their objects become garbage for the
        GC job. Run after DeleteTopics, as Kafka deletes a topic's logs after answering, and
        at startup, which finishes what a crash interrupted."""
        self._in_background(self._destroy_deleted(is_live), "destroy-deleted-logs")

    async def _destroy_deleted(self, is_live: Callable[[uuid.UUID], bool]) -> None:
        metadata = self.storage.metadata
        prefix = self.storage.config.namespace + "/"
        async with self._destroying:
            logs = streams = 0
            for key in metadata.kv_keys(prefix):
                topic_id, _, index = key[len(prefix) :].partition("/")
                try:
                    if not index.isdigit() or is_live(uuid.UUID(topic_id)):
                        continue
                except ValueError:
                    continue  # not a partition's key
                try:
                    streams += await destroy_log(
                        self.client, metadata, key, self.storage.node_epoch
                    )
                    logs += 1
                except Exception as e:  # the next pass (or restart) tries again
                    log.warning("deleting the log of deleted topic %s-%s: %s", topic_id, index, e)
            if logs:
                log.info("deleted %d streams of %d partition logs of deleted topics", streams, logs)

    def leader_epoch(self, topic: str, index: int) -> int | None:
        """The epoch at which this broker leads the partition, None if it does not lead it."""
        if self.cluster is None:
            # every broker start opens with a newer node epoch, fencing any older owner
            return self.storage.node_epoch
        leadership = self.cluster.leadership(topic, index)
        return leadership.epoch if leadership.leader == self.storage.node_id else None

    def _check_leader(self, topic: TopicInfo, index: int) -> int:
        epoch = self.leader_epoch(topic.name, index)
        if epoch is None:
            raise NotLeaderError(
                f"broker {self.storage.node_id} does not lead {topic.name}-{index}"
            )
        return epoch

    async def partition(
        self, topic: TopicInfo, index: int, *, background: bool = False
    ) -> Partition:
        """The partition, opening its ElasticLog (creating it on first use) if needed; raises
        :class:`NotLeaderError` for a partition another broker leads. In a cluster a client's
        request waits at most :data:`REQUEST_OPEN_WAIT_S` for a partition being taken over
        (the opening goes on behind); ``background`` work waits until it is open or failed."""
        found = self.partition_if_open(topic, index)
        if found is not None:
            return found
        key = (topic.name, index)
        self._check_leader(topic, index)
        self._check_not_deleted(topic)
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.create_task(
                self._open(topic, index), name=f"open-{topic.name}-{index}"
            )
            self._opening[key] = opening
            opening.add_done_callback(lambda task: self._opened(key, task))
        if background or self.cluster is None:
            return await asyncio.shield(opening)
        done, _ = await asyncio.wait([opening], timeout=REQUEST_OPEN_WAIT_S)
        if not done:
            raise NotLeaderError(f"{topic.name}-{index} is being taken over, not open yet")
        return opening.result()

    def partition_if_open(self, topic: TopicInfo, index: int) -> Partition | None:
        """The partition if it is open here at the epoch this broker leads it at, at once;
        None otherwise (:meth:`partition` opens it, or says why it cannot)."""
        found = self._partitions.get((topic.name, index))
        if found is None or found.leader_epoch != self.leader_epoch(topic.name, index):
            return None
        return found

    def _opened(self, key: tuple[str, int], task: asyncio.Task[Partition]) -> None:
        if self._opening.get(key) is task:
            del self._opening[key]
        if not task.cancelled():
            task.exception()  # retrieved: a request that stopped waiting reported its own error

    async def _open(self, topic: TopicInfo, index: int) -> Partition:
        key = (topic.name, index)
        epoch = self._check_leader(topic, index)
        found = self._partitions.get(key)
        if found is not None:
            if found.leader_epoch == epoch:
                return found
            self._close_in_background(key)  # led here before, at an older epoch
        closing = self._closing.get(key)
        if closing is not None:
            await asyncio.shield(closing)
        self._check_not_deleted(topic)
        config = self.log_config(topic)
        if self.cluster is not None:
            await self._await_handoff(topic, index)
            epoch = self._check_leader(topic, index)
            prefetching = self._prefetching.get(key)
            if prefetching is not None:
                await asyncio.shield(prefetching)
        try:
            elastic_log = await open_log(
                self.client,
                self.storage.metadata,
                self.storage.config.namespace,
                str(topic.topic_id),
                index,
                epoch,
                config,
                # this leader's epoch starts at the log end, as Kafka's makeLeader assigns it:
                # where each epoch ends is what OffsetForLeaderEpoch answers a consumer
                lead=True,
            )
        except LogCreatedElsewhereError as e:  # the client retries: then it is handed over
            raise NotLeaderError(str(e)) from e
        if topic.topic_id in self._deleted:  # deleted while it opened
            await elastic_log.close()
            self._check_not_deleted(topic)
        if self.leader_epoch(topic.name, index) != epoch:  # moved on while it opened
            await elastic_log.close()
            self._check_leader(topic, index)
            raise NotLeaderError(f"{topic.name}-{index} changed leader epoch while opening")
        elastic_log.producer_id_expiration_ms = self.producer_id_expiration_ms
        partition = Partition(topic.name, index, elastic_log, epoch, config.max_message_bytes)
        self._partitions[key] = partition
        log.info(
            "opened partition %s-%d at epoch %d: offsets [%d, %d), %d segments",
            topic.name,
            index,
            epoch,
            elastic_log.log_start_offset,
            elastic_log.log_end_offset,
            len(elastic_log.segments),
        )
        return partition

    async def _await_handoff(self, topic: TopicInfo, index: int) -> None:
        """Wait until the partition's previous leader has closed its log (its MetaStream, closed
        last, is closed): opening it sooner would fence the tail it has yet to make durable."""
        deadline = time.monotonic() + HANDOFF_TIMEOUT_S
        while True:
            owner = self._held_by(topic, index)
            if owner is None:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise NotLeaderError(
                    f"{topic.name}-{index} is still open on broker {owner}: not taken over yet"
                )
            await self.storage.metadata.wait_for_change(left)

    def _meta_stream_of(self, topic: TopicInfo, index: int) -> int | None:
        key = meta_stream_key(self.storage.config.namespace, str(topic.topic_id), index)
        raw = self.storage.metadata.get_kv(key)
        return None if raw is None else int.from_bytes(raw, "big", signed=True)

    def _held_by(self, topic: TopicInfo, index: int) -> int | None:
        """The other broker that still has the partition's MetaStream open, if any."""
        stream_id = self._meta_stream_of(topic, index)
        stream = None if stream_id is None else self.storage.metadata.stream(stream_id)
        if stream is None or stream.state is StreamState.CLOSED:
            return None
        owner = stream.ranges[-1].node_id if stream.ranges else self.storage.node_id
        return None if owner == self.storage.node_id else owner

    def _close_in_background(self, key: tuple[str, int]) -> None:
        """Stop serving the partition now and close its log (its tail made durable) behind.
        Partitions leaving in the same moment (a broker's all, at a controlled shutdown) are
        closed together: one upload, one metadata change."""
        partition = self._partitions.pop(key, None)
        if partition is None or key in self._closing:
            return
        if self._batch is None or self._batch_task is None:
            self._batch = {}
            self._batch_task = asyncio.create_task(
                self._close_batch(self._batch), name="close-partitions"
            )
        self._batch[key] = partition
        self._closing[key] = self._batch_task

    async def _close_batch(self, batch: dict[tuple[str, int], Partition]) -> None:
        await asyncio.sleep(0)  # let the other partitions of this change join the batch
        self._batch = None
        started = time.monotonic()
        named = ", ".join(f"{p.topic}-{p.index}" for p in list(batch.values())[:5]) + (
            ", ..." if len(batch) > 5 else ""
        )
        delay = CLOSE_RETRY_S
        try:
            while True:
                try:
                    # (a retry closes what the failed attempt left open: ElasticLog._seal)
                    await ElasticLog.close_many([p.log for p in batch.values()])
                    break
                except Exception as e:
                    if self._stopping or not _close_may_succeed(e):
                        log.warning(
                            "closing %d partitions led elsewhere now (%s): %s", len(batch), named, e
                        )
                        return
                    log.warning(
                        "closing %d partitions led elsewhere now (%s) failed, retrying in %g s: %s",
                        len(batch),
                        named,
                        delay,
                        e,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, CLOSE_RETRY_MAX_S)
            log.info(
                "closed %d partitions led elsewhere now in %.0f ms (%s)",
                len(batch),
                (time.monotonic() - started) * 1000,
                named,
            )
        finally:
            for key in batch:
                self._closing.pop(key, None)

    def open_partitions(self) -> list[Partition]:
        """The partitions open on this broker now (a copy)."""
        return list(self._partitions.values())

    def leaders_changed(self, topics: set[str]) -> None:
        """Hand over the open partitions of ``topics`` this broker no longer leads (or leads
        at a newer epoch), and open the ones it now leads."""
        for key, partition in list(self._partitions.items()):
            if key[0] in topics and self.leader_epoch(*key) != partition.leader_epoch:
                self._close_in_background(key)
        if self._topics is None or self.cluster is None:
            return
        gained: list[tuple[TopicInfo, int]] = []
        for name in topics:
            topic = self._topics(name)
            leaders = self.cluster.topic_leaders(name)
            if topic is None or leaders is None:
                continue
            for index, leader in enumerate(leaders.leaders):
                if leader == self.storage.node_id and (name, index) not in self._partitions:
                    gained.append((topic, index))
            for index, target in leaders.pending().items():
                if leaders.leader(index) == self.storage.node_id:
                    self._handovers[(name, index)] = target
        if gained:
            self._in_background(self._open_gained(gained), f"open-{len(gained)}-gained")
        if self._handovers and self._handing_over is None:
            self._handing_over = self._in_background(self._hand_over(), "hand-over")

    async def upload_tails(self, timeout: float) -> None:
        """Upload what the open partitions have not yet made durable in object storage, while
        they are still served (a broker about to hand them all over), for at most ``timeout``
        seconds."""
        logs = [p.log for p in self._partitions.values()]
        if not logs:
            return
        started = time.monotonic()
        try:
            if not await asyncio.wait_for(ElasticLog.upload_tails(logs), timeout):
                return
        except Exception as e:  # each close uploads what is left
            log.info("uploading the tails of %d partitions: %r", len(logs), e)
            return
        log.info(
            "uploaded the tails of %d partitions in %.0f ms",
            len(logs),
            (time.monotonic() - started) * 1000,
        )

    async def _hand_over(self) -> None:
        """Carry out the reassignments asked of this broker, those of one moment together:
        upload the partitions' tails while they still take appends, then hand them over in one
        metadata change (each then closes with only what arrived meanwhile to upload)."""
        try:
            while self._handovers:
                await asyncio.sleep(0)  # let the reassignments of this moment join
                batch, self._handovers = self._handovers, {}
                logs = [p.log for key in batch if (p := self._partitions.get(key)) is not None]
                started = time.monotonic()
                try:
                    await asyncio.wait_for(ElasticLog.upload_tails(logs), HANDOVER_PREPARE_S)
                except Exception as e:  # handed over anyway: the close uploads the rest
                    log.info("uploading the tails of %d partitions to hand over: %r", len(logs), e)
                prepared = time.monotonic() - started
                try:
                    await self.storage.metadata.change(
                        functools.partial(_complete_moves, self.storage.node_id, batch)
                    )
                except Exception as e:
                    log.warning("handing %d partitions over: %s (retried)", len(batch), e)
                    await asyncio.sleep(1.0)
                    for key, target in batch.items():
                        self._handovers.setdefault(key, target)
                    continue
                log.info(
                    "handing %d partitions over (%s) after uploading their tails in %.0f ms",
                    len(batch),
                    ", ".join(f"{n}-{i} to {t}" for (n, i), t in list(batch.items())[:5])
                    + (", ..." if len(batch) > 5 else ""),
                    prepared * 1000,
                )
        finally:
            self._handing_over = None

    def open_on_leadership(self, topics: Callable[[str], TopicInfo | None]) -> None:
        """Open partitions as their leadership arrives (``topics`` resolves a name)."""
        self._topics = topics

    async def _open_gained(self, gained: list[tuple[TopicInfo, int]]) -> None:
        """Open the partitions this broker has just been given, in waves: each wave is those
        their previous leader has closed by then, and their MetaStreams are read into memory
        together (one GET per object their previous leader uploaded, not one per partition)
        before they open."""
        if len(gained) < BULK_OPEN:
            await self._open_waves(gained)
            return
        with collector_paused(freeze=True):
            opens = await self._open_waves(gained)
            if opens:
                await asyncio.wait(opens)

    async def _open_waves(self, gained: list[tuple[TopicInfo, int]]) -> list[asyncio.Task[None]]:
        """The opens started, wave after wave."""
        opens: list[asyncio.Task[None]] = []
        deadline = time.monotonic() + HANDOFF_TIMEOUT_S
        pending = gained
        while pending:
            ready: list[tuple[TopicInfo, int]] = []
            waiting: list[tuple[TopicInfo, int]] = []
            for topic, index in pending:
                if self.leader_epoch(topic.name, index) is None:
                    continue  # moved on meanwhile
                if self._held_by(topic, index) is None or time.monotonic() > deadline:
                    ready.append((topic, index))  # past the deadline: its open says why
                else:
                    waiting.append((topic, index))
            if ready:
                opens += await self._open_wave(ready)
            pending = waiting
            if pending:
                await self.storage.metadata.wait_for_change(max(0.0, deadline - time.monotonic()))
        return opens

    async def _open_wave(self, wave: list[tuple[TopicInfo, int]]) -> list[asyncio.Task[None]]:
        loop = asyncio.get_running_loop()
        prefetched: asyncio.Future[None] = loop.create_future()
        keys = [(topic.name, index) for topic, index in wave]
        for key in keys:
            self._prefetching[key] = prefetched
        opens = [
            self._in_background(self._open_one(topic, index), f"open-{topic.name}-{index}")
            for topic, index in wave
        ]
        started = time.monotonic()
        try:
            streams = [
                sid
                for topic, index in wave
                if (sid := self._meta_stream_of(topic, index)) is not None
            ]
            objects = await asyncio.wait_for(self.storage.prefetch_streams(streams), 10.0)
            log.info(
                "taking over %d partitions: their MetaStreams read from %d objects in %.0f ms",
                len(wave),
                objects,
                (time.monotonic() - started) * 1000,
            )
        except Exception as e:  # each open reads its own
            log.info("reading the MetaStreams of %d partitions taken over: %r", len(wave), e)
        finally:
            prefetched.set_result(None)
            for key in keys:
                if self._prefetching.get(key) is prefetched:
                    del self._prefetching[key]
        return opens

    async def _open_one(self, topic: TopicInfo, index: int) -> None:
        async with self._open_slots:
            try:
                await self.partition(topic, index, background=True)
            except Exception as e:  # the first request to it opens it again, or says why
                log.info("opening %s-%d on taking it over: %s", topic.name, index, e)

    def _check_not_deleted(self, topic: TopicInfo) -> None:
        if topic.topic_id in self._deleted:
            raise TopicError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic.name!r} was deleted"
            )

    def _failed(
        self, action: str, entry: AppendEntry | FetchEntry, error: BaseException
    ) -> ErrorCode:
        """The code for a partition whose append or read raised ``error``: the topic is
        unknown once deleted, whatever its closing log raised; else the one mapping."""
        topic = entry.topic
        if topic is not None and topic.topic_id in self._deleted:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return partition_failed(action, topic.name if topic else "?", entry.index, error)

    def _append_failed(self, entry: AppendEntry, error: BaseException) -> AppendResult:
        return AppendResult(self._failed("produce to", entry, error), message=describe(error))

    def _read_failed(self, entry: FetchEntry, error: BaseException) -> ErrorCode:
        return self._failed("fetch from", entry, error)

    def opened(self, topic: str) -> list[Partition]:
        """The partitions of ``topic`` opened so far, in index order (a config change applies
        to these; the others read the topic's configs when they open)."""
        return [p for (name, _), p in sorted(self._partitions.items()) if name == topic]

    # -- append ----------------------------------------------------------------------------------

    async def append_records(
        self,
        entries: Sequence[AppendEntry],
        *,
        acks: int,
        internal_allowed: bool,
        timeout_ms: int = 0,
        listeners: list[Callable[[], object]] | None = None,
        appends: list[AppendResult | PendingAppend] | None = None,
    ) -> asyncio.Future[list[AppendResult]]:
        """Start the append of each entry, in order, and return the future of their results
        (in the same order), done once every started append is durable or failed. Only
        coordinators may append to internal topics (Kafka's ``internalTopicsAllowed``).
        ``appends``, when given, is filled with how each entry's append started: its result when
        known at once, else its :class:`PendingAppend` (a Produce response made while the WAL
        write is in flight reads there what the results will be if every append succeeds).

        ``timeout_ms`` (a Produce request's, when positive) bounds the whole append: a
        partition whose append could not start in time (no room in the WAL cache), or is not
        durable in time, is answered REQUEST_TIMED_OUT; as in Kafka, its records may still
        land in the log.

        ``listeners`` are called right after the future is set done, in the same pass of the
        event loop (a done callback of the future runs a pass later): the Produce response
        goes out from there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000 if timeout_ms > 0 else None
        started: list[AppendResult | PendingAppend] = []
        for entry in entries:
            start = await self._start_append(entry, acks, internal_allowed, deadline)
            if (
                isinstance(start, AppendResult)
                and start.error in RETRIED
                and entry.records is not None
            ):
                self.refusals.refused(entry.key, entry.records, start.error)
            started.append(start)
        if appends is not None:
            appends += started
        results: asyncio.Future[list[AppendResult]] = loop.create_future()
        pending = [(i, a) for i, a in enumerate(started) if isinstance(a, PendingAppend)]
        if not pending:
            results.set_result([r for r in started if isinstance(r, AppendResult)])
            return results
        remaining = len(pending)
        timer: asyncio.TimerHandle | None = None
        # in a cluster the answers go through _in_session, which calls the listeners itself
        notify = listeners if self.session is None else None

        def finish() -> None:
            if timer is not None:
                timer.cancel()
            if not results.done():
                results.set_result(
                    [
                        r
                        if isinstance(r, AppendResult)
                        else AppendResult(ErrorCode.REQUEST_TIMED_OUT)
                        for r in started
                    ]
                )
                for listener in notify or ():
                    listener()

        def one_done(i: int, entry: AppendEntry, append: PendingAppend) -> None:
            nonlocal remaining
            if results.done():
                return
            f = append.durable
            if f.cancelled():
                started[i] = AppendResult(ErrorCode.REQUEST_TIMED_OUT)
            elif (error := f.exception()) is not None:
                started[i] = self._append_failed(entry, error)
            else:
                started[i] = append.result()
            remaining -= 1
            if remaining == 0:
                finish()

        if deadline is not None:
            timer = loop.call_at(deadline, finish)
        for i, append in pending:
            append.when_durable(
                lambda i=i, e=entries[i], a=append: one_done(i, e, a)  # type: ignore[misc]
            )
        return self._in_session(results, deadline, listeners)

    def session_holds(self) -> bool:
        """Whether this broker may answer from what it holds as a partition's leader: outside a
        cluster always; in one, while it is in session and not fenced. Out of session the
        controller may have fenced it and had its WAL recovered, and what it appended since
        (its high watermark counts it) may never reach the new leader, which then gives
        those offsets to other records."""
        session = self.session
        return session is None or (session.in_session() and not session.fenced)

    async def session_settled(self, deadline: float | None = None) -> ErrorCode:
        """Before acknowledging a write this broker made durable (a coordinator's record, a
        transaction marker): NONE once it is in session, NOT_LEADER_OR_FOLLOWER once it is
        known fenced, REQUEST_TIMED_OUT if neither by ``deadline`` (the loop's clock). At once
        outside a cluster, and while heartbeats go through."""
        session = self.session
        if session is None:
            return ErrorCode.NONE
        loop = asyncio.get_running_loop()
        while not session.in_session() and not session.fenced:
            if deadline is not None and loop.time() >= deadline:
                return ErrorCode.REQUEST_TIMED_OUT
            await asyncio.sleep(0.01)
        return ErrorCode.NOT_LEADER_OR_FOLLOWER if session.fenced else ErrorCode.NONE

    async def session_settled_soon(self) -> ErrorCode:
        """``session_settled`` within SESSION_WAIT_S from now."""
        return await self.session_settled(asyncio.get_running_loop().time() + SESSION_WAIT_S)

    def _in_session(
        self,
        results: asyncio.Future[list[AppendResult]],
        deadline: float | None,
        listeners: list[Callable[[], object]] | None,
    ) -> asyncio.Future[list[AppendResult]]:
        """``results``, held back while this broker of a cluster cannot be sure it was not
        fenced (no heartbeat went through for nearly a session: frozen, or cut off from the
        metadata), so that a fenced broker acknowledges nothing; answered once a heartbeat
        goes through, NOT_LEADER_OR_FOLLOWER once it is known fenced. In a cluster the
        ``listeners`` are called here, right after the future returned is set done."""
        session = self.session
        if session is None:
            return results
        loop = asyncio.get_running_loop()
        held: asyncio.Future[list[AppendResult]] = loop.create_future()

        def answer(answers: list[AppendResult] | BaseException | None) -> None:
            if held.done():
                return
            if answers is None:
                held.cancel()
            elif isinstance(answers, BaseException):
                held.set_exception(answers)
            else:
                held.set_result(answers)
            for listener in listeners or ():
                listener()

        async def wait(answers: list[AppendResult]) -> None:
            settled = await self.session_settled(deadline)
            if settled != ErrorCode.NONE:
                answers = [_unless_failed(a, settled) for a in answers]
            answer(answers)

        def release(done: asyncio.Future[list[AppendResult]]) -> None:
            if done.cancelled():
                answer(None)
            elif (error := done.exception()) is not None:
                answer(error)
            elif self.session_holds():
                answer(done.result())
            else:
                self._in_background(wait(done.result()), "append-in-session")

        results.add_done_callback(release)
        return held

    async def _start_append(
        self, entry: AppendEntry, acks: int, internal_allowed: bool, deadline: float | None
    ) -> AppendResult | PendingAppend:
        topic = entry.topic
        if topic is None:
            return AppendResult(entry.error, message=entry.message)
        if not 0 <= entry.index < topic.partitions:
            return AppendResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        # (as Kafka: a partition refused or unknown keeps its own error, the rest hear of acks)
        if acks not in (-1, 0, 1):
            return AppendResult(ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={acks}")
        if topic.internal and not internal_allowed:
            return AppendResult(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                message=f"cannot append to internal topic {topic.name}",
            )
        if entry.records is None:
            return AppendResult(ErrorCode.CORRUPT_MESSAGE, message="null records")
        started = await self._start_partition_append(topic, entry, acks, deadline)
        if isinstance(started, PendingAppend):
            self.topic_stats.appended(topic.name, entry.records)
        elif started.error != ErrorCode.NONE:
            self.topic_stats.append_failed(topic.name)
        return started

    async def _start_partition_append(
        self, topic: TopicInfo, entry: AppendEntry, acks: int, deadline: float | None
    ) -> AppendResult | PendingAppend:
        assert entry.records is not None
        try:
            partition = await self.partition(topic, entry.index)
            if self.refusals:
                owed = self.refusals.held_back(
                    entry.key, entry.records, partition.log.producer_state.entry
                )
                if owed is not None:
                    return AppendResult(
                        owed,
                        message="an earlier batch of this producer was refused and is owed first",
                    )
            # (min.insync.replicas asks nothing of a partition's one replica: Kafka 3.7+ checks
            # the ISR against min(min.insync.replicas, replicas), and the one replica here, its
            # leader, is always in sync; object storage is what keeps the data durable)
            return await partition.start_append(entry.records, deadline, guard=entry.guard)
        except Exception as e:
            return self._append_failed(entry, e)

    # -- log dirs --------------------------------------------------------------------------------

    async def describe_log_dir(self, partitions: Sequence[tuple[TopicInfo, int]]) -> LogDirInfo:
        """Kafka's describeLogDirs for ``partitions`` (each opened to learn its size). The log
        directory is the WAL's (``s3.wal.path``): the one directory this broker writes
        partition data to; the volume's figures are that directory's. A log that fails to
        open makes the directory's error, as an offline log directory does in Kafka. With the
        WAL in object storage the directory is its bucket (without the url's parameters, which
        may hold credentials) and the volume's figures are unknown (-1, as Kafka answers)."""
        config = self.storage.config
        total = free = -1
        if config.wal_object_store_url is not None:
            path = config.wal_path.split("?", 1)[0]
        else:
            path = os.path.abspath(config.wal_path)
            try:
                usage = shutil.disk_usage(path)
            except OSError as e:
                log.warning("describing log dir %s: %s", path, e)
                return LogDirInfo(path, ErrorCode.KAFKA_STORAGE_ERROR)
            total, free = usage.total, usage.free
        opened = await asyncio.gather(
            *(self.partition(topic, index) for topic, index in partitions), return_exceptions=True
        )
        replicas = []
        for (topic, index), p in zip(partitions, opened, strict=True):
            if isinstance(p, TopicError | NotLeaderError):
                continue  # deleted or moved to another broker meanwhile: no log here
            if isinstance(p, BaseException):
                log.warning("describing log dir %s: %s-%d: %s", path, topic.name, index, p)
                return LogDirInfo(path, kafka_error(p))
            lag = max(p.high_watermark - p.log_end_offset, 0)
            replicas.append(ReplicaInfo(topic.name, index, p.log.size_in_bytes, lag))
        return LogDirInfo(path, ErrorCode.NONE, total, free, tuple(replicas))

    async def close_topic(self, topic: TopicInfo) -> None:
        """Close the partitions of ``topic``, which is being deleted: they are never opened
        again, and appends still waiting for them fail UNKNOWN_TOPIC_OR_PARTITION."""
        self._deleted.add(topic.topic_id)
        self.topic_stats.remove(topic.name)
        for key in [k for k in self._partitions if k[0] == topic.name]:
            partition = self._partitions.pop(key)
            await partition.log.close()

    async def handed_over(self) -> None:
        """Wait until the partitions led elsewhere now are closed here (a broker stopping
        keeps its session, and so its right to commit them, until then)."""
        if self._closing:
            await asyncio.wait(list(self._closing.values()))

    async def close(self) -> None:
        self._stopping = True
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(list(self._background))
        if self._opening:  # what they open is closed with the rest below
            _, late = await asyncio.wait(list(self._opening.values()), timeout=CLOSE_OPEN_WAIT_S)
            for opening in late:
                opening.cancel()
            if late:  # a cancelled open closes the streams it opened (log_loader.open_log)
                await asyncio.wait(late)
        if self._closing:
            await asyncio.wait(list(self._closing.values()))
        # all at once: the cache's blocks upload as they are (objects of the usual sizes),
        # then one metadata change closes every stream (per partition, a 10,000-partition
        # broker took most of a minute)
        partitions = list(self._partitions.values())
        self._partitions.clear()
        started = time.monotonic()
        if partitions:
            try:
                await self.storage.force_upload()
            except Exception as e:  # the closes below upload what they can
                log.warning(
                    "uploading the cache before closing %d partitions: %s", len(partitions), e
                )
        try:
            await ElasticLog.close_many([p.log for p in partitions])
        except Exception as e:
            log.warning("closing %d partitions: %s", len(partitions), e)
        if partitions:
            log.info("closed %d partitions in %.2f s", len(partitions), time.monotonic() - started)


def _complete_moves(
    node: int, moves: dict[tuple[str, int], int], image: MetadataImage
) -> tuple[list[Record], None]:
    """One record a topic, with all of its partitions handed over: a record a partition,
    each from the same image, kept only the last one's move (the others waited for another
    change each)."""
    by_topic: dict[str, dict[int, int]] = {}
    for (name, index), target in moves.items():
        by_topic.setdefault(name, {})[index] = target
    records = [
        r
        for name, topic_moves in by_topic.items()
        for r in membership.complete_moves(image, node, name, topic_moves)
    ]
    return records, None


def _close_may_succeed(error: Exception) -> bool:
    """Whether a close that failed with ``error`` may succeed if tried again: not once the
    streams are fenced (another leader has them, or this broker was fenced) or the storage has
    failed (the WAL)."""
    if isinstance(error, StorageFailedError):
        return False
    return kafka_error(error) is not ErrorCode.NOT_LEADER_OR_FOLLOWER


def _unless_failed(answer: AppendResult, code: ErrorCode) -> AppendResult:
    """``code`` in place of a successful answer; a failed one stays as it is."""
    return answer if answer.error != ErrorCode.NONE else AppendResult(code)
