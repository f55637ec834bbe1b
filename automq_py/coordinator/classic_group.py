"""A group of Kafka's classic rebalance protocol (JoinGroup/SyncGroup/Heartbeat): its state,
members and generation, as Kafka's ``ClassicGroup`` keeps them. Pure data and helpers;
:class:`~automq_py.coordinator.classic_protocol.ClassicProtocol` drives the transitions.

States, as Kafka names them (DescribeGroups and ListGroups show these strings)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup--> Stable --join/leave/expiry--> PreparingRebalance
    any --last member gone--> Empty;  deleted --> Dead
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import Counter
from dataclasses import dataclass, field

from automq_py.coordinator import records
from automq_py.coordinator.consumer_protocol import subscription_topics
from protocol.errors import ErrorCode

CONSUMER_PROTOCOL_TYPE = "consumer"


class ClassicState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    # (member id, group instance id, metadata): for the leader only
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    # (name, metadata) in the member's order of preference
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    # monotonic seconds after which the member is gone unless it heartbeats
    deadline: float = 0.0
    is_new: bool = False

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None and not self.join_waiter.done()

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None and not self.sync_waiter.done()

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


class ClassicGroup:
    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.state = ClassicState.EMPTY
        self.state_timestamp_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, ClassicMember] = {}
        # KIP-394: member ids handed out with MEMBER_ID_REQUIRED, -> monotonic deadline
        self.pending_members: dict[str, float] = {}
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.new_member_added = False
        # the first rebalance of an empty group waits group.initial.rebalance.delay.ms
        self.initial_delay = False
        self.rebalance_timer: asyncio.TimerHandle | None = None
        # monotonic deadline for the SyncGroup phase: the generation's members that have not
        # sent SyncGroup by then (``pending_sync``) are removed, in CompletingRebalance or
        # once Stable (Kafka's pending sync members)
        self.sync_deadline: float | None = None
        self.pending_sync: set[str] = set()

    # --- state -----------------------------------------------------------------------------

    def is_(self, *states: ClassicState) -> bool:
        return self.state in states

    def transition(self, state: ClassicState) -> None:
        self.state = state
        self.state_timestamp_ms = int(time.time() * 1000)

    @property
    def is_empty(self) -> bool:
        return not self.members and not self.pending_members

    # --- members ---------------------------------------------------------------------------

    def add(self, member: ClassicMember) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> ClassicMember | None:
        member = self.members.pop(member_id, None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        if member is None:
            return None
        instance = member.group_instance_id
        if instance is not None and self.static_members.get(instance) == member_id:
            del self.static_members[instance]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        if not self.members:
            self.protocol_type = None if self.is_(ClassicState.EMPTY) else self.protocol_type
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> ClassicMember:
        """Give the static member ``instance_id`` a new member id; its old id is fenced."""
        member = self.members.pop(old_id)
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.set_result(JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_result(SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member.join_waiter = member.sync_waiter = None
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def is_static_member_fenced(self, member_id: str, instance_id: str | None) -> bool:
        if instance_id is None:
            return False
        current = self.static_members.get(instance_id)
        return current is not None and current != member_id

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode:
        """Kafka's ``validateMember``: FENCED_INSTANCE_ID, UNKNOWN_MEMBER_ID or NONE."""
        if instance_id is not None:
            current = self.static_members.get(instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
            return ErrorCode.NONE
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    # --- protocols -------------------------------------------------------------------------

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Whether a member with these protocols may join: the same protocol type, and at least
        one protocol every current member supports too."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        return bool(self._candidates() & {name for name, _ in protocols})

    def _candidates(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote: each
        member votes for its first supported candidate)."""
        candidates = self._candidates()
        votes: Counter[str] = Counter()
        for m in self.members.values():
            for name, _ in m.protocols:
                if name in candidates:
                    votes[name] += 1
                    break
        # ties go to the first member's preference order
        best = max(votes.values())
        first = next(iter(self.members.values()))
        for name, _ in first.protocols:
            if votes.get(name) == best:
                return name
        return next(iter(votes))

    # --- rebalance bookkeeping -------------------------------------------------------------

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def not_yet_rejoined(self) -> list[ClassicMember]:
        return [m for m in self.members.values() if not m.awaiting_join]

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol only; None when unknown)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            found = subscription_topics(m.metadata(self.protocol_name))
            if found is None:
                return None
            topics |= found
        return topics

    # --- persistence -----------------------------------------------------------------------

    def to_record(self) -> records.GroupValue:
        protocol = self.protocol_name
        return records.GroupValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation_id,
            protocol=protocol,
            leader=self.leader_id,
            current_state_timestamp=self.state_timestamp_ms,
            members=tuple(
                records.MemberValue(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata(protocol) if protocol else b"",
                    m.assignment,
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_record(cls, group_id: str, value: records.GroupValue, now: float) -> ClassicGroup:
        """The group as last stored: Stable with its members (each must heartbeat within its
        session timeout from ``now``), or Empty."""
        group = cls(group_id, value.current_state_timestamp)
        group.generation_id = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        for m in value.members:
            member = ClassicMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout,
                m.session_timeout,
                value.protocol_type,
                [(value.protocol or "", m.subscription)],
                m.assignment,
                deadline=now + m.session_timeout / 1000,
            )
            group.add(member)
        group.leader_id = value.leader if value.leader in group.members else group.leader_id
        group.state = ClassicState.STABLE if group.members else ClassicState.EMPTY
        return group
