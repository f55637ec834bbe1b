"""A group of the consumer rebalance protocol (KIP-848, ``group.protocol=consumer``).

The broker assigns: each ConsumerGroupHeartbeat updates the member, and when the group's
subscriptions or the subscribed topics' partitions change the *group epoch* goes up and a
server-side assignor (:mod:`automq_py.coordinator.assignors`) computes a new *target
assignment*. Each member then converges to its target on its own heartbeats, as Kafka's
``CurrentAssignmentBuilder`` does:

* partitions it owns but is no longer meant to are revoked first: the member keeps its epoch
  and gets only what it may keep, until a heartbeat reports that it let go of the rest (or its
  rebalance timeout passes and it is fenced);
* partitions meant for it that another member still holds (owns or has yet to revoke) are
  given once released; meanwhile it is at the new epoch with what is free.

Group states, as ConsumerGroupDescribe and ListGroups show them: ``Empty`` (no members),
``Assigning`` (group epoch ahead of the target assignment), ``Reconciling`` (some member not
yet at the target), ``Stable``. Pure logic; the coordinator does the I/O and the clock.

The group is kept in ``__consumer_offsets`` as Kafka keeps it (:mod:`records`): its epoch, the
target assignment's epoch, for each member its metadata, its target and its current
assignment, and what each subscribed regex matched. ``changed_records`` gives what changed
since the last stored; ``replay`` rebuilds the group on the broker that loads the partition, so
that its members go on with their epochs and partitions when the coordinator moves.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from automq_py.coordinator import records
from automq_py.coordinator.assignors import MemberSpec, assign
from automq_py.coordinator.consumer_protocol import (
    ConsumerProtocolError,
    parse_subscription,
)
from protocol.errors import ErrorCode

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

TopicId = uuid.UUID
# topic id -> partitions
Partitions = dict[TopicId, frozenset[int]]
# topic name -> (topic id, partition count): what the subscriptions resolve to
TopicMetadata = dict[str, tuple[TopicId, int]]


class MemberState(enum.Enum):
    # the values Kafka's current-assignment record stores
    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    epoch: int = 0
    previous_epoch: int = 0
    rebalance_timeout_ms: int = 300_000
    subscribed_names: frozenset[str] = frozenset()
    subscribed_regex: str | None = None
    # what the regex matched when last resolved (``ConsumerGroup.heartbeat``)
    regex_topics: frozenset[str] = frozenset()
    server_assignor: str | None = None
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    # what the member was last told (None: nothing yet)
    sent: Partitions | None = None
    deadline: float = 0.0
    revocation_deadline: float | None = None
    # a member of the classic protocol (JoinGroup, SyncGroup, Heartbeat): its session timeout
    # and protocols; None for one of the consumer protocol
    classic: records.ClassicMemberMetadata | None = None
    # a classic member told to rejoin must by then; one that joined must sync by then
    join_deadline: float | None = None
    sync_deadline: float | None = None

    @property
    def session_timeout_s(self) -> float | None:
        """A classic member's own session timeout (None: the group's)."""
        return None if self.classic is None else self.classic.session_timeout_ms / 1000

    @property
    def left_temporarily(self) -> bool:
        """A static member that left with epoch -2 (kept so, in the log too): its instance is
        expected back, and takes its assignment over."""
        return self.epoch == STATIC_LEAVE_EPOCH


@dataclass(slots=True, frozen=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int  # -1: unchanged
    subscribed_topic_names: Sequence[str] | None  # None: unchanged
    subscribed_topic_regex: str | None
    server_assignor: str | None
    owned: Partitions | None  # None: unchanged
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True, frozen=True)
class HeartbeatResult:
    error: ErrorCode
    member_id: str | None = None
    member_epoch: int = 0
    assignment: Partitions | None = None
    message: str | None = None


@dataclass(slots=True, frozen=True)
class ClassicJoin:
    """A JoinGroup for a consumer-protocol group (its members may speak either protocol)."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    # KIP-394 (JoinGroup v4+): a new dynamic member first gets MEMBER_ID_REQUIRED
    require_known_member_id: bool


@dataclass(slots=True, frozen=True)
class ClassicAnswer:
    """What a classic member is answered: the error (and why), its member id and generation
    (its member epoch), the protocol, and for SyncGroup its partitions."""

    error: ErrorCode
    message: str | None = None
    member_id: str = ""
    generation_id: int = -1
    protocol_name: str | None = None
    assignment: Partitions | None = None
    # the ConsumerProtocolAssignment version the member reads (its subscription's)
    assignment_version: int = 0


def _flatten(p: Partitions) -> set[tuple[TopicId, int]]:
    return {(t, i) for t, parts in p.items() for i in parts}


def _group(pairs: set[tuple[TopicId, int]]) -> Partitions:
    out: dict[TopicId, set[int]] = {}
    for t, i in pairs:
        out.setdefault(t, set()).add(i)
    return {t: frozenset(v) for t, v in out.items()}


