"""The groups' committed offsets (Kafka's OffsetMetadataManager): OffsetCommit, TxnOffsetCommit,
OffsetFetch, OffsetDelete, the offsets of a deleted topic, and expiry past
``offsets.retention.minutes``.

Offsets are kept in ``__consumer_offsets`` beside the groups' own records (the
:class:`~automq_py.coordinator.group_coordinator.GroupCoordinator` reads both back on load and
hands this module the offset records); a commit is answered once its records are durable.
Offsets committed inside a transaction wait, per producer, until the transaction's marker
reaches the group's partition: COMMIT makes them the group's offsets, ABORT drops them.

A commit checks the group's membership the way Kafka's ``validateOffsetCommit`` does: a
classic group's generation and member, a consumer group's member epoch (OffsetCommit v9+), no
check for a "simple" group that commits without members.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from automq_py.coordinator import records
from automq_py.coordinator.classic_group import ClassicGroup, ClassicState
from automq_py.coordinator.consumer_group import ConsumerGroup
from automq_py.coordinator.runtime import CoordinatorRuntime
from automq_py.topics import TopicRegistry
from protocol.errors import ErrorCode

log = logging.getLogger("automq.coordinator")

Group = ClassicGroup | ConsumerGroup
TopicPartition = tuple[str, int]
Entries = list[tuple[records.Key, bytes | None]]


@dataclass(slots=True, frozen=True)
class OffsetCommit:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None
    # OffsetCommit v2-v4's retention time: the offset expires this long after the commit
    retention_ms: int = -1


@dataclass(slots=True, frozen=True)
class ExpiryRule:
    """How a group's offsets expire (Kafka's ``offsetExpirationCondition``)."""

    # every offset's retention counts from this moment (when an Empty classic group became
    # empty); None: from the offset's own commit
    since_ms: int | None = None
    # topics the members subscribe to: their offsets do not expire
    subscribed: frozenset[str] = frozenset()


def expiry_rule(group: Group | None) -> ExpiryRule | None:
    """The rule ``group``'s offsets expire by, or None while they do not (a classic group
    rebalancing, or one whose members' subscriptions are unknown), as Kafka's groups give it:

    * a simple group (commits only, no protocol) and a consumer group: from each commit,
      keeping the offsets of topics its members subscribe to;
    * an Empty classic group: all of them once it has been empty for the retention;
    * a Stable classic group of the consumer protocol: the topics none of its members
      subscribes to, from each commit.
    """
    if isinstance(group, ConsumerGroup):
        return ExpiryRule(None, frozenset(group.subscribed_topic_names()))
    if not isinstance(group, ClassicGroup) or not group.protocol_type:
        return ExpiryRule()
    if group.is_(ClassicState.EMPTY):
        since = group.state_timestamp_ms
        return ExpiryRule(since if since >= 0 else None)  # -1: a record without the moment
    if group.is_(ClassicState.STABLE):
        topics = group.subscribed_topics()
        if topics is not None:
            return ExpiryRule(None, frozenset(topics))
    return None


def expired_offsets(
    offsets: Mapping[TopicPartition, records.OffsetValue],
    now_ms: int,
    retention_ms: int,
    rule: ExpiryRule,
    pending: Collection[TopicPartition] = (),
) -> list[TopicPartition]:
    """The offsets past ``retention_ms`` by ``rule``; an offset with an explicit expiry time
    (OffsetCommit v1-v4) expires then instead, and one with a transactional commit ``pending``
    waits for its transaction."""
    out = []
    for tp, value in offsets.items():
        if tp[0] in rule.subscribed or tp in pending:
            continue
        if value.expire_timestamp >= 0:
            expired = now_ms >= value.expire_timestamp
        else:
            base = value.commit_timestamp if rule.since_ms is None else rule.since_ms
            expired = now_ms - base >= retention_ms
        if expired:
            out.append(tp)
    return out


def validate_commit(
    group: Group | None,
    generation_or_epoch: int,
    member_id: str,
    group_instance_id: str | None,
    api_version: int,
    *,
    transactional: bool = False,
) -> ErrorCode:
    """Whether this member may commit offsets for ``group`` (None: the group is unknown); a
    ``transactional`` commit (TxnOffsetCommit) also while the group completes a rebalance, as
    in Kafka (the producer's transaction would otherwise fail for good)."""
    if group is None:
        if generation_or_epoch < 0:
            return ErrorCode.NONE  # a "simple" group: commits without membership
        return ErrorCode.GROUP_ID_NOT_FOUND if api_version >= 9 else ErrorCode.ILLEGAL_GENERATION
    if isinstance(group, ConsumerGroup):
        if generation_or_epoch < 0 and not group.members:
            return ErrorCode.NONE  # the admin client, or a consumer outside the group
        error = group.validate_member_epoch(
            member_id, generation_or_epoch, None if transactional else api_version
        )
        if transactional and error == ErrorCode.STALE_MEMBER_EPOCH:
            return ErrorCode.ILLEGAL_GENERATION  # TxnOffsetCommit has no STALE_MEMBER_EPOCH
        return error
    if group.is_(ClassicState.DEAD):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if generation_or_epoch < 0 and group.is_(ClassicState.EMPTY):
        return ErrorCode.NONE
    if generation_or_epoch >= 0 or member_id or group_instance_id is not None:
        error = group.validate_member(member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return error
        if generation_or_epoch != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
    elif not group.is_(ClassicState.EMPTY):
        return ErrorCode.UNKNOWN_MEMBER_ID
    if not transactional and group.is_(ClassicState.COMPLETING_REBALANCE):
        return ErrorCode.REBALANCE_IN_PROGRESS
    return ErrorCode.NONE


async def append_group_records(
    runtime: CoordinatorRuntime,
    group_id: str,
    entries: Sequence[tuple[records.Key, bytes | None]],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
) -> ErrorCode:
    """Append coordinator records for ``group_id``, durably (in ``producer_id``'s transaction
    if given); the error to answer with."""
    return await runtime.append(
        group_id,
        [(records.encode_key(key), value) for key, value in entries],
        what=f"group {group_id}",
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )


async def group_ready(
    runtime: CoordinatorRuntime, group_id: str, *, allow_empty_id: bool = False
) -> ErrorCode:
    """NONE when ``group_id``'s partition is loaded; else the error to answer with. An empty
    group id is INVALID_GROUP_ID, except where Kafka still accepts it for old clients
    (OffsetCommit, OffsetFetch)."""
    if not group_id and not allow_empty_id:
        return ErrorCode.INVALID_GROUP_ID
    return await runtime.ready(group_id)


def _now_ms() -> int:
    return int(time.time() * 1000)


class OffsetManager:
    """The committed offsets of the groups this broker coordinates.

    ``groups`` is the coordinator's own table (a commit to an unknown group creates an empty
    classic one there, as Kafka does); ``drop_group`` removes a group whose last offsets
    expired while it was empty."""

    def __init__(
        self,
        runtime: CoordinatorRuntime,
        topics: TopicRegistry,
        groups: dict[str, Group],
        drop_group: Callable[[str], None],
        *,
        metadata_max_bytes: int,
        retention_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: the monotonic seconds the classic members' session deadlines are in."""
        self.runtime = runtime
        self.clock = clock
        self.topics = topics
        self.groups = groups
        self._drop_group = drop_group
        self.metadata_max_bytes = metadata_max_bytes
        self.retention_ms = retention_ms
        # group -> partition -> committed offset
        self.committed: dict[str, dict[TopicPartition, records.OffsetValue]] = {}
        # offsets committed inside transactions, not yet decided: producer id -> group -> ...
        self.pending: dict[int, dict[str, dict[TopicPartition, records.OffsetValue]]] = {}

    # --- loading -----------------------------------------------------------------------------

    def replay(self, key: records.OffsetKey, value: records.OffsetValue | None) -> None:
        """An offset record read back (a tombstone: the offset was deleted or expired)."""
        stored = self.committed.setdefault(key.group, {})
        if value is None:
            stored.pop((key.topic, key.partition), None)
            self._drop_pending(key.group, [(key.topic, key.partition)])
            return
        stored[(key.topic, key.partition)] = value
        if key.group not in self.groups:
            self.groups[key.group] = ClassicGroup(key.group, value.commit_timestamp)

    def replay_txn(
        self, producer_id: int, key: records.OffsetKey, value: records.OffsetValue
    ) -> None:
        """An offset record of ``producer_id``'s transaction read back, undecided so far."""
        groups = self.pending.setdefault(producer_id, {})
        groups.setdefault(key.group, {})[(key.topic, key.partition)] = value

    def unload(self, owned: Callable[[str], bool]) -> None:
        """Forget the offsets of the groups ``owned`` says moved away."""
        for group_id in [g for g in self.committed if owned(g)]:
            del self.committed[group_id]
        for pending in self.pending.values():
            for group_id in [g for g in pending if owned(g)]:
                del pending[group_id]

    def forget(self, group_id: str) -> None:
        """The group was deleted: its offsets with it, those pending in transactions too."""
        self.committed.pop(group_id, None)
        for groups in self.pending.values():
            groups.pop(group_id, None)

    def _drop_pending(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        """Tombstones of ``partitions`` were written: offsets of them committed in transactions
        not yet decided go too (Kafka replays an offset tombstone so), and never materialize."""
        for groups in self.pending.values():
            found = groups.get(group_id)
            if found:
                for tp in partitions:
                    found.pop(tp, None)

    # --- commits -----------------------------------------------------------------------------

    async def commit(
        self,
        group_id: str,
        generation_or_epoch: int,
        member_id: str,
        group_instance_id: str | None,
        commits: Sequence[OffsetCommit],
        api_version: int,
    ) -> list[ErrorCode]:
        """OffsetCommit: one error per commit, in order. A partition that does not exist is
        UNKNOWN_TOPIC_OR_PARTITION whatever the group says, and when none exists the group is
        not asked (Kafka's KafkaApis answers them before the coordinator)."""
        unknown = [not self._exists(c.topic, c.partition) for c in commits]
        if all(unknown):
            return [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * len(commits)
        error = await group_ready(self.runtime, group_id, allow_empty_id=True)
        if error == ErrorCode.NONE:
            group = self.groups.get(group_id)
            error = validate_commit(
                group, generation_or_epoch, member_id, group_instance_id, api_version
            )
        if error != ErrorCode.NONE:
            return [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if u else error for u in unknown]
        if isinstance(group, ClassicGroup) and group.is_(
            ClassicState.STABLE, ClassicState.PREPARING_REBALANCE
        ):
            # a member's commit keeps its session alive, as its heartbeat does (Kafka's
            # validateOffsetCommit reschedules the member's heartbeat)
            member = group.members.get(member_id)
            if member is not None:
                member.deadline = self.clock() + member.session_timeout_ms / 1000
        now = _now_ms()
        results, entries, values = self._offset_records(group_id, commits, now)
        if entries:
            error = await append_group_records(self.runtime, group_id, entries)
            if error == ErrorCode.UNKNOWN_SERVER_ERROR:
                error = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
            if error != ErrorCode.NONE:
                return [error if r == ErrorCode.NONE else r for r in results]
            if not self.runtime.coordinates(group_id):
                return results  # unloaded meanwhile: the new coordinator loads the commit
            if group_id not in self.groups:
                self.groups[group_id] = ClassicGroup(group_id, now)
            self.committed.setdefault(group_id, {}).update(values)
        return results

    def _exists(self, topic_name: str, partition: int) -> bool:
        topic = self.topics.get(topic_name)
        return topic is not None and 0 <= partition < topic.partitions

    def _offset_records(
        self, group_id: str, commits: Sequence[OffsetCommit], now: int
    ) -> tuple[list[ErrorCode], Entries, dict[TopicPartition, records.OffsetValue]]:
        """Each commit checked (the partition exists, the metadata fits): one error per commit,
        and the records and values of the valid ones."""
        results: list[ErrorCode] = []
        entries: Entries = []
        values: dict[TopicPartition, records.OffsetValue] = {}
        for c in commits:
            metadata = c.metadata or ""
            # Kafka compares String.length(): UTF-16 code units, not bytes
            length = len(metadata.encode("utf-16-le")) // 2
            if not self._exists(c.topic, c.partition):
                results.append(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif length > self.metadata_max_bytes:
                results.append(ErrorCode.OFFSET_METADATA_TOO_LARGE)
            else:
                expire = now + c.retention_ms if c.retention_ms >= 0 else records.NO_TIMESTAMP
                value = records.OffsetValue(c.offset, c.leader_epoch, metadata, now, expire)
                key = records.OffsetKey(group_id, c.topic, c.partition)
                entries.append((key, records.encode_offset_value(value)))
                values[(c.topic, c.partition)] = value
                results.append(ErrorCode.NONE)
        return results, entries, values

    async def commit_txn(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        commits: Sequence[OffsetCommit],
        verify: Callable[[TopicPartition], Awaitable[ErrorCode]] | None = None,
    ) -> list[ErrorCode]:
        """TxnOffsetCommit: offsets written as part of ``producer_id``'s transaction, visible
        once its COMMIT marker reaches this group's partition (:meth:`complete_transaction`).
        One error per commit, in order.

        ``verify`` asks the transaction coordinator whether the group's offsets partition is
        in the transaction (KIP-890 part 1), unless the producer already wrote to it in this
        transaction: offsets written outside one would stay pending for ever, as no marker
        would end them. It answers the error to give the client."""
        error = await group_ready(self.runtime, group_id)
        if error != ErrorCode.NONE:
            return [error] * len(commits)
        if verify is not None:
            error = await self._verify_in_txn(group_id, producer_id, verify)
            if error != ErrorCode.NONE:
                return [error] * len(commits)
        group = self.groups.get(group_id)
        if group is None and generation_id >= 0:
            # a generation of a group this coordinator does not know (Kafka's
            # validateTransactionalOffsetCommit); -1 makes a simple group, as OffsetCommit does
            return [ErrorCode.ILLEGAL_GENERATION] * len(commits)
        if group is not None and (generation_id >= 0 or member_id or group_instance_id):
            # v3+ carries the member: checked as an OffsetCommit's would be
            error = validate_commit(
                group, generation_id, member_id, group_instance_id, 8, transactional=True
            )
            if error != ErrorCode.NONE:
                return [error] * len(commits)
        now = _now_ms()
        # no retention time: a transaction's offsets expire as the group's do
        results, entries, values = self._offset_records(group_id, commits, now)
        if not entries:
            return results
        error = await append_group_records(
            self.runtime, group_id, entries, producer_id=producer_id, producer_epoch=producer_epoch
        )
        if error == ErrorCode.UNKNOWN_SERVER_ERROR:
            error = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        if error != ErrorCode.NONE:
            return [error if r == ErrorCode.NONE else r for r in results]
        if not self.runtime.coordinates(group_id):
            return results  # unloaded meanwhile: the new coordinator loads the commit
        if group_id not in self.groups:
            self.groups[group_id] = ClassicGroup(group_id, now)  # Kafka creates it too
        self.pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(values)
        return results

    async def _verify_in_txn(
        self,
        group_id: str,
        producer_id: int,
        verify: Callable[[TopicPartition], Awaitable[ErrorCode]],
    ) -> ErrorCode:
        try:
            partition = await self.runtime.partition(group_id)
        except Exception as e:
            log.warning("cannot open the offsets partition of group %s: %s", group_id, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if partition.log.producer_state.ongoing_txn_first_offset(producer_id) >= 0:
            return ErrorCode.NONE
        return await verify((partition.topic, partition.index))

    def complete_transaction(
        self, producer_id: int, commit: bool, partition: int | None = None
    ) -> None:
        """``producer_id``'s transaction was decided and its marker is in offsets topic
        ``partition`` (None: in every partition it wrote to): the offsets it committed for the
        groups that live there become their committed offsets (COMMIT) or are dropped (ABORT),
        as Kafka settles them by the marker's partitions. A committed transactional offset
        replaces the group's offset for the partition even if a plain commit came in between
        (Kafka keeps whichever was appended last)."""
        pending = self.pending.get(producer_id)
        if pending is None:
            return
        if partition is None:
            settled = list(pending)
        else:
            settled = [g for g in pending if self.runtime.owns(g, partition)]
        for group_id in settled:
            values = pending.pop(group_id)
            if commit:
                self.committed.setdefault(group_id, {}).update(values)
        if not pending:
            del self.pending[producer_id]

    def pending_partitions(self, group_id: str) -> set[TopicPartition]:
        """The partitions with an offset committed in a transaction not yet decided (OffsetFetch
        with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for them)."""
        out: set[TopicPartition] = set()
        for groups in self.pending.values():
            out.update(groups.get(group_id, {}))
        return out

    # --- reads and deletes -------------------------------------------------------------------

    async def fetch(
        self,
        group_id: str,
        partitions: Sequence[TopicPartition] | None,
        member_id: str | None = None,
        member_epoch: int = -1,
    ) -> tuple[ErrorCode, list[tuple[TopicPartition, records.OffsetValue | None]]]:
        """OffsetFetch: (group error, [(partition, committed offset or None)]); all partitions
        with a committed offset when ``partitions`` is None."""
        error = await group_ready(self.runtime, group_id, allow_empty_id=True)
        if error != ErrorCode.NONE:
            return error, []
        group = self.groups.get(group_id)
        if member_id is not None and isinstance(group, ConsumerGroup):
            error = group.validate_member_epoch(member_id, member_epoch)
            if error != ErrorCode.NONE:
                return error, []
        stored = self.committed.get(group_id, {})
        if partitions is None:
            return ErrorCode.NONE, sorted(stored.items())
        return ErrorCode.NONE, [(tp, stored.get(tp)) for tp in partitions]

    async def delete(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """OffsetDelete: (group error, one error per partition)."""
        error = await group_ready(self.runtime, group_id)
        if error != ErrorCode.NONE:
            return error, []
        group = self.groups.get(group_id)
        if group is None or (isinstance(group, ClassicGroup) and group.is_(ClassicState.DEAD)):
            return ErrorCode.GROUP_ID_NOT_FOUND, []
        subscribed: set[str] = set()
        if isinstance(group, ClassicGroup) and not group.is_(ClassicState.EMPTY):
            found = group.subscribed_topics()
            if found is None:
                return ErrorCode.NON_EMPTY_GROUP, []
            subscribed = found
        elif isinstance(group, ConsumerGroup):
            subscribed = group.subscribed_topic_names()
        stored = self.committed.get(group_id, {})
        pending = self.pending_partitions(group_id)
        results = []
        gone = []
        for tp in partitions:
            if tp[0] in subscribed:
                results.append(ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)
                continue
            results.append(ErrorCode.NONE)
            if tp in stored or tp in pending:
                gone.append(tp)
        error = await append_group_records(self.runtime, group_id, _tombstones(group_id, gone))
        if error != ErrorCode.NONE:
            return error, []
        for tp in gone:
            stored.pop(tp, None)
        self._drop_pending(group_id, gone)
        return ErrorCode.NONE, results

    async def delete_topic(self, topic: str) -> None:
        """Tombstone every group's offsets of ``topic`` (it was deleted), committed or pending
        in a transaction."""
        group_ids = set(self.committed)
        for groups in self.pending.values():
            group_ids.update(groups)
        for group_id in sorted(group_ids):
            stored = self.committed.get(group_id, {})
            found = set(stored) | self.pending_partitions(group_id)
            gone = sorted(tp for tp in found if tp[0] == topic)
            if not gone:
                continue
            entries = _tombstones(group_id, gone)
            if await append_group_records(self.runtime, group_id, entries) == ErrorCode.NONE:
                for tp in gone:
                    stored.pop(tp, None)
                self._drop_pending(group_id, gone)

    def tombstones(self, group_id: str) -> Entries:
        """The records that delete every offset ``group_id`` has, committed or pending in a
        transaction (DeleteGroups)."""
        found = set(self.committed.get(group_id, {})) | self.pending_partitions(group_id)
        return _tombstones(group_id, sorted(found))

    # --- expiry ------------------------------------------------------------------------------

    async def expire(self) -> int:
        """Tombstone the offsets past retention (:func:`expiry_rule`); delete an empty group left
        with none, and none pending in a transaction (Kafka's cleanupGroupMetadata). Returns how
        many offsets expired."""
        now = _now_ms()
        total = 0
        for group_id in list(self.committed):
            group = self.groups.get(group_id)
            stored = self.committed.get(group_id, {})
            rule = expiry_rule(group)
            if rule is None:
                continue
            pending = self.pending_partitions(group_id)
            gone = expired_offsets(stored, now, self.retention_ms, rule, pending)
            if not gone:
                continue
            entries = _tombstones(group_id, gone)
            drop_group = len(gone) == len(stored) and not pending and _is_empty(group)
            if drop_group:
                entries.append((group_key(group_id, group), None))
            if await append_group_records(self.runtime, group_id, entries) != ErrorCode.NONE:
                continue
            for tp in gone:
                stored.pop(tp, None)
            total += len(gone)
            if drop_group:
                self._drop_group(group_id)
            log.info("group %s: %d offsets expired", group_id, len(gone))
        await self._drop_empty_groups()
        return total

    async def _drop_empty_groups(self) -> None:
        """As Kafka's cleanupGroupMetadata: a group with no members, no committed offsets and
        none pending in a transaction is deleted (a console consumer's group that never
        committed, a join refused MEMBER_ID_REQUIRED), rather than listed for ever."""

        def deletable(group_id: str, group: Group) -> bool:
            return (
                _is_empty(group)
                and self.groups.get(group_id) is group
                and not self.committed.get(group_id)
                and not self.pending_partitions(group_id)
            )

        for group_id, group in list(self.groups.items()):
            if not deletable(group_id, group):
                continue
            entries: Entries = [(group_key(group_id, group), None)]
            if await append_group_records(self.runtime, group_id, entries) != ErrorCode.NONE:
                continue
            if deletable(group_id, group):  # (nobody joined or committed meanwhile)
                self._drop_group(group_id)
                log.info("group %s: empty, with no offsets: deleted", group_id)


def _is_empty(group: Group | None) -> bool:
    """Whether ``group`` has no members (None: a group only offsets name)."""
    if isinstance(group, ClassicGroup):
        return group.is_(ClassicState.EMPTY)
    return group is None or not group.members


def group_key(group_id: str, group: Group | None) -> records.Key:
    """The key of the record that holds ``group``'s own state."""
    if isinstance(group, ConsumerGroup):
        return records.ConsumerGroupKey(group_id)
    return records.GroupKey(group_id)


def _tombstones(group_id: str, partitions: Iterable[TopicPartition]) -> Entries:
    return [(records.OffsetKey(group_id, t, p), None) for t, p in partitions]
