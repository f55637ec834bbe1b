"""TransactionCoordinator: transactional ids and their transactions, in ``__transaction_state``.

This broker coordinates every transactional id. An id lives in partition
``abs(javaHashCode(id)) % transaction.state.log.num.partitions`` of ``__transaction_state``
(created on first use, loaded back on start by the :class:`CoordinatorRuntime`); its state is
the last record written there, in Kafka's format (:mod:`automq_py.coordinator.transaction_log`).
What each request does to that state is decided by the pure rules of
:mod:`automq_py.coordinator.transaction_metadata` (Kafka 3.9's); this module does the I/O the
decisions ask for:

* a :class:`~automq_py.coordinator.transaction_metadata.Transition` is appended to the log
  (the id is *pending* meanwhile: other requests for it get CONCURRENT_TRANSACTIONS) and
  applied once durable;
* a commit or abort is two-phase, as in Kafka: PrepareCommit/PrepareAbort is written and the
  client answered; then a COMMIT/ABORT marker is written into every partition of the
  transaction (:meth:`automq_py.partition.Partition.append_marker`, with this coordinator's
  epoch: the broker's node epoch, which grows at each start), and CompleteCommit/CompleteAbort
  last. A transaction found prepared when the log is loaded (a crash between the phases) is
  completed then. Markers in ``__consumer_offsets`` also settle the offsets the transaction
  committed (:meth:`~automq_py.coordinator.offsets.OffsetManager.complete_transaction`);
* a sweeper aborts transactions open longer than their ``transaction.timeout.ms`` (with an
  epoch bump that fences their producer) every
  ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, and forgets ids idle for
  ``transactional.id.expiration.ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from automq_py.config import BrokerConfig
from automq_py.coordinator import transaction_log
from automq_py.coordinator import transaction_metadata as tm
from automq_py.coordinator.broker_channel import BrokerChannel
from automq_py.coordinator.group_coordinator import OFFSETS_TOPIC, GroupCoordinator
from automq_py.coordinator.runtime import CoordinatorRuntime, partition_for
from automq_py.coordinator.transaction_metadata import (
    NeedProducerId,
    Reply,
    TopicPartition,
    TransactionMetadata,
    TransactionResult,
    TransactionState,
    Transition,
    WriteMarkers,
)
from automq_py.metadata_cache import ClusterMetadataCache
from automq_py.partition import AppendResult
from automq_py.replica_manager import ReplicaManager
from automq_py.topics import TopicRegistry
from protocol.errors import ErrorCode
from protocol.record_batch import RecordBatchHeader
from protocol.records import Record

log = logging.getLogger("automq.transactions")

TRANSACTION_TOPIC = "__transaction_state"
# Kafka's TransactionLog topic configs
TRANSACTION_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(100 * 1024 * 1024),
    "compression.type": "uncompressed",
}
RETRY_S = 0.1  # between attempts to write a marker or a Complete record that failed
# how long a request for an id whose last transaction is still writing its markers waits for
# them before deciding (CONCURRENT_TRANSACTIONS if they are not done by then): the next
# transaction's first AddPartitionsToTxn usually comes a few ms after EndTxn's answer, while
# the markers take a few more, and librdkafka retries CONCURRENT_TRANSACTIONS only 20 ms later
COMPLETION_WAIT_S = 0.05


@dataclass(slots=True, frozen=True)
class TransactionConfig:
    """The transaction settings, from the broker's properties (Kafka's names and defaults)."""

    partitions: int = 50
    segment_bytes: int = 100 * 1024 * 1024
    max_timeout_ms: int = tm.DEFAULT_TRANSACTION_MAX_TIMEOUT_MS
    id_expiration_ms: int = tm.DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS
    abort_interval_ms: int = 10_000
    expire_interval_ms: int = 3_600_000

    @classmethod
    def from_broker(cls, config: BrokerConfig) -> TransactionConfig:
        return cls(
            partitions=config.transaction_state_log_num_partitions,
            segment_bytes=config.transaction_state_log_segment_bytes,
            max_timeout_ms=config.transaction_max_timeout_ms,
            id_expiration_ms=config.transactional_id_expiration_ms,
            abort_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            expire_interval_ms=config.transaction_remove_expired_transaction_cleanup_interval_ms,
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


def to_record(m: TransactionMetadata) -> transaction_log.TransactionLogValue:
    """The ``__transaction_state`` value of a transaction's metadata."""
    topics: dict[str, list[int]] = {}
    for topic, partition in m.partitions:
        topics.setdefault(topic, []).append(partition)
    return transaction_log.TransactionLogValue(
        producer_id=m.producer_id,
        producer_epoch=m.producer_epoch,
        timeout_ms=m.txn_timeout_ms,
        status=int(m.state),
        # Kafka writes null partitions for Empty
        partitions=None
        if m.state is TransactionState.EMPTY
        else tuple(
            transaction_log.TopicPartitions(t, tuple(sorted(ps)))
            for t, ps in sorted(topics.items())
        ),
        last_update_timestamp_ms=m.txn_last_update_timestamp_ms,
        start_timestamp_ms=m.txn_start_timestamp_ms,
    )


