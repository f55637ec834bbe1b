"""GroupCoordinator: consumer groups, kept in ``__consumer_offsets`` with their committed offsets.

This broker coordinates every group. A group lives in partition
``abs(javaHashCode(group_id)) % partitions`` of ``__consumer_offsets`` (Kafka's placement); its
state changes and offset commits are appended there as Kafka's coordinator records
(:mod:`automq_py.coordinator.records`) and answered once durable, so the broker keeps no state
of its own: on start every partition is read back (requests for a group whose partition is
still loading get COORDINATOR_LOAD_IN_PROGRESS). The topic is created on first use, as Kafka
does, with ``offsets.topic.num.partitions`` partitions. Creating, loading and appending are the
:class:`~automq_py.coordinator.runtime.CoordinatorRuntime`'s job; this module says what the
groups' records mean, :mod:`automq_py.coordinator.offsets` what the offsets' do (Kafka's
GroupMetadataManager and OffsetMetadataManager).

Two protocols share the group namespace:

* the classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) with Kafka's rules:
  generations, KIP-394 member ids, static membership (KIP-345), the initial rebalance delay,
  session and rebalance timeouts (:mod:`automq_py.coordinator.classic_protocol`; the group
  itself is :class:`~automq_py.coordinator.classic_group.ClassicGroup`);
* the consumer protocol of KIP-848 (ConsumerGroupHeartbeat) with server-side assignors
  (:mod:`automq_py.coordinator.consumer_group`).

Everything runs on the event loop; a sweeper task expires members whose session ended and,
every ``offsets.retention.check.interval.ms``, offsets past ``offsets.retention.minutes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from automq_py.config import BrokerConfig, ConfigError
from automq_py.coordinator import migration, records
from automq_py.coordinator.assignors import ASSIGNORS
from automq_py.coordinator.classic_group import (
    CONSUMER_PROTOCOL_TYPE,
    ClassicGroup,
    ClassicState,
    JoinResult,
    SyncResult,
)
from automq_py.coordinator.classic_protocol import ClassicProtocol, JoinRequest
from automq_py.coordinator.consumer_group import ClassicJoin, ConsumerGroup
from automq_py.coordinator.consumer_protocol import serialize_assignment
from automq_py.coordinator.offsets import (
    Group,
    OffsetManager,
    append_group_records,
    group_key,
    group_ready,
)
from automq_py.coordinator.runtime import CoordinatorRuntime
from automq_py.replica_manager import ReplicaManager
from automq_py.topics import TopicRegistry
from protocol import control_records
from protocol.errors import ErrorCode
from protocol.record_batch import RecordBatchHeader
from protocol.records import Record

log = logging.getLogger("automq.coordinator")

OFFSETS_TOPIC = "__consumer_offsets"
# Kafka's settings for the offsets topic (GroupCoordinator.offsetsTopicConfigs)
OFFSETS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(100 * 1024 * 1024),
    "compression.type": "producer",
}
NO_OFFSET = -1
SWEEP_INTERVAL_S = 0.1


@dataclass(slots=True, frozen=True)
class GroupConfig:
    """The group settings, from the broker's properties (Kafka's names and defaults)."""

    offsets_partitions: int = 50
    offsets_segment_bytes: int = 100 * 1024 * 1024
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = (1 << 31) - 1
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    consumer_session_timeout_ms: int = 45_000
    consumer_heartbeat_interval_ms: int = 5000
    consumer_max_size: int = (1 << 31) - 1
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    # group.consumer.migration.policy, lower-cased
    migration_policy: str = "bidirectional"

    @property
    def upgrade_enabled(self) -> bool:
        return self.migration_policy in ("upgrade", "bidirectional")

    @property
    def downgrade_enabled(self) -> bool:
        return self.migration_policy in ("downgrade", "bidirectional")

    @classmethod
    def from_broker(cls, config: BrokerConfig) -> GroupConfig:
        unknown = [a for a in config.group_consumer_assignors if a not in ASSIGNORS]
        if unknown or not config.group_consumer_assignors:
            raise ConfigError(
                f"group.consumer.assignors: unknown assignor(s) {', '.join(unknown) or '(none)'}; "
                f"choose from {', '.join(ASSIGNORS)}"
            )
        if config.group_min_session_timeout_ms > config.group_max_session_timeout_ms:
            raise ConfigError(
                "group.min.session.timeout.ms must not exceed group.max.session.timeout.ms"
            )
        return cls(
            offsets_partitions=config.offsets_topic_num_partitions,
            offsets_segment_bytes=config.offsets_topic_segment_bytes,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            max_size=config.group_max_size,
            offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            retention_check_interval_ms=config.offsets_retention_check_interval_ms,
            offset_metadata_max_bytes=config.offset_metadata_max_bytes,
            consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
            consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            consumer_max_size=config.group_consumer_max_size,
            consumer_assignors=config.group_consumer_assignors,
            migration_policy=config.group_consumer_migration_policy.lower(),
        )


@dataclass(slots=True, frozen=True)
class GroupOverview:
    group_id: str
    protocol_type: str
    state: str
    group_type: str  # "classic" or "consumer"


class GroupCoordinator:
    def __init__(
        self,
        config: GroupConfig,
        topics: TopicRegistry,
        replicas: ReplicaManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.topics = topics
        self.replicas = replicas
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.runtime = CoordinatorRuntime(
            OFFSETS_TOPIC,
            config.offsets_partitions,
            {**OFFSETS_TOPIC_CONFIGS, "segment.bytes": str(config.offsets_segment_bytes)},
            topics,
            replicas,
            self,
        )
        self.offsets = OffsetManager(
            self.runtime,
            topics,
            self.groups,
            self._drop_group,
            metadata_max_bytes=config.offset_metadata_max_bytes,
            retention_ms=config.offsets_retention_ms,
            clock=clock,
        )
        self.classic = ClassicProtocol(config, self.groups, self.runtime, clock, self)
        # the classic protocol's requests
        self.join_group = self.classic.join_group
        self.sync_group = self.classic.sync_group
        self.heartbeat = self.classic.heartbeat
        self.leave_group = self.classic.leave_group
        self._sweeper: asyncio.Task[None] | None = None
        # groups whose conversion back to the classic protocol is being written
        self._downgrading: set[str] = set()
        self._expiring_offsets: asyncio.Task[object] | None = None
        self._next_retention_check = 0.0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start loading ``__consumer_offsets`` (if it exists) and the sweeper."""
        self.runtime.start()
        self._next_retention_check = self.clock() + self.config.retention_check_interval_ms / 1000
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def stop(self) -> None:
        await self.runtime.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for group in self.groups.values():
            if isinstance(group, ClassicGroup):
                self.classic.abandon(group)

    # --- the offsets topic -------------------------------------------------------------------

    async def find_coordinator(self) -> ErrorCode:
        """Make sure the offsets topic exists (FindCoordinator for a group)."""
        return await self.runtime.ensure_topic()

    # --- loading (the runtime's Replayer) ----------------------------------------------------

    def replay_batch(
        self, partition: int, header: RecordBatchHeader, recs: Sequence[Record]
    ) -> None:
        if header.is_control:
            if recs:
                try:
                    marker = control_records.decode_marker(recs[0].key, recs[0].value)
                except ValueError as e:
                    log.warning("skipping a bad %s marker: %s", OFFSETS_TOPIC, e)
                    return
                self.offsets.complete_transaction(header.producer_id, marker.is_commit, partition)
            return
        if header.is_transactional:
            for rec in recs:
                if rec.key is not None:
                    self._replay_txn_offset(header.producer_id, rec.key, rec.value)
            return
        for rec in recs:
            if rec.key is not None:
                self._replay(rec.key, rec.value)

    def _replay_txn_offset(self, producer_id: int, raw_key: bytes, raw_value: bytes | None) -> None:
        try:
            key = records.decode_key(raw_key)
            value = records.decode_value(key, raw_value) if key is not None else None
        except records.RecordFormatError as e:
            log.warning("skipping a bad transactional %s record: %s", OFFSETS_TOPIC, e)
            return
        if isinstance(key, records.OffsetKey) and isinstance(value, records.OffsetValue):
            self.offsets.replay_txn(producer_id, key, value)

    def partition_unloaded(self, partition: int) -> None:
        # the partition's groups are coordinated by its new leader: members waiting here are
        # told to find it
        for group_id in [g for g in self.groups if self.runtime.owns(g, partition)]:
            group = self.groups.pop(group_id)
            if isinstance(group, ClassicGroup):
                self.classic.abandon(group)
        self.offsets.unload(lambda group_id: self.runtime.owns(group_id, partition))

    def partition_loaded(self, partition: int) -> None:
        # members read back from the log get a full session from now
        now = self.clock()
        for group_id, group in self.groups.items():
            if not self.runtime.owns(group_id, partition):
                continue
            if isinstance(group, ClassicGroup):
                for member in group.members.values():
                    member.deadline = now + member.session_timeout_ms / 1000
            else:
                default = self.config.consumer_session_timeout_ms / 1000
                for consumer in group.members.values():
                    consumer.deadline = now + (consumer.session_timeout_s or default)

    def _replay(self, raw_key: bytes, raw_value: bytes | None) -> None:
        try:
            key = records.decode_key(raw_key)
            if key is None:
                return
            value = records.decode_value(key, raw_value)
        except records.RecordFormatError as e:
            log.warning("skipping a bad %s record: %s", OFFSETS_TOPIC, e)
            return
        now = self.clock()
        match key:
            case records.OffsetKey():
                self.offsets.replay(key, value if isinstance(value, records.OffsetValue) else None)
            case records.GroupKey(group_id):
                if isinstance(value, records.GroupValue):
                    self.groups[group_id] = ClassicGroup.from_record(group_id, value, now)
                elif isinstance(self.groups.get(group_id), ClassicGroup):
                    del self.groups[group_id]
            case records.ConsumerGroupKey(group_id):
                if isinstance(value, records.ConsumerGroupValue):
                    found = self.groups.get(group_id)
                    group = found if isinstance(found, ConsumerGroup) else ConsumerGroup(group_id)
                    # the target's epoch is a record of its own (none: computed anew)
                    group.group_epoch = group.stored_epoch = value.epoch
                    self.groups[group_id] = group
                elif isinstance(self.groups.get(group_id), ConsumerGroup):
                    del self.groups[group_id]
            case (
                records.ConsumerMemberKey(group=group_id)
                | records.TargetEpochKey(group=group_id)
                | records.RegexKey(group=group_id)
            ):
                found = self.groups.get(group_id)
                if found is None and raw_value is not None:
                    found = self.groups[group_id] = ConsumerGroup(group_id)
                if isinstance(found, ConsumerGroup):
                    found.replay(
                        key, raw_value, value, now, self.config.consumer_session_timeout_ms
                    )

    async def _append(
        self, group_id: str, entries: Sequence[tuple[records.Key, bytes | None]]
    ) -> ErrorCode:
        """Append coordinator records for ``group_id``, durably; the error to answer with."""
        return await append_group_records(self.runtime, group_id, entries)

    # --- the sweeper -------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            self._expire_members()
            if self.clock() >= self._next_retention_check:
                self._next_retention_check = (
                    self.clock() + self.config.retention_check_interval_ms / 1000
                )
                # a task of its own: its appends may wait for the WAL, sessions may not
                if self._expiring_offsets is None or self._expiring_offsets.done():
                    self._expiring_offsets = self.runtime.spawn(
                        self.offsets.expire(), "expiring committed offsets"
                    )

    def _expire_members(self) -> None:
        now = self.clock()
        for group in list(self.groups.values()):
            try:
                if isinstance(group, ConsumerGroup):
                    expired = group.expire_members(now)
                    if expired:
                        log.info(
                            "group %s: session of %s expired", group.group_id, ", ".join(expired)
                        )
                        self.runtime.spawn(
                            self.store_consumer_group(group), f"storing group {group.group_id}"
                        )
                else:
                    self.classic.expire(group, now)
            except Exception:  # the other groups' sessions still expire
                log.exception("group %s: expiring its members", group.group_id)

    def _drop_group(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        self.offsets.forget(group_id)
        if isinstance(group, ClassicGroup):
            self.classic.close(group)

    # --- admin -------------------------------------------------------------------------------

    async def list_groups(
        self, states: Iterable[str] = (), types: Iterable[str] = ()
    ) -> tuple[ErrorCode, list[GroupOverview]]:
        error = await self.runtime.all_ready()
        if error != ErrorCode.NONE:
            return error, []
        wanted_states = {s.lower() for s in states}
        wanted_types = {t.lower() for t in types}
        out = []
        for group_id, group in sorted(self.groups.items()):
            overview = self.overview(group_id, group)
            if wanted_states and overview.state.lower() not in wanted_states:
                continue
            if wanted_types and overview.group_type.lower() not in wanted_types:
                continue
            out.append(overview)
        return ErrorCode.NONE, out

    def overview(self, group_id: str, group: Group) -> GroupOverview:
        if isinstance(group, ConsumerGroup):
            return GroupOverview(group_id, "consumer", group.state, "consumer")
        return GroupOverview(group_id, group.protocol_type or "", group.state.value, "classic")

    async def describe_group(self, group_id: str) -> tuple[ErrorCode, Group | None]:
        # "" too, as in Kafka: a simple group an old client committed under it can be seen
        error = await group_ready(self.runtime, group_id, allow_empty_id=True)
        if error != ErrorCode.NONE:
            return error, None
        return ErrorCode.NONE, self.groups.get(group_id)

    async def delete_groups(self, group_ids: Sequence[str]) -> list[ErrorCode]:
        out: list[ErrorCode] = []
        for group_id in group_ids:
            error = await group_ready(self.runtime, group_id, allow_empty_id=True)  # as Describe
            if error != ErrorCode.NONE:
                out.append(error)
                continue
            group = self.groups.get(group_id)
            if group is None or (isinstance(group, ClassicGroup) and group.is_(ClassicState.DEAD)):
                out.append(ErrorCode.GROUP_ID_NOT_FOUND)
                continue
            if (isinstance(group, ClassicGroup) and not group.is_(ClassicState.EMPTY)) or (
                isinstance(group, ConsumerGroup) and group.members
            ):
                out.append(ErrorCode.NON_EMPTY_GROUP)
                continue
            entries = self.offsets.tombstones(group_id)
            entries.append((group_key(group_id, group), None))
            error = await self._append(group_id, entries)
            if error == ErrorCode.NONE:
                self._drop_group(group_id)
                log.info("group %s deleted", group_id)
            out.append(error)
        return out

    # --- consumer protocol (KIP-848) ---------------------------------------------------------

    async def consumer_group(
        self, group_id: str, create: bool = True
    ) -> tuple[ErrorCode, ConsumerGroup | None, str | None]:
        """The consumer-protocol group ``group_id``; when there is none and ``create``, a new
        one, or the one a classic group becomes (empty, or of consumers moving to the
        consumer protocol, :mod:`~automq_py.coordinator.migration`), which
        :meth:`add_consumer_group` registers once a heartbeat made a member of it (Kafka's
        getOrMaybeCreateConsumerGroup: a refused heartbeat leaves no group behind). Else the
        error to answer with, and why."""
        if not group_id:
            return ErrorCode.INVALID_REQUEST, None, None
        error = await group_ready(self.runtime, group_id)
        if error != ErrorCode.NONE:
            return error, None, None
        found = self.groups.get(group_id)
        if isinstance(found, ConsumerGroup):
            return ErrorCode.NONE, found, None
        if found is None or (isinstance(found, ClassicGroup) and found.is_(ClassicState.EMPTY)):
            if create:
                return ErrorCode.NONE, ConsumerGroup(group_id), None
            return ErrorCode.GROUP_ID_NOT_FOUND, None, f"Consumer group {group_id} not found."
        refusal: str | None = f"Group {group_id} is not a consumer group."
        if create:
            refusal = migration.upgrade_refusal(
                found, self.config.upgrade_enabled, self.config.consumer_max_size
            )
            if refusal is None:
                try:
                    return (
                        ErrorCode.NONE,
                        migration.upgraded(found, self.resolve, self.clock()),
                        None,
                    )
                except migration.MigrationRefused as e:
                    refusal = str(e)
        return ErrorCode.GROUP_ID_NOT_FOUND, None, refusal

    def resolve(self, wanted: set[str]) -> dict[str, tuple[uuid.UUID, int]]:
        """The topics of ``wanted`` that exist: name -> (topic id, partition count)."""
        out = {}
        for name in wanted:
            info = self.topics.get(name)
            if info is not None:
                out[name] = (info.topic_id, info.partitions)
        return out

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        info = self.topics.by_id(topic_id)
        return None if info is None else info.name

    def add_consumer_group(self, group: ConsumerGroup) -> None:
        """Register ``group`` (of :meth:`consumer_group`) if it is new: in place of a classic
        group of its id (whose record its next store deletes; members waiting for a join or
        a sync are told to rejoin), or of none."""
        found = self.groups.get(group.group_id)
        if found is group:
            return
        if isinstance(found, ClassicGroup):
            group.replaces_classic = True
            if found.members:
                log.info("group %s: upgraded from the classic protocol", group.group_id)
            self.classic.hand_over(found)
        self.groups[group.group_id] = group

    async def store_consumer_group(self, group: ConsumerGroup) -> ErrorCode:
        """Append what changed of the group since it was last stored: its epoch, then its
        members' records (the error to answer with). A group all of whose members speak the
        classic protocol now turns back into a classic group, if the policy allows."""
        if self.groups.get(group.group_id) is not group:
            # converted or unloaded meanwhile: what is written of the group now is another's
            log.debug("group %s: not stored, it is no longer this object", group.group_id)
            return ErrorCode.NONE
        if group.group_id in self._downgrading:
            return ErrorCode.NONE
        if migration.downgrade_allowed(group, self.config.downgrade_enabled, self.config.max_size):
            return await self._downgrade(group)
        entries: list[tuple[records.Key, bytes | None]] = []
        if group.replaces_classic:
            entries.append((records.GroupKey(group.group_id), None))
        epoch = group.group_epoch
        if epoch != group.stored_epoch:
            value = records.encode_consumer_group_value(records.ConsumerGroupValue(epoch))
            entries.append((records.ConsumerGroupKey(group.group_id), value))
        members = group.changed_records()
        if not entries and not members:
            return ErrorCode.NONE
        try:
            error = await self._append(group.group_id, entries + members)
        except BaseException:  # cancelled: whether they were appended is not known
            group.not_stored(members)  # the next store writes them (again)
            raise
        if error == ErrorCode.NONE:
            group.stored_epoch = max(group.stored_epoch, epoch)
            group.replaces_classic = False
            group.stored(members)
        else:
            group.not_stored(members)
        return error

    async def _downgrade(self, group: ConsumerGroup) -> ErrorCode:
        """Turn ``group`` back into a classic group: its records deleted, the classic group's
        written, then a rebalance (Kafka's convertToClassicGroup)."""
        now_ms = int(time.time() * 1000)
        classic = migration.downgraded(group, self.topic_name, self.clock(), now_ms)
        entries = group.tombstones()
        entries.append(
            (records.GroupKey(group.group_id), records.encode_group_value(classic.to_record()))
        )
        # written first: a failed append leaves the group as it is, for the next store to try;
        # meanwhile the group's other stores leave the conversion to this one
        self._downgrading.add(group.group_id)
        try:
            error = await self._append(group.group_id, entries)
        finally:
            self._downgrading.discard(group.group_id)
        if error != ErrorCode.NONE or self.groups.get(group.group_id) is not group:
            return error
        self.groups[group.group_id] = classic
        log.info(
            "group %s: downgraded to the classic protocol at generation %d",
            group.group_id,
            classic.generation_id,
        )
        self.classic.rebalance(
            classic,
            f"Downgrade group {group.group_id} from consumer to classic for member leaving.",
        )
        return ErrorCode.NONE

    # --- classic members of a consumer-protocol group (the ClassicProtocol's ConsumerSide) ---

    async def classic_join(self, group: ConsumerGroup, req: JoinRequest) -> JoinResult:
        answer = group.classic_join(
            ClassicJoin(
                req.member_id,
                req.group_instance_id,
                req.client_id,
                req.client_host,
                req.session_timeout_ms,
                req.rebalance_timeout_ms,
                req.protocol_type,
                tuple(req.protocols),
                req.require_known_member_id,
            ),
            self.clock(),
            self.resolve,
            self.config.consumer_assignors,
            self.config.consumer_max_size,
        )
        if answer.error != ErrorCode.NONE:
            if answer.message:
                log.info("group %s: JoinGroup refused: %s", group.group_id, answer.message)
            return JoinResult(answer.error, answer.member_id)
        error = await self.store_consumer_group(group)
        if error != ErrorCode.NONE:
            return JoinResult(error, answer.member_id)
        # every classic member is a follower: the broker assigns
        return JoinResult(
            ErrorCode.NONE,
            answer.member_id,
            answer.generation_id,
            CONSUMER_PROTOCOL_TYPE,
            answer.protocol_name,
        )

    async def classic_sync(
        self,
        group: ConsumerGroup,
        member_id: str,
        instance_id: str | None,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> SyncResult:
        answer = group.classic_sync(
            member_id, instance_id, generation_id, protocol_type, protocol_name, self.clock()
        )
        if answer.error != ErrorCode.NONE or answer.assignment is None:
            return SyncResult(answer.error)
        # answered once what the join changed is durable
        error = await self.store_consumer_group(group)
        if error != ErrorCode.NONE:
            return SyncResult(error)
        named = [(self.topic_name(t), parts) for t, parts in answer.assignment.items()]
        assignment = [(name, parts) for name, parts in named if name is not None]
        return SyncResult(
            ErrorCode.NONE,
            protocol_type,
            protocol_name,
            serialize_assignment(assignment, answer.assignment_version),
        )

    def classic_heartbeat(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None, generation_id: int
    ) -> ErrorCode:
        return group.classic_heartbeat(member_id, instance_id, generation_id, self.clock()).error

    async def classic_leave(
        self, group: ConsumerGroup, members: Sequence[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        out = [
            group.classic_leave(member_id, instance_id).error for member_id, instance_id in members
        ]
        if ErrorCode.NONE in out:
            error = await self.store_consumer_group(group)
            if error != ErrorCode.NONE:
                return error, [error] * len(members)
        return ErrorCode.NONE, out