class ConsumerGroup:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.stored_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}
        self.target: dict[str, Partitions] = {}
        self.metadata: TopicMetadata = {}
        # False once loaded from the log: the next heartbeat takes the topics as they are
        # without a new epoch (the records keep the assignment, not the topics' metadata)
        self.metadata_known = True
        # what the log holds: (key version, member id) -> value, and the target's epoch
        self._stored: dict[tuple[int, str], bytes] = {}
        self._stored_target_epoch = -1
        # what each subscribed regex matched, as the log holds it
        self._stored_regexes: dict[str, tuple[str, ...]] = {}
        # changed since last stored: these members' records, every target after a new one
        self._dirty: set[str] = set()
        self._targets_dirty = False
        # made of a classic group whose record the next store deletes
        self.replaces_classic = False

    @classmethod
    def converted(
        cls,
        group_id: str,
        epoch: int,
        members: Iterable[ConsumerMember],
        metadata: TopicMetadata,
    ) -> ConsumerGroup:
        """A group made of a classic group's members (KIP-848's online upgrade): at the
        classic generation ``epoch``, each member's target what it has. Everything is to be
        stored, with the classic group's record deleted (``replaces_classic``)."""
        group = cls(group_id)
        group.group_epoch = group.assignment_epoch = epoch
        group.stored_epoch = -1
        group.metadata = metadata
        for m in members:
            group.members[m.member_id] = m
            if m.instance_id is not None:
                group.static_members[m.instance_id] = m.member_id
            group.target[m.member_id] = dict(m.assigned)
            group._dirty.add(m.member_id)
        group._targets_dirty = True
        group.replaces_classic = True
        return group

    def tombstones(self) -> list[tuple[records.Key, bytes | None]]:
        """The records that delete the group from the log, in Kafka's order: each member's
        current assignment, target and metadata, the target's epoch, the regexes, the group."""
        member_ids = {m for _, m in self._stored} | set(self.members) | self._dirty
        out: list[tuple[records.Key, bytes | None]] = []
        for version in (
            records.CURRENT_ASSIGNMENT_KEY_VERSION,
            records.TARGET_MEMBER_KEY_VERSION,
        ):
            out += [
                (records.ConsumerMemberKey(version, self.group_id, m), None)
                for m in sorted(member_ids)
            ]
        out.append((records.TargetEpochKey(self.group_id), None))
        out += [
            (records.ConsumerMemberKey(records.MEMBER_METADATA_KEY_VERSION, self.group_id, m), None)
            for m in sorted(member_ids)
        ]
        regexes = set(self._stored_regexes) | {
            m.subscribed_regex for m in self.members.values() if m.subscribed_regex
        }
        out += [(records.RegexKey(self.group_id, r), None) for r in sorted(regexes)]
        out.append((records.ConsumerGroupKey(self.group_id), None))
        return out

    # --- views -------------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        for m in self.members.values():
            if m.epoch != self.assignment_epoch or m.state != MemberState.STABLE:
                return "Reconciling"
        return "Stable"

    def subscribed_topic_names(self) -> set[str]:
        """Topics some member subscribes to, by name or through its regex as last resolved."""
        out: set[str] = set()
        for m in self.members.values():
            out |= m.subscribed_names | m.regex_topics
        return out

    def validate_member_epoch(
        self, member_id: str, epoch: int, commit_version: int | None = None
    ) -> ErrorCode:
        """For OffsetCommit and OffsetFetch: the member must exist and be at ``epoch`` (a
        classic member's generation is its epoch: ILLEGAL_GENERATION, as Kafka's
        validateOffsetCommit; STALE_MEMBER_EPOCH for one of the consumer protocol, which must
        commit with OffsetCommit v9+: ``commit_version``, None for a fetch or a transaction)."""
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if commit_version is not None and member.classic is None and commit_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        if epoch != member.epoch:
            if member.classic is not None:
                return ErrorCode.ILLEGAL_GENERATION
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    @property
    def classic_members(self) -> list[ConsumerMember]:
        return [m for m in self.members.values() if m.classic is not None]

    def all_classic(self) -> bool:
        """Whether every member speaks the classic protocol (and there is one): the group may
        turn back into a classic group."""
        return bool(self.members) and all(m.classic is not None for m in self.members.values())

    def supports_classic_protocols(self, protocol_type: str, names: Collection[str]) -> bool:
        """Kafka's supportsClassicProtocols: a classic member may join when it speaks the
        consumer protocol type and one of its protocols is one every classic member has."""
        if protocol_type != "consumer":
            return False
        common: set[str] | None = None
        for m in self.classic_members:
            assert m.classic is not None
            have = {name for name, _ in m.classic.protocols}
            common = have if common is None else common & have
        return common is None or bool(common & set(names))

    # --- membership --------------------------------------------------------------------------

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is None:
            return
        self._dirty.add(member_id)
        instance = member.instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        self.target.pop(member_id, None)
        self.group_epoch += 1

    def expire_members(self, now: float) -> list[str]:
        """Remove members whose session ended or whose revocation took longer than their
        rebalance timeout, and classic members that did not rejoin or sync in time; their
        ids."""

        def passed(deadline: float | None) -> bool:
            return deadline is not None and deadline <= now

        gone = [
            m.member_id
            for m in self.members.values()
            if m.deadline <= now
            or passed(m.revocation_deadline)
            or passed(m.join_deadline)
            or passed(m.sync_deadline)
        ]
        for member_id in gone:
            self.remove(member_id)
        return gone

    # --- the heartbeat -----------------------------------------------------------------------

    def heartbeat(
        self,
        req: HeartbeatRequest,
        now: float,
        resolve: Callable[[set[str]], TopicMetadata],
        topic_names: Collection[str],
        assignors: Sequence[str],
        session_timeout_ms: int,
        max_size: int,
        *,
        every_member_sees: bool = True,
    ) -> HeartbeatResult:
        """Apply one ConsumerGroupHeartbeat. ``resolve`` maps topic names to (id, partitions)
        for those that exist. Subscribed regexes are matched against ``topic_names``, the
        topics the heartbeating member may DESCRIBE, as Kafka resolves a group's regexes in
        the context of the heartbeat that refreshes them; ``every_member_sees``: they are
        what any member would see (no authorizer), so every member's regex is matched again,
        not only this one's."""
        error = validate_heartbeat(req, assignors)
        if error is not None:
            return error
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, now, session_timeout_ms)
        if req.member_epoch == 0:
            found = self._join(req, max_size)
            if isinstance(found, HeartbeatResult):
                return found
            member, changed = found
        else:
            member_or_error = self._existing(req)
            if isinstance(member_or_error, HeartbeatResult):
                return member_or_error
            member, changed = member_or_error, False
        member.deadline = now + session_timeout_ms / 1000
        member.client_id, member.client_host = req.client_id, req.client_host
        if member.classic is not None:
            # it speaks the consumer protocol now
            member.classic = None
            member.join_deadline = member.sync_deadline = None
            changed = True
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms >= 0:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.server_assignor is not None:
            member.server_assignor = req.server_assignor
        if req.subscribed_topic_names is not None:
            names = frozenset(req.subscribed_topic_names)
            changed |= names != member.subscribed_names
            member.subscribed_names = names
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            changed |= regex != member.subscribed_regex
            member.subscribed_regex = regex
        changed |= self._resolve_regexes(
            self.members.values() if every_member_sees else (member,), topic_names
        )
        self._update_target(member.member_id, changed, resolve, assignors)
        self._reconcile(member, req.owned, now)
        self._dirty.add(member.member_id)
        full = req.member_epoch == 0 or req.owned is not None
        send: Partitions | None = None
        if full or member.sent is None or member.assigned != member.sent:
            send = dict(member.assigned)
            member.sent = dict(member.assigned)
        return HeartbeatResult(ErrorCode.NONE, member.member_id, member.epoch, send)

    def _leave(self, req: HeartbeatRequest, now: float, session_timeout_ms: int) -> HeartbeatResult:
        found = self._member_named(req)
        if isinstance(found, HeartbeatResult):
            return found
        member = found
        if req.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # Kafka's consumerGroupStaticMemberGroupLeave: it keeps its assignment, at epoch
            # -2, for a while: the same instance is expected back
            member.epoch = STATIC_LEAVE_EPOCH
            member.pending_revocation = {}
            member.deadline = now + session_timeout_ms / 1000
            self._dirty.add(member.member_id)
        else:
            self.remove(member.member_id)
        return HeartbeatResult(ErrorCode.NONE, req.member_id, req.member_epoch)

    def _member_named(self, req: HeartbeatRequest) -> ConsumerMember | HeartbeatResult:
        """The member a heartbeat names: a static one by its instance id (Kafka's
        throwIfStaticMemberIsUnknown, then throwIfInstanceIdIsFenced: a member id the
        instance no longer has is fenced), a dynamic one by its member id."""
        if req.instance_id is None:
            member = self.members.get(req.member_id)
            if member is None:
                return HeartbeatResult(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    req.member_id,
                    req.member_epoch,
                    message=f"Member {req.member_id} is not a member of group {self.group_id}.",
                )
            return member
        holder_id = self.static_members.get(req.instance_id)
        holder = None if holder_id is None else self.members.get(holder_id)
        if holder is None:
            return HeartbeatResult(
                ErrorCode.UNKNOWN_MEMBER_ID,
                req.member_id,
                req.member_epoch,
                message=f"Instance id {req.instance_id} is unknown.",
            )
        if holder.member_id != req.member_id:
            return HeartbeatResult(
                ErrorCode.FENCED_INSTANCE_ID,
                req.member_id,
                req.member_epoch,
                message=f"Static member {req.member_id} with instance id {req.instance_id} "
                f"was fenced by member {holder.member_id}.",
            )
        return holder

    def _join(
        self, req: HeartbeatRequest, max_size: int
    ) -> tuple[ConsumerMember, bool] | HeartbeatResult:
        member_id = req.member_id or str(uuid.uuid4())
        if req.instance_id is not None:
            old_id = self.static_members.get(req.instance_id)
            old = self.members.get(old_id) if old_id is not None else None
            if (
                old is not None
                and old.member_id != member_id
                and old.classic is None
                and not old.left_temporarily
            ):
                # a consumer-protocol member holds the instance and has not left
                return HeartbeatResult(
                    ErrorCode.UNRELEASED_INSTANCE_ID,
                    message=f"Static member {member_id} with instance id {req.instance_id} "
                    f"cannot join the group because the instance id is owned by "
                    f"{old.member_id} member.",
                )
            if old is not None and (old.left_temporarily or old.classic is not None):
                # the static member is back (under a new id, or its own), or the instance of
                # a classic member now speaks the consumer protocol (a rolling upgrade, where
                # the classic member never left): it takes over the assignment, at epoch 0
                # (Kafka's copy of the member under its new id, getOrMaybeSubscribeStatic-
                # ConsumerGroupMember)
                if old.member_id != member_id:
                    del self.members[old.member_id]
                    self._dirty.add(old.member_id)
                    old.member_id = member_id
                    self.members[member_id] = old
                    self.static_members[req.instance_id] = member_id
                    if old_id in self.target:
                        self.target[member_id] = self.target.pop(old_id)
                old.epoch = old.previous_epoch = 0
                old.sent = None
                old.classic = None
                old.join_deadline = old.sync_deadline = None
                self._dirty.add(member_id)
                return old, False
        member = self.members.get(member_id)
        if member is not None:
            # joining again under its id: it is answered its assignment in full, which it
            # keeps. Kafka returns the member as it is when only its first answer was lost
            # (previous epoch 0) and fences it otherwise; taking it back is kinder to a client
            # that lost its state, and clearing the assignment here (as before) left the
            # partitions to nobody until the next rebalance
            member.sent = None
            return member, False
        if len(self.members) >= max_size:
            return HeartbeatResult(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                member_id,
                message="The consumer group has reached its maximum capacity of "
                f"{max_size} members.",
            )
        member = ConsumerMember(member_id, req.instance_id)
        self.members[member_id] = member
        if req.instance_id is not None:
            self.static_members[req.instance_id] = member_id
        return member, True

    def _existing(self, req: HeartbeatRequest) -> ConsumerMember | HeartbeatResult:
        found = self._member_named(req)
        if isinstance(found, HeartbeatResult):
            return found
        member = found
        if req.member_epoch != member.epoch:
            # Kafka's throwIfConsumerGroupMemberEpochIsInvalid: an epoch ahead of the member's
            # is fenced (a static member that left is at -2); one behind it only when it is
            # the epoch before and the member says what it owns, no more than it has (the
            # answer was lost)
            lost_response = (
                req.member_epoch < member.epoch
                and req.member_epoch == member.previous_epoch
                and req.owned is not None
                and _flatten(req.owned) <= _flatten(member.assigned)
            )
            if not lost_response:
                which = "greater" if req.member_epoch > member.epoch else "smaller"
                return HeartbeatResult(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    req.member_id,
                    req.member_epoch,
                    message=f"The consumer group member has a {which} member epoch "
                    f"({req.member_epoch}) than the one known by the group coordinator "
                    f"({member.epoch}). The member must abandon all its partitions and rejoin.",
                )
        return member

    # --- members of the classic protocol (KIP-848's online migration) ------------------------

    def classic_join(
        self,
        req: ClassicJoin,
        now: float,
        resolve: Callable[[set[str]], TopicMetadata],
        assignors: Sequence[str],
        max_size: int,
    ) -> ClassicAnswer:
        """A JoinGroup into this group, as Kafka's classicGroupJoinToConsumerGroup: the member
        (new, or rejoining) takes its subscription from its first protocol's metadata, the
        group's target follows, and it is answered at once with its member epoch as its
        generation and no members to assign (the broker assigns); SyncGroup then gives it
        its partitions. Whatever it lists as owned in the subscription counts as what it
        still holds."""
        member_id = req.member_id or str(uuid.uuid4())
        if member_id not in self.members and len(self.members) >= max_size:
            return ClassicAnswer(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {max_size} members.",
            )
        if not req.protocols or not self.supports_classic_protocols(
            req.protocol_type, [name for name, _ in req.protocols]
        ):
            return ClassicAnswer(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"Member {member_id}'s protocols are not supported.",
            )
        if not req.member_id and req.instance_id is None and req.require_known_member_id:
            return ClassicAnswer(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
        try:
            subscription = parse_subscription(req.protocols[0][1])
        except ConsumerProtocolError:
            return ClassicAnswer(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                "Malformed embedded consumer protocol in subscription deserialization.",
            )
        member = self.members.get(member_id)
        changed = False
        if req.instance_id is not None:
            holder_id = self.static_members.get(req.instance_id)
            holder = None if holder_id is None else self.members.get(holder_id)
            if req.member_id:
                # a known member: it must be the instance's (Kafka's throwIfStaticMemberIsUnknown
                # and throwIfInstanceIdIsFenced)
                if holder is None:
                    return ClassicAnswer(
                        ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown."
                    )
                if holder.member_id != member_id:
                    return ClassicAnswer(
                        ErrorCode.FENCED_INSTANCE_ID,
                        f"Static member {member_id} with instance id {req.instance_id} was "
                        f"fenced by member {holder.member_id}.",
                    )
            elif holder is not None:
                # the instance came back under a new id: it takes the old one's place and
                # partitions, at epoch 0 (Kafka's replaceMember), whatever protocol the old
                # one spoke and whether or not it left (a rolling downgrade: Kafka checks
                # for a release only between two members of the consumer protocol)
                del self.members[holder.member_id]
                self._dirty.add(holder.member_id)
                if holder.member_id in self.target:
                    self.target[member_id] = self.target.pop(holder.member_id)
                holder.member_id = member_id
                holder.epoch = holder.previous_epoch = 0
                holder.sent = None
                member = self.members[member_id] = holder
        if member is None:
            member = self.members[member_id] = ConsumerMember(member_id, req.instance_id)
            changed = True
        if req.instance_id is not None:
            self.static_members[req.instance_id] = member_id
        member.classic = records.ClassicMemberMetadata(req.session_timeout_ms, req.protocols)
        member.client_id, member.client_host = req.client_id, req.client_host
        member.rack_id = subscription.rack_id
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        names = frozenset(subscription.topics)
        changed |= names != member.subscribed_names or member.subscribed_regex is not None
        member.subscribed_names = names
        # (a classic member subscribes by name: its client matches any pattern itself)
        member.subscribed_regex, member.regex_topics = None, frozenset()
        self._update_target(member_id, changed, resolve, assignors)
        owned = {
            self.metadata[topic][0]: parts
            for topic, parts in (subscription.owned or {}).items()
            if topic in self.metadata
        }
        self._reconcile(member, owned, now)
        member.deadline = now + req.session_timeout_ms / 1000
        member.join_deadline = None
        member.sync_deadline = now + req.rebalance_timeout_ms / 1000
        member.revocation_deadline = None
        self._dirty.add(member_id)
        return ClassicAnswer(
            ErrorCode.NONE,
            member_id=member_id,
            generation_id=member.epoch,
            protocol_name=req.protocols[0][0],
        )

    def _classic_member(
        self, member_id: str, instance_id: str | None, generation_id: int
    ) -> ConsumerMember | ClassicAnswer:
        """The classic member a SyncGroup or Heartbeat names, at the generation it names
        (Kafka's validateConsumerGroupMember, throwIfMemberDoesNotUseClassicProtocol and
        throwIfGenerationIdUnmatched)."""
        if instance_id is None:
            member = self.members.get(member_id)
            if member is None:
                return ClassicAnswer(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member {member_id} is not a member of group {self.group_id}.",
                )
        else:
            holder_id = self.static_members.get(instance_id)
            member = None if holder_id is None else self.members.get(holder_id)
            if member is None:
                return ClassicAnswer(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member with instance id {instance_id} is not a member of group "
                    f"{self.group_id}.",
                )
            if member.member_id != member_id:
                return ClassicAnswer(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {instance_id} was fenced by "
                    f"member {member.member_id}.",
                )
        if member.classic is None:
            return ClassicAnswer(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {member_id} does not use the classic protocol.",
            )
        if generation_id != member.epoch:
            return ClassicAnswer(
                ErrorCode.ILLEGAL_GENERATION,
                f"The request generation id {generation_id} is not equal to the member epoch "
                f"{member.epoch} of member {member_id}.",
            )
        return member

    def _rejoin(self, member: ConsumerMember, now: float) -> ClassicAnswer:
        """The classic member is told to rejoin (REBALANCE_IN_PROGRESS), by its rebalance
        timeout (Kafka's consumer group join timeout)."""
        if member.join_deadline is None:
            member.join_deadline = now + member.rebalance_timeout_ms / 1000
        return ClassicAnswer(
            ErrorCode.REBALANCE_IN_PROGRESS,
            f"A new rebalance is triggered in group {self.group_id} and member "
            f"{member.member_id} should rejoin to catch up.",
        )

    def classic_sync(
        self,
        member_id: str,
        instance_id: str | None,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
        now: float,
    ) -> ClassicAnswer:
        """A SyncGroup, as Kafka's classicGroupSyncToConsumerGroup: the member's partitions as
        its current assignment has them (none of those it is to give up), unless the group
        moved on since it joined."""
        found = self._classic_member(member_id, instance_id, generation_id)
        if isinstance(found, ClassicAnswer):
            return found
        member = found
        assert member.classic is not None
        first = member.classic.protocols[0] if member.classic.protocols else ("", b"")
        if (protocol_type is not None and protocol_type != "consumer") or (
            protocol_name is not None and protocol_name != first[0]
        ):
            return ClassicAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if self.group_epoch > member.epoch and member.state != MemberState.UNREVOKED_PARTITIONS:
            return self._rejoin(member, now)
        member.sync_deadline = None
        member.deadline = now + member.classic.session_timeout_ms / 1000
        try:
            version = parse_subscription(first[1]).version
        except ConsumerProtocolError:
            version = 0
        member.sent = dict(member.assigned)
        return ClassicAnswer(
            ErrorCode.NONE,
            member_id=member.member_id,
            generation_id=member.epoch,
            protocol_name=first[0],
            assignment={t: parts for t, parts in member.assigned.items() if parts},
            assignment_version=version,
        )

    def classic_heartbeat(
        self, member_id: str, instance_id: str | None, generation_id: int, now: float
    ) -> ClassicAnswer:
        """A Heartbeat, as Kafka's classicGroupHeartbeatToConsumerGroup: it keeps the session,
        and tells the member to rejoin while it is behind the group, has partitions to give
        up, or waits for partitions that are free by now."""
        found = self._classic_member(member_id, instance_id, generation_id)
        if isinstance(found, ClassicAnswer):
            return found
        member = found
        assert member.classic is not None
        member.deadline = now + member.classic.session_timeout_ms / 1000
        if (
            member.epoch < self.group_epoch
            or member.state == MemberState.UNREVOKED_PARTITIONS
            or (
                member.state == MemberState.UNRELEASED_PARTITIONS
                and not self._waits_on_unreleased(member)
            )
        ):
            return self._rejoin(member, now)
        return ClassicAnswer(ErrorCode.NONE, member_id=member.member_id)

    def classic_leave(self, member_id: str, instance_id: str | None) -> ClassicAnswer:
        """One member of a LeaveGroup (of either protocol: an admin may remove any), as
        Kafka's classicGroupLeaveToConsumerGroup; the member is removed."""
        if instance_id is not None:
            holder_id = self.static_members.get(instance_id)
            member = None if holder_id is None else self.members.get(holder_id)
            if member is None:
                return ClassicAnswer(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown."
                )
            if member_id and member.member_id != member_id:
                return ClassicAnswer(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {instance_id} was fenced by "
                    f"member {member.member_id}.",
                )
        else:
            member = self.members.get(member_id)
            if member is None:
                return ClassicAnswer(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member {member_id} is not a member of group {self.group_id}.",
                )
        self.remove(member.member_id)
        return ClassicAnswer(ErrorCode.NONE, member_id=member.member_id)

    def _waits_on_unreleased(self, member: ConsumerMember) -> bool:
        """Whether a partition of the member's target that it does not have yet is still
        held by another member (Kafka's waitingOnUnreleasedPartition)."""
        missing = _flatten(self.target.get(member.member_id, {})) - _flatten(member.assigned)
        return bool(missing & self._owned_by_others(member.member_id))

    # --- assignment --------------------------------------------------------------------------

    def _update_target(
        self,
        member_id: str,
        changed: bool,
        resolve: Callable[[set[str]], TopicMetadata],
        assignors: Sequence[str],
    ) -> None:
        """A new group epoch when the subscriptions (``changed``) or the subscribed topics'
        partitions changed, and a new target assignment when the epoch moved past it."""
        if changed:
            self.group_epoch += 1
        metadata = resolve(self.subscribed_topic_names())
        if metadata != self.metadata:
            # partitions added, or a topic made again, since the target was computed (before
            # a load: the log keeps no topic metadata, so the stored target is checked against
            # the topics as they are now, as Kafka checks its stored metadata hash)
            current = self.assignment_epoch == self.group_epoch and bool(self.target)
            if current and (self.metadata_known or not self._target_covers(metadata)):
                self.group_epoch += 1
            self.metadata = metadata
        self.metadata_known = True
        if self.group_epoch > self.assignment_epoch or member_id not in self.target:
            self._compute_target(assignors)

    def _target_covers(self, metadata: TopicMetadata) -> bool:
        """Whether the target assigns every partition of the subscribed topics as ``metadata``
        has them, and no other (an assignor assigns all of a subscribed topic's)."""
        expected = {(tid, i) for tid, count in metadata.values() for i in range(count)}
        covered: set[tuple[TopicId, int]] = set()
        for partitions in self.target.values():
            covered |= _flatten(partitions)
        return covered == expected

    @staticmethod
    def _resolve_regexes(members: Iterable[ConsumerMember], topic_names: Collection[str]) -> bool:
        """Match the members' regexes against ``topic_names``; whether what one matches
        changed (the group's subscriptions did)."""
        changed = False
        for m in members:
            regex = m.subscribed_regex
            matched = frozenset(_regex_matches(regex, topic_names) if regex else ())
            if matched != m.regex_topics:
                m.regex_topics = matched
                changed = True
        return changed

    def preferred_assignor(self, assignors: Sequence[str]) -> str:
        """The assignor the group uses (Kafka's computePreferredServerAssignor, else the
        default): the one most members ask for (on a tie the first of ``assignors``, the
        broker's group.consumer.assignors), the first of ``assignors`` when none asks."""
        wanted = Counter(
            m.server_assignor for m in self.members.values() if m.server_assignor in assignors
        )
        if not wanted:
            return assignors[0]
        most = max(wanted.values())
        return next(name for name in assignors if wanted.get(name) == most)

    def _compute_target(self, assignors: Sequence[str]) -> None:
        name = self.preferred_assignor(assignors)
        ids = {tid: topic for topic, (tid, _) in self.metadata.items()}
        specs = []
        for m in sorted(self.members.values(), key=lambda m: m.member_id):
            topics = m.subscribed_names | m.regex_topics
            current = {
                ids[t]: parts for t, parts in self.target.get(m.member_id, {}).items() if t in ids
            }
            specs.append(
                MemberSpec(
                    m.member_id,
                    frozenset(t for t in topics if t in self.metadata),
                    m.rack_id,
                    current,
                )
            )
        result = assign(name, specs, {t: n for t, (_, n) in self.metadata.items()})
        self.target = {
            member_id: {self.metadata[t][0]: parts for t, parts in by_topic.items() if parts}
            for member_id, by_topic in result.items()
        }
        self.assignment_epoch = self.group_epoch
        self._targets_dirty = True

    def _owned_by_others(self, member_id: str) -> set[tuple[TopicId, int]]:
        out: set[tuple[TopicId, int]] = set()
        for m in self.members.values():
            if m.member_id != member_id:
                out |= _flatten(m.assigned) | _flatten(m.pending_revocation)
        return out

    def _reconcile(self, member: ConsumerMember, owned: Partitions | None, now: float) -> None:
        target = _flatten(self.target.get(member.member_id, {}))
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            revoking = _flatten(member.pending_revocation)
            if owned is None or _flatten(owned) & revoking:
                return  # still waiting for the member to let go
            member.pending_revocation = {}
            member.revocation_deadline = None
            member.state = MemberState.STABLE
        if member.epoch == self.assignment_epoch and member.state == MemberState.STABLE:
            return
        assigned = _flatten(member.assigned)
        keep = assigned & target
        revoke = assigned - target
        # Kafka's ownsRevokedPartitions: a member that says it holds none of them (an eager
        # classic consumer gives up everything before it rejoins) has nothing to revoke
        if revoke and (owned is None or _flatten(owned) & revoke):
            member.assigned = _group(keep)
            member.pending_revocation = _group(revoke)
            member.state = MemberState.UNREVOKED_PARTITIONS
            if member.classic is None:
                # (a classic member is held to its rejoin by its join deadline instead)
                member.revocation_deadline = now + member.rebalance_timeout_ms / 1000
            return
        free = (target - keep) - self._owned_by_others(member.member_id)
        new = keep | free
        member.assigned = _group(new)
        member.previous_epoch, member.epoch = member.epoch, self.assignment_epoch
        member.state = MemberState.STABLE if new == target else MemberState.UNRELEASED_PARTITIONS

    def topic_names(self) -> dict[TopicId, str]:
        return {tid: topic for topic, (tid, _) in self.metadata.items()}

    # --- the records that keep it ------------------------------------------------------------

    def _member_values(self, member_id: str) -> dict[int, bytes]:
        """The member's metadata and current assignment records (none: it is gone)."""
        m = self.members.get(member_id)
        if m is None:
            return {}
        metadata = records.MemberMetadataValue(
            m.instance_id,
            m.rack_id,
            m.client_id,
            m.client_host,
            tuple(sorted(m.subscribed_names)),
            m.subscribed_regex,
            m.rebalance_timeout_ms,
            m.server_assignor,
            m.classic,
        )
        current = records.CurrentAssignmentValue(
            m.epoch,
            m.previous_epoch,
            m.state.value,
            _listed(m.assigned),
            _listed(m.pending_revocation),
        )
        return {
            records.MEMBER_METADATA_KEY_VERSION: records.encode_member_value(metadata),
            records.CURRENT_ASSIGNMENT_KEY_VERSION: records.encode_member_value(current),
        }

    def changed_records(self) -> list[tuple[records.Key, bytes | None]]:
        """The records of what changed since last stored, which differ from what the log
        holds (tombstones for members gone), and the target's epoch when it moved. Then
        ``stored()`` once they are appended, or ``not_stored()``."""
        out: list[tuple[records.Key, bytes | None]] = []

        def put(version: int, member_id: str, value: bytes | None) -> None:
            if self._stored.get((version, member_id)) != value:
                out.append((records.ConsumerMemberKey(version, self.group_id, member_id), value))

        if self.assignment_epoch != self._stored_target_epoch:
            epoch = records.encode_member_value(records.TargetEpochValue(self.assignment_epoch))
            out.append((records.TargetEpochKey(self.group_id), epoch))
        for member_id in sorted(self._dirty):
            values = self._member_values(member_id)
            for version in (
                records.MEMBER_METADATA_KEY_VERSION,
                records.CURRENT_ASSIGNMENT_KEY_VERSION,
            ):
                put(version, member_id, values.get(version))
        targets = set(self._dirty)
        if self._targets_dirty:
            targets |= self.target.keys()
            targets |= {m for v, m in self._stored if v == records.TARGET_MEMBER_KEY_VERSION}
        for member_id in sorted(targets):
            partitions = self.target.get(member_id)
            target = None
            if partitions is not None:
                target = records.encode_member_value(records.TargetMemberValue(_listed(partitions)))
            put(records.TARGET_MEMBER_KEY_VERSION, member_id, target)
        self._dirty, self._targets_dirty = set(), False
        if self._stored_regexes or any(m.subscribed_regex for m in self.members.values()):
            regexes = {
                m.subscribed_regex: tuple(sorted(m.regex_topics))
                for m in self.members.values()
                if m.subscribed_regex
            }
            for regex, topics in sorted(regexes.items()):
                if self._stored_regexes.get(regex) != topics:
                    value = records.encode_member_value(records.RegexValue(topics, 0, 0))
                    out.append((records.RegexKey(self.group_id, regex), value))
            for regex in sorted(self._stored_regexes.keys() - regexes.keys()):
                out.append((records.RegexKey(self.group_id, regex), None))
        return out

    def not_stored(self, entries: Sequence[tuple[records.Key, bytes | None]]) -> None:
        """``entries`` (of ``changed_records``) could not be appended: the next store tries
        again."""
        for key, _ in entries:
            if isinstance(key, records.ConsumerMemberKey):
                self._dirty.add(key.member)
                if key.version == records.TARGET_MEMBER_KEY_VERSION:
                    self._targets_dirty = True

    def stored(self, entries: Sequence[tuple[records.Key, bytes | None]]) -> None:
        """``entries`` (of ``changed_records``) are in the log."""
        for key, value in entries:
            if isinstance(key, records.RegexKey | records.TargetEpochKey):
                self._replay_group_value(key, records.decode_value(key, value))
            elif isinstance(key, records.ConsumerMemberKey):
                if value is None:
                    self._stored.pop((key.version, key.member), None)
                else:
                    self._stored[(key.version, key.member)] = value

    def _replay_group_value(
        self, key: records.RegexKey | records.TargetEpochKey, value: records.Value | None
    ) -> None:
        """What the log holds of a regex's matches, or of the target's epoch."""
        if isinstance(key, records.RegexKey):
            if isinstance(value, records.RegexValue):
                self._stored_regexes[key.regex] = value.topics
            else:
                self._stored_regexes.pop(key.regex, None)
        elif isinstance(value, records.TargetEpochValue):
            self._stored_target_epoch = value.epoch

    def replay(
        self,
        key: records.ConsumerMemberKey | records.TargetEpochKey | records.RegexKey,
        raw: bytes | memoryview | None,
        value: records.Value | None,
        now: float,
        session_timeout_ms: int,
    ) -> None:
        """Apply one of the group's records read from the log, ``raw`` as stored and
        ``value`` decoded (both None: a tombstone); a member loaded has a full session from
        ``now``."""
        self.metadata_known = False
        raw = None if raw is None else bytes(raw)
        if isinstance(key, records.RegexKey):
            self._replay_group_value(key, value)
            for m in self.members.values():
                if m.subscribed_regex == key.regex:
                    m.regex_topics = frozenset(self._stored_regexes.get(key.regex, ()))
            return
        if isinstance(key, records.TargetEpochKey):
            if isinstance(value, records.TargetEpochValue):
                self._replay_group_value(key, value)
                self.assignment_epoch = value.epoch
            return
        member_id = key.member
        if raw is None:
            self._stored.pop((key.version, member_id), None)
            if key.version == records.TARGET_MEMBER_KEY_VERSION:
                self.target.pop(member_id, None)
            elif key.version == records.MEMBER_METADATA_KEY_VERSION:
                gone = self.members.pop(member_id, None)
                if gone is not None and gone.instance_id is not None:
                    self.static_members.pop(gone.instance_id, None)
            return
        self._stored[(key.version, member_id)] = raw
        if isinstance(value, records.TargetMemberValue):
            self.target[member_id] = _mapped(value.partitions)
            return
        member = self.members.get(member_id)
        if member is None:
            member = self.members[member_id] = ConsumerMember(member_id)
        if isinstance(value, records.MemberMetadataValue):
            member.instance_id, member.rack_id = value.instance_id, value.rack_id
            member.client_id, member.client_host = value.client_id, value.client_host
            member.subscribed_names = frozenset(value.subscribed_topic_names)
            member.subscribed_regex = value.subscribed_topic_regex
            regex = value.subscribed_topic_regex
            member.regex_topics = frozenset(self._stored_regexes.get(regex, ()) if regex else ())
            member.rebalance_timeout_ms = value.rebalance_timeout_ms
            member.server_assignor = value.server_assignor
            member.classic = value.classic
            if value.instance_id is not None:
                self.static_members[value.instance_id] = member_id
        elif isinstance(value, records.CurrentAssignmentValue):
            member.epoch, member.previous_epoch = value.member_epoch, value.previous_member_epoch
            member.state = MemberState(value.state)
            member.assigned = _mapped(value.assigned)
            member.pending_revocation = _mapped(value.pending_revocation)
            member.revocation_deadline = (
                now + member.rebalance_timeout_ms / 1000
                if member.state == MemberState.UNREVOKED_PARTITIONS and member.classic is None
                else None
            )
        # a full session from now: a classic member's own, else the group's
        member.deadline = now + (member.session_timeout_s or session_timeout_ms / 1000)


def _listed(p: Partitions) -> records.TopicPartitions:
    return tuple((t, tuple(sorted(parts))) for t, parts in sorted(p.items(), key=lambda kv: kv[0]))


def _mapped(p: records.TopicPartitions) -> Partitions:
    return {t: frozenset(parts) for t, parts in p if parts}


def validate_heartbeat(req: HeartbeatRequest, assignors: Sequence[str]) -> HeartbeatResult | None:
    """The refusal of a heartbeat Kafka refuses before it looks at the group, else None."""

    def invalid(message: str) -> HeartbeatResult:
        return HeartbeatResult(
            ErrorCode.INVALID_REQUEST, req.member_id, req.member_epoch, message=message
        )

    # Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid, in its order and words (a v1
    # request's empty member id is refused before, by the API handler)
    epoch = req.member_epoch
    if (epoch > 0 or epoch == LEAVE_EPOCH) and not req.member_id.strip():
        return invalid("MemberId can't be empty.")
    if not req.group_id.strip():
        return invalid("GroupId can't be empty.")
    if req.instance_id is not None and not req.instance_id.strip():
        return invalid("InstanceId can't be empty.")
    if req.rack_id is not None and not req.rack_id.strip():
        return invalid("RackId can't be empty.")
    if epoch == 0:
        if req.rebalance_timeout_ms == -1:
            return invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or req.owned:
            return invalid("TopicPartitions must be empty when (re-)joining.")
        if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            return invalid(
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                "(re-)joining."
            )
    elif epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
        return invalid("InstanceId can't be null.")
    elif epoch < STATIC_LEAVE_EPOCH:
        return invalid("MemberEpoch is invalid.")
    if req.server_assignor is not None and req.server_assignor not in assignors:
        return HeartbeatResult(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            req.member_id,
            req.member_epoch,
            message=f"ServerAssignor {req.server_assignor} is not supported. Supported "
            f"assignors: {', '.join(assignors)}.",
        )
    if req.subscribed_topic_regex:
        problem = regex_problem(req.subscribed_topic_regex)
        if problem is not None:
            return HeartbeatResult(
                ErrorCode.INVALID_REGULAR_EXPRESSION,
                req.member_id,
                req.member_epoch,
                message=f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a valid "
                f"regular expression: {problem}.",
            )
    return None


def regex_problem(regex: str) -> str | None:
    """Why Kafka's broker would refuse ``regex``, or None. Kafka compiles it with RE2/J, which
    has no lookaround, backreferences, atomic groups or possessive quantifiers; Python's
    ``re`` has them, so they are refused here before ``re`` compiles the rest."""
    in_class = False
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            nxt = regex[i + 1 : i + 2]
            if nxt in tuple("123456789"):
                return f"invalid escape sequence: `\\{nxt}`"
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if regex[i + 1 : i + 2] == "]":
                i += 1  # a ']' first in a class is a literal
        elif c == "(" and regex.startswith("(?", i):
            for unsupported in ("(?=", "(?!", "(?<=", "(?<!", "(?>", "(?P="):
                if regex.startswith(unsupported, i):
                    return f"invalid or unsupported Perl syntax: `{unsupported}`"
        elif c in "*+?}" and regex[i + 1 : i + 2] == "+":
            return f"invalid nested repetition operator: `{c}+`"
        i += 1
    try:
        re.compile(regex)
    except re.error as e:
        return str(e)
    return None


def _regex_matches(regex: str, names: Iterable[str]) -> set[str]:
    """The names ``regex`` matches whole. Internal topics too: Kafka's broker matches every
    topic of its metadata image (the Java consumer's ``exclude.internal.topics`` is a
    client-side filter, and applies to client-side patterns)."""
    try:
        pattern = re.compile(regex)
    except re.error:
        return set()
    return {n for n in names if pattern.fullmatch(n)}