def from_record(
    transactional_id: str, v: transaction_log.TransactionLogValue
) -> TransactionMetadata:
    """A transaction's metadata as loaded from its record (Kafka 3.9 keeps no last producer id
    or epoch)."""
    partitions = frozenset((tp.topic, p) for tp in (v.partitions or ()) for p in tp.partition_ids)
    return tm.as_loaded(
        TransactionMetadata(
            transactional_id=transactional_id,
            producer_id=v.producer_id,
            last_producer_id=tm.NO_PRODUCER_ID,
            producer_epoch=v.producer_epoch,
            last_producer_epoch=tm.NO_PRODUCER_EPOCH,
            txn_timeout_ms=v.timeout_ms,
            state=TransactionState(v.status),
            partitions=partitions,
            txn_start_timestamp_ms=v.start_timestamp_ms,
            txn_last_update_timestamp_ms=v.last_update_timestamp_ms,
        )
    )


class _Deposed(Exception):
    """This broker no longer coordinates a transactional id (its partition led elsewhere, or
    the broker fenced): the coordinator that took the partition over completes what it finds
    prepared in the log, so this one's completion stops rather than write for it."""


class TransactionCoordinator:
    def __init__(
        self,
        config: TransactionConfig,
        topics: TopicRegistry,
        replicas: ReplicaManager,
        groups: GroupCoordinator,
        new_producer_id: Callable[[], Awaitable[int]],
        coordinator_epoch: int,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.config = config
        self.topics = topics
        self.replicas = replicas
        self.groups = groups
        self.new_producer_id = new_producer_id
        self.coordinator_epoch = coordinator_epoch
        self.clock_ms = clock_ms
        self.transactions: dict[str, TransactionMetadata] = {}
        self._pending: dict[str, TransactionState] = {}  # ids with a write in flight
        # ids whose commit or abort is writing its markers: done when Complete* is durable
        self._completing: dict[str, asyncio.Future[None]] = {}
        self._failed_fence: set[str] = set()
        self.runtime = CoordinatorRuntime(
            TRANSACTION_TOPIC,
            config.partitions,
            {**TRANSACTION_TOPIC_CONFIGS, "segment.bytes": str(config.segment_bytes)},
            topics,
            replicas,
            self,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = False
        self._channel: BrokerChannel | None = None  # to the other brokers of a cluster

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start loading ``__transaction_state`` (if it exists) and the sweeper."""
        self.runtime.start()
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def stop(self) -> None:
        self._stopped = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.runtime.stop()
        if self._channel is not None:
            await self._channel.close()

    # --- loading (the runtime's Replayer) ----------------------------------------------------

    def replay_batch(
        self, partition: int, header: RecordBatchHeader, recs: Sequence[Record]
    ) -> None:
        for rec in recs:
            if rec.key is None:
                continue
            try:
                key = transaction_log.decode_key(rec.key)
                if key is None:
                    continue
                value = transaction_log.decode_value(rec.value)
            except transaction_log.TransactionLogFormatError as e:
                log.warning("skipping a bad %s record: %s", TRANSACTION_TOPIC, e)
                continue
            if value is None:
                self.transactions.pop(key.transactional_id, None)
            else:
                try:
                    self.transactions[key.transactional_id] = from_record(
                        key.transactional_id, value
                    )
                except ValueError as e:  # a status this code does not know
                    log.warning("skipping %s record of %r: %s", TRANSACTION_TOPIC, key, e)

    def partition_unloaded(self, partition: int) -> None:
        # its transactional ids are coordinated by the partition's new leader now
        for txn_id in [t for t in self.transactions if self.runtime.owns(t, partition)]:
            del self.transactions[txn_id]

    def partition_loaded(self, partition: int) -> None:
        # a transaction prepared before a crash gets its markers now (Kafka does it on load)
        for txn_id, m in list(self.transactions.items()):
            prepared = m.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT)
            if prepared and self.runtime.owns(txn_id, partition) and txn_id not in self._pending:
                self._start_completion(m)

    # --- requests ----------------------------------------------------------------------------

    async def find_coordinator(self) -> ErrorCode:
        """Make sure ``__transaction_state`` exists (FindCoordinator for a transactional id)."""
        return await self.runtime.ensure_topic()

    async def _ready(self, transactional_id: str) -> ErrorCode:
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        if self._stopped:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = await self.runtime.ready(transactional_id)
        completing = self._completing.get(transactional_id)
        if error == ErrorCode.NONE and completing is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(completing), COMPLETION_WAIT_S)
        return error

    async def init_producer_id(
        self,
        transactional_id: str,
        txn_timeout_ms: int,
        expected_producer_id: int = tm.NO_PRODUCER_ID,
        expected_producer_epoch: int = tm.NO_PRODUCER_EPOCH,
    ) -> tuple[ErrorCode, int, int]:
        """InitProducerId with a transactional id: (error, producer id, epoch)."""
        error = await self._ready(transactional_id)
        if error != ErrorCode.NONE:
            return error, -1, -1
        new_id: int | None = None
        while True:
            decision = tm.init_producer_id(
                self.transactions.get(transactional_id),
                transactional_id,
                txn_timeout_ms,
                self.clock_ms(),
                max_txn_timeout_ms=self.config.max_timeout_ms,
                expected_producer_id=expected_producer_id,
                expected_producer_epoch=expected_producer_epoch,
                pending=self._pending.get(transactional_id),
                has_failed_epoch_fence=transactional_id in self._failed_fence,
                new_producer_id=new_id,
            )
            if isinstance(decision, NeedProducerId):
                new_id = await self.new_producer_id()
                continue  # the state may have changed meanwhile: decide again
            break
        if isinstance(decision, Reply):
            return decision.error, -1, -1
        error = await self._apply(decision)
        if error != ErrorCode.NONE:
            return error, -1, -1
        return ErrorCode.NONE, decision.metadata.producer_id, decision.metadata.producer_epoch

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> ErrorCode:
        """AddPartitionsToTxn (one error for all the partitions)."""
        error = await self._ready(transactional_id)
        if error != ErrorCode.NONE:
            return error
        decision = tm.add_partitions_to_txn(
            self.transactions.get(transactional_id),
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
            self.clock_ms(),
            pending=self._pending.get(transactional_id),
        )
        if isinstance(decision, Reply):
            return decision.error
        return await self._apply(decision)

    async def verify_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn v4 ``verify_only``: whether each partition is in the
        transaction."""
        wanted = list(partitions)
        cluster = self.replicas.cluster
        topic = self.runtime.topic_info
        if cluster is not None and topic is not None:
            index = partition_for(transactional_id, topic.partitions)
            if not self.runtime.leads(index):
                # another broker coordinates it: ask that one, as Kafka's partition leaders do
                coordinator = cluster.leadership(TRANSACTION_TOPIC, index).leader
                try:
                    return await self._broker_channel(cluster).verify_partitions(
                        coordinator, transactional_id, producer_id, producer_epoch, wanted
                    )
                except Exception as e:
                    log.warning("verifying %s with broker %d: %s", transactional_id, coordinator, e)
                    return dict.fromkeys(wanted, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = await self._ready(transactional_id)
        if error != ErrorCode.NONE:
            return dict.fromkeys(wanted, error)
        return tm.verify_partitions_in_txn(
            self.transactions.get(transactional_id),
            transactional_id,
            producer_id,
            producer_epoch,
            wanted,
        )

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> ErrorCode:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the
        transaction."""
        error = await self._ready(transactional_id)
        if error != ErrorCode.NONE:
            return error
        try:
            offsets = await self.groups.runtime.topic()
        except Exception as e:
            log.warning("cannot create %s: %s", OFFSETS_TOPIC, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        decision = tm.add_offsets_to_txn(
            self.transactions.get(transactional_id),
            transactional_id,
            producer_id,
            producer_epoch,
            partition_for(group_id, offsets.partitions),
            self.clock_ms(),
            pending=self._pending.get(transactional_id),
        )
        if isinstance(decision, Reply):
            return decision.error
        return await self._apply(decision)

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> ErrorCode:
        """EndTxn: answered once the transaction's PrepareCommit/PrepareAbort is durable; the
        markers follow."""
        error = await self._ready(transactional_id)
        if error != ErrorCode.NONE:
            return error
        decision = tm.end_txn(
            self.transactions.get(transactional_id),
            transactional_id,
            producer_id,
            producer_epoch,
            TransactionResult.COMMIT if commit else TransactionResult.ABORT,
            self.clock_ms(),
            pending=self._pending.get(transactional_id),
        )
        if isinstance(decision, Reply):
            return decision.error
        return await self._apply(decision)

    async def describe(
        self, transactional_ids: Sequence[str]
    ) -> list[tuple[str, tm.TransactionDescription | ErrorCode]]:
        out: list[tuple[str, tm.TransactionDescription | ErrorCode]] = []
        for txn_id in transactional_ids:
            error = await self._ready(txn_id)
            if error not in (ErrorCode.NONE, ErrorCode.INVALID_REQUEST):
                out.append((txn_id, error))
                continue
            out.append((txn_id, tm.describe_transaction(self.transactions.get(txn_id), txn_id)))
        return out

    async def list(
        self, state_filters: Iterable[str], producer_id_filters: Iterable[int]
    ) -> tuple[ErrorCode, list[tm.TransactionListing], list[str]]:
        error = await self.runtime.all_ready()
        if error != ErrorCode.NONE:
            return error, [], []
        listed, unknown = tm.list_transactions(
            self.transactions.values(),
            state_filters=state_filters,
            producer_id_filters=producer_id_filters,
        )
        return ErrorCode.NONE, listed, unknown

    # --- writes ------------------------------------------------------------------------------

    async def _write(self, m: TransactionMetadata) -> ErrorCode:
        """Append ``m`` to the log (the id pending meanwhile); NONE once durable."""
        txn_id = m.transactional_id
        self._pending[txn_id] = m.state
        try:
            return await self.runtime.append(
                txn_id,
                [
                    (
                        transaction_log.encode_key(transaction_log.TransactionLogKey(txn_id)),
                        transaction_log.encode_value(to_record(m)),
                    )
                ],
                what=f"transactional id {txn_id}",
            )
        finally:
            self._pending.pop(txn_id, None)

    async def _apply(self, transition: Transition) -> ErrorCode:
        """Write a transition and apply it; the error to answer with."""
        m = transition.metadata
        txn_id = m.transactional_id
        error = await self._write(m)
        if error != ErrorCode.NONE:
            if transition.epoch_fence:
                current = self.transactions.get(txn_id)
                if current is not None:
                    self.transactions[txn_id] = tm.epoch_fence_failed(current, transition)
                    self._failed_fence.add(txn_id)
            return tm.coordinator_error_for_append(error)
        self.transactions[txn_id] = m
        self._failed_fence.discard(txn_id)
        if transition.complete:
            self._start_completion(m)
        return transition.reply

    def _start_completion(self, prepared: TransactionMetadata) -> None:
        markers = tm.complete_transaction(prepared, self.clock_ms())
        # pending from now: the id answers CONCURRENT_TRANSACTIONS until Complete* is durable
        txn_id = prepared.transactional_id
        self._pending[txn_id] = markers.then.state
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._completing[txn_id] = done
        self.runtime.spawn(self._complete(markers, done), f"completing {txn_id}")

    async def _complete(self, markers: WriteMarkers, done: asyncio.Future[None]) -> None:
        """Write the markers, then the Complete* record (each retried until it lands)."""
        then = markers.then
        txn_id = then.transactional_id
        commit = markers.result == TransactionResult.COMMIT
        try:
            await asyncio.gather(
                *(
                    self._write_marker(markers, topic, index, commit)
                    for topic, index in markers.partitions
                )
            )
            if any(topic == OFFSETS_TOPIC for topic, _ in markers.partitions):
                self.groups.offsets.complete_transaction(markers.producer_id, commit)
            while not self._stopped:
                self._check_coordinating(txn_id)
                self._pending[txn_id] = then.state
                error = await self.runtime.append(
                    txn_id,
                    [
                        (
                            transaction_log.encode_key(transaction_log.TransactionLogKey(txn_id)),
                            transaction_log.encode_value(to_record(then)),
                        )
                    ],
                    what=f"transactional id {txn_id}",
                )
                if error == ErrorCode.NOT_COORDINATOR:
                    raise _Deposed("fenced while writing its completion")
                if error == ErrorCode.NONE:
                    self._check_coordinating(txn_id)  # (not put back once unloaded)
                    self.transactions[txn_id] = then
                    log.debug("transactional id %s: %s", txn_id, then.state.kafka_name)
                    return
                await asyncio.sleep(RETRY_S)
        except _Deposed as e:
            # its partition's new coordinator loads the prepared state and completes it
            log.info("transactional id %s: completion left to its new coordinator: %s", txn_id, e)
        finally:
            self._pending.pop(txn_id, None)
            if self._completing.get(txn_id) is done:
                del self._completing[txn_id]
            if not done.done():
                done.set_result(None)

    async def _write_marker(
        self, markers: WriteMarkers, topic: str, index: int, commit: bool
    ) -> None:
        """One partition's marker, retried while the partition cannot take it; a deleted
        topic's partition is skipped, as Kafka does."""
        coordinator_epoch = self._coordinator_epoch(markers.then.transactional_id)
        while not self._stopped:
            self._check_coordinating(markers.then.transactional_id)
            info = self.topics.get(topic)
            if info is None or not 0 <= index < info.partitions:
                log.info("marker for %s-%d skipped: the topic is gone", topic, index)
                return
            cluster = self.replicas.cluster
            if cluster is not None and self.replicas.leader_epoch(topic, index) is None:
                if await self._write_remote_marker(markers, topic, index, commit, cluster):
                    return
                await asyncio.sleep(RETRY_S)
                continue
            try:
                partition = await self.replicas.partition(info, index)
                started = await partition.append_marker(
                    markers.producer_id, markers.producer_epoch, coordinator_epoch, commit
                )
                if isinstance(started, AppendResult):
                    # fenced: a newer coordinator or producer epoch has decided there already
                    log.warning(
                        "marker for producer %d in %s-%d refused: %s %s",
                        markers.producer_id,
                        topic,
                        index,
                        started.error.name,
                        started.message or "",
                    )
                    return
                await asyncio.shield(started.durable)
                if await self.replicas.session_settled() != ErrorCode.NONE:
                    # fenced meanwhile: the partition's new leader may not have the marker
                    raise _Deposed(f"fenced while writing its marker to {topic}-{index}")
                return
            except _Deposed:
                raise
            except Exception as e:
                log.warning("writing a marker to %s-%d failed, retrying: %s", topic, index, e)
                await asyncio.sleep(RETRY_S)

    def _check_coordinating(self, transactional_id: str) -> None:
        """Raise :class:`_Deposed` once this broker no longer leads the id's partition."""
        if not self.runtime.coordinates(transactional_id):
            raise _Deposed(f"{TRANSACTION_TOPIC} is led elsewhere now")

    def _broker_channel(self, cluster: ClusterMetadataCache) -> BrokerChannel:
        if self._channel is None:
            self._channel = BrokerChannel(cluster)
        return self._channel

    def _coordinator_epoch(self, transactional_id: str) -> int:
        """The epoch markers carry: in a cluster, the leader epoch of the id's
        ``__transaction_state`` partition, which grows each time another broker takes the
        coordination over (so a former coordinator's late markers are refused)."""
        if self.replicas.cluster is None or self.runtime.topic_info is None:
            return self.coordinator_epoch
        index = partition_for(transactional_id, self.runtime.topic_info.partitions)
        return max(self.replicas.cluster.leadership(TRANSACTION_TOPIC, index).epoch, 0)

    async def _write_remote_marker(
        self,
        markers: WriteMarkers,
        topic: str,
        index: int,
        commit: bool,
        cluster: ClusterMetadataCache,
    ) -> bool:
        """Send the marker to the partition's leader; True once it is written or refused for
        good (a newer producer or coordinator epoch decided there), False to retry."""
        leader = cluster.leadership(topic, index).leader
        if leader < 0:
            return False
        try:
            code = await self._broker_channel(cluster).write(
                leader,
                topic,
                index,
                markers.producer_id,
                markers.producer_epoch,
                self._coordinator_epoch(markers.then.transactional_id),
                commit,
            )
        except Exception as e:
            log.warning(
                "marker for %s-%d to broker %d failed, retrying: %s", topic, index, leader, e
            )
            return False
        if code == ErrorCode.NONE:
            return True
        if code in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED):
            log.warning(
                "marker for producer %d in %s-%d refused by broker %d: %s",
                markers.producer_id,
                topic,
                index,
                leader,
                code.name,
            )
            return True
        return False  # moved meanwhile, or not writable yet: retried

    # --- the sweeper -------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        next_expiry = time.monotonic() + self.config.expire_interval_ms / 1000
        while True:
            await asyncio.sleep(self.config.abort_interval_ms / 1000)
            try:
                await self.abort_timed_out()
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + self.config.expire_interval_ms / 1000
                    await self.expire_transactional_ids()
            except Exception:
                log.exception("transaction sweeper")

    async def abort_timed_out(self) -> int:
        """Abort (with an epoch bump) every transaction open past its timeout; how many."""
        now = self.clock_ms()
        count = 0
        for m in tm.timed_out_transactions(self.transactions.values(), now, pending=self._pending):
            txn_id = m.transactional_id
            transition = tm.abort_timed_out_transaction(
                self.transactions.get(txn_id),
                m.producer_id,
                now,
                pending=self._pending.get(txn_id),
                has_failed_epoch_fence=txn_id in self._failed_fence,
            )
            if transition is None:
                continue
            log.info(
                "aborting the transaction of %s (producer %d): open longer than %d ms",
                txn_id,
                m.producer_id,
                m.txn_timeout_ms,
            )
            if await self._apply(transition) == ErrorCode.NONE:
                count += 1
        return count

    async def expire_transactional_ids(self) -> int:
        """Forget transactional ids idle past ``transactional.id.expiration.ms`` (a tombstone
        each); how many."""
        expired = tm.expired_transactional_ids(
            self.transactions.values(),
            self.clock_ms(),
            expiration_ms=self.config.id_expiration_ms,
            pending=self._pending,
        )
        for txn_id in expired:
            current = self.transactions.get(txn_id)
            if current is None:
                continue
            self._pending[txn_id] = TransactionState.DEAD
            try:
                error = await self.runtime.append(
                    txn_id,
                    [(transaction_log.encode_key(transaction_log.TransactionLogKey(txn_id)), None)],
                    what=f"transactional id {txn_id}",
                )
            finally:
                self._pending.pop(txn_id, None)
            if error == ErrorCode.NONE and self.transactions.get(txn_id) == current:
                del self.transactions[txn_id]
        return len(expired)
