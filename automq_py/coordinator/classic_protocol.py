"""The classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) with Kafka's rules:
generations, KIP-394 member ids, static membership (KIP-345), the initial rebalance delay,
session and rebalance timeouts: the state machine Kafka's GroupMetadataManager runs for a
:class:`~automq_py.coordinator.classic_group.ClassicGroup`.

:class:`ClassicProtocol` shares the coordinator's groups (a group id names a classic or a
consumer-protocol group) and stores a group's state through its offsets topic partition; the
:class:`~automq_py.coordinator.group_coordinator.GroupCoordinator` answers the requests with it
and its sweeper calls :meth:`ClassicProtocol.expire`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from automq_py.coordinator import records
from automq_py.coordinator.classic_group import (
    ClassicGroup,
    ClassicMember,
    ClassicState,
    JoinResult,
    SyncResult,
)
from automq_py.coordinator.consumer_group import ConsumerGroup
from automq_py.coordinator.offsets import Group, append_group_records, group_ready
from automq_py.coordinator.runtime import CoordinatorRuntime
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from automq_py.coordinator.group_coordinator import GroupConfig

log = logging.getLogger("automq.coordinator")


@dataclass(slots=True, frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    # KIP-394 (JoinGroup v4+): a new dynamic member first gets MEMBER_ID_REQUIRED
    require_known_member_id: bool
    # JoinGroup v9+: a rejoining static leader is told to skip the assignment
    supports_skip_assignment: bool


def _now_ms() -> int:
    return int(time.time() * 1000)


class ConsumerSide(Protocol):
    """Where the classic requests of a member of a consumer-protocol group go (KIP-848's
    online migration: the group coordinator)."""

    async def classic_join(self, group: ConsumerGroup, req: JoinRequest) -> JoinResult: ...

    async def classic_sync(
        self,
        group: ConsumerGroup,
        member_id: str,
        instance_id: str | None,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> SyncResult: ...

    def classic_heartbeat(
        self, group: ConsumerGroup, member_id: str, instance_id: str | None, generation_id: int
    ) -> ErrorCode: ...

    async def classic_leave(
        self, group: ConsumerGroup, members: Sequence[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]: ...


class ClassicProtocol:
    """The classic protocol's requests and rebalances, over the coordinator's groups."""

    def __init__(
        self,
        config: GroupConfig,
        groups: dict[str, Group],
        runtime: CoordinatorRuntime,
        clock: Callable[[], float],
        consumer_side: ConsumerSide | None = None,
    ) -> None:
        self.config = config
        self.groups = groups  # the coordinator's, shared
        self.runtime = runtime
        self.clock = clock
        self.consumer_side = consumer_side

    def abandon(self, group: ClassicGroup) -> None:
        """The group is no longer coordinated here (its offsets partition moved, or the broker
        stops): members waiting for a join or a sync are told to find the coordinator."""
        self._cancel_timer(group)
        for member in group.members.values():
            _resolve_join(member, JoinResult(ErrorCode.NOT_COORDINATOR))
            _resolve_sync(member, SyncResult(ErrorCode.NOT_COORDINATOR))

    def hand_over(self, group: ClassicGroup) -> None:
        """The group became a consumer-protocol group: members waiting for a join or a sync
        are told to rejoin (Kafka's convertToConsumerGroup)."""
        self._cancel_timer(group)
        # what still holds it (a leader's assignment being stored) leaves it alone
        group.transition(ClassicState.DEAD)
        for member in group.members.values():
            _resolve_join(member, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
            _resolve_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))

    def rebalance(self, group: ClassicGroup, reason: str) -> None:
        """Start a rebalance of the Stable ``group`` (a consumer-protocol group turned back
        into a classic one: its members rejoin)."""
        self._prepare_rebalance(group, reason)

    def close(self, group: ClassicGroup) -> None:
        """The group was deleted (its offsets expired with it, or DeleteGroups)."""
        self._cancel_timer(group)
        group.transition(ClassicState.DEAD)

    def expire(self, group: ClassicGroup, now: float) -> None:
        """The sweeper's pass over ``group``: members whose session ended are removed, pending
        members forgotten, and a sync that did not come in time starts a rebalance."""
        for member_id, deadline in list(group.pending_members.items()):
            if deadline <= now:
                group.pending_members.pop(member_id, None)
                if group.is_(ClassicState.PREPARING_REBALANCE):
                    self._try_complete_join(group)
        for member in list(group.members.values()):
            keep_alive = member.awaiting_join or member.awaiting_sync
            if member.deadline <= now and not keep_alive:
                self._remove_member(group, member, "session timeout expired")
        if (
            group.is_(ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE)
            and group.sync_deadline is not None
            and group.sync_deadline <= now
        ):
            # Kafka's expirePendingSync: whoever of the generation has not synced by now
            group.sync_deadline = None
            late = sorted(group.pending_sync & group.members.keys())
            for member_id in late:
                group.remove(member_id)
            if late:
                log.info("group %s: %s did not sync in time", group.group_id, ", ".join(late))
                self._prepare_rebalance(group, "members did not sync in time")

    async def _store(self, group: ClassicGroup) -> ErrorCode:
        value = records.encode_group_value(group.to_record())
        key = records.GroupKey(group.group_id)
        return await append_group_records(self.runtime, group.group_id, [(key, value)])

    # --- JoinGroup -------------------------------------------------------------------------------

    async def join_group(self, req: JoinRequest) -> JoinResult:
        # in Kafka's order (GroupCoordinatorService.joinGroup): the group id, the session
        # timeout, then whether this broker coordinates the group
        if not req.group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, req.member_id)
        if not (
            self.config.min_session_timeout_ms
            <= req.session_timeout_ms
            <= self.config.max_session_timeout_ms
        ):
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id)
        error = await group_ready(self.runtime, req.group_id)
        if error != ErrorCode.NONE:
            return JoinResult(error, req.member_id)
        if not req.protocol_type or not req.protocols:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        found = self.groups.get(req.group_id)
        if isinstance(found, ConsumerGroup):
            if found.members:
                if self.consumer_side is None:
                    return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
                return await self.consumer_side.classic_join(found, req)
            # an empty consumer-protocol group turns classic (its offsets stay; what the log
            # holds of it goes, as Kafka's maybeDeleteEmptyConsumerGroup)
            del self.groups[req.group_id]
            self.runtime.spawn(
                append_group_records(self.runtime, req.group_id, found.tombstones()),
                f"deleting consumer group {req.group_id}",
            )
            found = None
        if found is None:
            if req.member_id:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id)
            found = ClassicGroup(req.group_id, _now_ms())
            self.groups[req.group_id] = found
        group = found
        if group.is_(ClassicState.DEAD):
            # deleted meanwhile: let the client find the coordinator again
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, req.member_id)
        if not group.supports(req.protocol_type, req.protocols):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        if not self._accepts(group, req.member_id):
            # Kafka's acceptJoiningMember refused: a member not let in is out of the group
            removed = group.remove(req.member_id)
            if removed is not None:
                _resolve_join(removed, JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, ""))
                _resolve_sync(removed, SyncResult(ErrorCode.GROUP_MAX_SIZE_REACHED))
                self._try_complete_join(group)
            return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, "")
        if not req.member_id:
            return await self._join_unknown_member(group, req)
        return await self._join_known_member(group, req)

    def _accepts(self, group: ClassicGroup, member_id: str) -> bool:
        """Kafka's acceptJoiningMember (group.max.size): any join of an empty group; while it
        rebalances, a member already waiting to join or while fewer than the maximum wait;
        else a member of the group or while it has fewer than the maximum."""
        limit = self.config.max_size
        if group.is_(ClassicState.EMPTY, ClassicState.DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_(ClassicState.PREPARING_REBALANCE):
            waiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or waiting < limit
        return member is not None or len(group.members) < limit

    def _new_member(self, req: JoinRequest, member_id: str) -> ClassicMember:
        return ClassicMember(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            list(req.protocols),
            deadline=self.clock() + req.session_timeout_ms / 1000,
        )

    async def _join_unknown_member(self, group: ClassicGroup, req: JoinRequest) -> JoinResult:
        prefix = req.group_instance_id if req.group_instance_id is not None else req.client_id
        new_id = f"{prefix}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            old_id = group.static_members.get(req.group_instance_id)
            if old_id is not None and old_id in group.members:
                return await self._rejoin_static_member(group, req, old_id, new_id)
        if req.group_instance_id is None and req.require_known_member_id:
            group.pending_members[new_id] = self.clock() + req.session_timeout_ms / 1000
            return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id)
        return await self._add_member_and_rebalance(group, self._new_member(req, new_id))

    async def _join_known_member(self, group: ClassicGroup, req: JoinRequest) -> JoinResult:
        member_id = req.member_id
        if member_id in group.pending_members:
            return await self._add_member_and_rebalance(group, self._new_member(req, member_id))
        if group.is_static_member_fenced(member_id, req.group_instance_id):
            return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
        member = group.members.get(member_id)
        if member is None or group.is_(ClassicState.EMPTY):
            return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        member.deadline = self.clock() + member.session_timeout_ms / 1000
        if group.is_(ClassicState.PREPARING_REBALANCE):
            return await self._update_member_and_rebalance(group, member, req)
        if group.is_(ClassicState.COMPLETING_REBALANCE):
            if member.matches(req.protocols):
                # the join response was lost: answer it again
                return self._join_result(group, member)
            return await self._update_member_and_rebalance(group, member, req)
        # Stable
        if member_id == group.leader_id or not member.matches(req.protocols):
            return await self._update_member_and_rebalance(group, member, req)
        return self._join_result(group, member, with_members=False)

    async def _rejoin_static_member(
        self, group: ClassicGroup, req: JoinRequest, old_id: str, new_id: str
    ) -> JoinResult:
        """A known static member joined again with no member id (e.g. after a restart): it
        takes a new id and keeps its assignment; no rebalance unless its protocols changed."""
        old = group.members[old_id]
        old_protocols = old.protocols
        member = group.replace_static_member(req.group_instance_id or "", old_id, new_id)
        member.protocols = list(req.protocols)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        member.deadline = self.clock() + req.session_timeout_ms / 1000
        log.info(
            "group %s: static member %s rejoined as %s",
            group.group_id,
            req.group_instance_id,
            new_id,
        )
        if group.is_(ClassicState.STABLE):
            if group.protocol_name is not None and group.select_protocol() == group.protocol_name:
                generation = group.generation_id
                error = await self._store(group)
                if error != ErrorCode.NONE:
                    # undo: the old id stays the member
                    group.replace_static_member(req.group_instance_id or "", new_id, old_id)
                    group.members[old_id].protocols = old_protocols
                    return JoinResult(error, "")
                is_leader = group.leader_id == new_id
                skip = is_leader and req.supports_skip_assignment
                return JoinResult(
                    ErrorCode.NONE,
                    new_id,
                    generation,
                    group.protocol_type,
                    group.protocol_name,
                    # the group's leader (Kafka's updateStaticMemberThenRebalanceOrCompleteJoin);
                    # a leader that cannot skip the assignment (below v9) is told its old id,
                    # so it does not take itself for the leader and assign again
                    (group.leader_id or "") if skip or not is_leader else old_id,
                    skip,
                    self._member_list(group) if skip else [],
                )
            return await self._update_member_and_rebalance(group, member, req)
        if group.is_(ClassicState.COMPLETING_REBALANCE):
            # the leader may be assigning to the old id: rebalance to be safe
            member.join_waiter = asyncio.get_running_loop().create_future()
            self._prepare_rebalance(group, f"static member {req.group_instance_id} rejoined")
            return await member.join_waiter
        # PreparingRebalance: wait for the join like everyone else
        member.join_waiter = asyncio.get_running_loop().create_future()
        self._try_complete_join(group)
        return await member.join_waiter

    async def _add_member_and_rebalance(
        self, group: ClassicGroup, member: ClassicMember
    ) -> JoinResult:
        member.is_new = True
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_waiter = waiter
        group.add(member)
        if group.is_(ClassicState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, f"member {member.member_id} joined")
        return await waiter

    async def _update_member_and_rebalance(
        self, group: ClassicGroup, member: ClassicMember, req: JoinRequest
    ) -> JoinResult:
        member.protocols = list(req.protocols)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        _resolve_join(member, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_waiter = waiter
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")
        return await waiter

    def _member_list(self, group: ClassicGroup) -> list[tuple[str, str | None, bytes]]:
        protocol = group.protocol_name or ""
        return [
            (m.member_id, m.group_instance_id, m.metadata(protocol)) for m in group.members.values()
        ]

    def _join_result(
        self, group: ClassicGroup, member: ClassicMember, with_members: bool = True
    ) -> JoinResult:
        is_leader = member.member_id == group.leader_id
        return JoinResult(
            ErrorCode.NONE,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            False,
            self._member_list(group) if is_leader and with_members else [],
        )

    # --- rebalances ------------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_(ClassicState.STABLE, ClassicState.COMPLETING_REBALANCE, ClassicState.EMPTY):
            self._prepare_rebalance(group, reason)
        elif group.is_(ClassicState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.is_(ClassicState.COMPLETING_REBALANCE):
            for member in group.members.values():
                member.assignment = b""
                _resolve_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        group.sync_deadline = None
        initial = group.is_(ClassicState.EMPTY)
        group.transition(ClassicState.PREPARING_REBALANCE)
        self._cancel_timer(group)
        loop = asyncio.get_running_loop()
        log.info(
            "group %s: preparing to rebalance generation %d (%s)",
            group.group_id,
            group.generation_id,
            reason,
        )
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
            group.initial_delay = True
            group.rebalance_timer = loop.call_later(
                delay / 1000, self._initial_delay_expired, group, delay, remaining
            )
        else:
            group.initial_delay = False
            group.rebalance_timer = loop.call_later(
                group.rebalance_timeout_ms / 1000, self._complete_join, group
            )
            self._try_complete_join(group)

    def _initial_delay_expired(self, group: ClassicGroup, delay: int, remaining: int) -> None:
        """Kafka's InitialDelayedJoin: while new members keep arriving, wait another delay
        (up to the rebalance timeout); then complete the join."""
        group.rebalance_timer = None
        if not group.is_(ClassicState.PREPARING_REBALANCE):
            return
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            step = min(delay, remaining)
            group.rebalance_timer = asyncio.get_running_loop().call_later(
                step / 1000, self._initial_delay_expired, group, delay, remaining - step
            )
            return
        group.initial_delay = False
        self._complete_join(group)

    def _try_complete_join(self, group: ClassicGroup) -> None:
        if (
            group.is_(ClassicState.PREPARING_REBALANCE)
            and not group.initial_delay
            and group.all_members_joined()
        ):
            self._complete_join(group)

    def _cancel_timer(self, group: ClassicGroup) -> None:
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None

    def _complete_join(self, group: ClassicGroup) -> None:
        """Kafka's onCompleteJoin: drop who did not rejoin, start the next generation and
        answer every waiting JoinGroup (the leader gets the members' metadata)."""
        if not group.is_(ClassicState.PREPARING_REBALANCE):
            return
        self._cancel_timer(group)
        group.initial_delay = False
        # Kafka's completeClassicGroupJoin: a dynamic member that did not rejoin is removed; a
        # static one stays (it is expected back, with its assignment) until its session ends
        for member in group.not_yet_rejoined():
            if member.group_instance_id is not None:
                continue
            log.info("group %s: member %s did not rejoin in time", group.group_id, member.member_id)
            group.remove(member.member_id)
        joined = [m.member_id for m in group.members.values() if m.awaiting_join]
        if group.members and not joined:
            # nobody rejoined: wait another rebalance timeout, while the sessions run out
            log.warning(
                "group %s could not complete rebalance because no members rejoined",
                group.group_id,
            )
            group.rebalance_timer = asyncio.get_running_loop().call_later(
                group.rebalance_timeout_ms / 1000, self._complete_join, group
            )
            return
        if group.leader_id not in joined and joined:
            group.leader_id = joined[0]  # the leader must be one who rejoined
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.transition(ClassicState.EMPTY)
            log.info("group %s: empty at generation %d", group.group_id, group.generation_id)
            self.runtime.spawn(self._store(group), f"storing group {group.group_id}")
            return
        group.protocol_name = group.select_protocol()
        group.transition(ClassicState.COMPLETING_REBALANCE)
        now = self.clock()
        group.sync_deadline = now + group.rebalance_timeout_ms / 1000
        group.pending_sync = set(group.members)
        log.info(
            "group %s: generation %d with %d members, protocol %s, leader %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
            group.leader_id,
        )
        for member in group.members.values():
            member.is_new = False
            member.deadline = now + member.session_timeout_ms / 1000
            _resolve_join(member, self._join_result(group, member))

    def _remove_member(self, group: ClassicGroup, member: ClassicMember, reason: str) -> None:
        log.info("group %s: removing member %s (%s)", group.group_id, member.member_id, reason)
        _resolve_join(member, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id))
        _resolve_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.is_(ClassicState.STABLE, ClassicState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, reason)
        elif group.is_(ClassicState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    # --- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------------

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
    ) -> SyncResult:
        error = await group_ready(self.runtime, group_id)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            # the rebalance under way was lost with the partition: the member starts over at
            # JoinGroup (Kafka 3.9's answer; clients before the error do not expect it here)
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        if error != ErrorCode.NONE:
            return SyncResult(error)
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup) and group.members and self.consumer_side:
            return await self.consumer_side.classic_sync(
                group, member_id, group_instance_id, generation_id, protocol_type, protocol_name
            )
        if not isinstance(group, ClassicGroup):
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_(ClassicState.DEAD):
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = group.validate_member(member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return SyncResult(error)
        if generation_id != group.generation_id:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        member = group.members[member_id]
        member.deadline = self.clock() + member.session_timeout_ms / 1000
        if group.is_(ClassicState.EMPTY):
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.is_(ClassicState.PREPARING_REBALANCE):
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        group.pending_sync.discard(member_id)
        if group.is_(ClassicState.STABLE):
            return SyncResult(
                ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
            )
        # CompletingRebalance: wait for the leader's assignment
        _resolve_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync_waiter = waiter
        if member_id == group.leader_id:
            await self._apply_assignment(group, assignments)
        return await waiter

    async def _apply_assignment(
        self, group: ClassicGroup, assignments: Mapping[str, bytes]
    ) -> None:
        generation = group.generation_id
        # the members take their assignments once they are durable (as Kafka): until then what
        # reads the group (a conversion to the consumer protocol) sees what they had
        had = {m.member_id: m.assignment for m in group.members.values()}
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        record = group.to_record()
        for member in group.members.values():
            member.assignment = had[member.member_id]
        key = records.GroupKey(group.group_id)
        value = records.encode_group_value(record)
        error = await append_group_records(self.runtime, group.group_id, [(key, value)])
        if not (group.is_(ClassicState.COMPLETING_REBALANCE) and group.generation_id == generation):
            return  # a rebalance started meanwhile; its waiters were answered
        if error != ErrorCode.NONE:
            for member in group.members.values():
                member.assignment = b""
                _resolve_sync(member, SyncResult(error))
            self._prepare_rebalance(group, f"storing the assignment failed: {error.name}")
            return
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        # (the sync deadline stays: a member of the generation that never syncs is removed
        # once it passes, in Stable too)
        group.transition(ClassicState.STABLE)
        now = self.clock()
        for member in group.members.values():
            member.deadline = now + member.session_timeout_ms / 1000
            _resolve_sync(
                member,
                SyncResult(
                    ErrorCode.NONE, group.protocol_type, group.protocol_name, member.assignment
                ),
            )
        log.info("group %s: generation %d is stable", group.group_id, generation)

    async def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        error = await group_ready(self.runtime, group_id)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            return ErrorCode.NONE  # as Kafka: answered blindly while the group loads
        if error != ErrorCode.NONE:
            return error
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup) and group.members and self.consumer_side:
            return self.consumer_side.classic_heartbeat(
                group, member_id, group_instance_id, generation_id
            )
        if not isinstance(group, ClassicGroup):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.is_(ClassicState.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_(ClassicState.EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = group.validate_member(member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member = group.members[member_id]
        member.deadline = self.clock() + member.session_timeout_ms / 1000
        if group.is_(ClassicState.PREPARING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    async def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove ``(member id, group instance id)`` pairs; (group error, one per member)."""
        error = await group_ready(self.runtime, group_id)
        if error != ErrorCode.NONE:
            return error, [error] * len(members)
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup) and group.members and self.consumer_side:
            return await self.consumer_side.classic_leave(group, members)
        if not isinstance(group, ClassicGroup):
            # as Kafka: each member unknown, the request itself fine (v0-v2 answer the member's)
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(members)
        if group.is_(ClassicState.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, [ErrorCode.COORDINATOR_NOT_AVAILABLE] * len(
                members
            )
        out = []
        for member_id, instance_id in members:
            if instance_id is not None:
                current = group.static_members.get(instance_id)
                if current is None:
                    out.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != current:
                    out.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                member_id = current
            if member_id in group.pending_members:
                group.pending_members.pop(member_id)
                self._try_complete_join(group)
                out.append(ErrorCode.NONE)
                continue
            member = group.members.get(member_id)
            if member is None:
                out.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            self._remove_member(group, member, "left the group")
            out.append(ErrorCode.NONE)
        return ErrorCode.NONE, out


def _resolve_join(member: ClassicMember, result: JoinResult) -> None:
    if member.join_waiter is not None and not member.join_waiter.done():
        member.join_waiter.set_result(result)


def _resolve_sync(member: ClassicMember, result: SyncResult) -> None:
    if member.sync_waiter is not None and not member.sync_waiter.done():
        member.sync_waiter.set_result(result)
