"""A group moving between the classic and the consumer protocol while its members switch
``group.protocol`` one by one (KIP-848's online migration, ``group.consumer.migration.policy``).

* **Upgrade.** The first member of the consumer protocol to join a classic group of consumers
  turns it into a consumer-protocol group (:func:`upgraded`): each classic member stays, at the
  classic generation as its epoch, with the partitions of its last assignment as both its
  current and its target assignment. The joining member moves the group to a new epoch, and
  the classic members, told to rejoin by their next heartbeat, are assigned by the broker from
  then on (:meth:`ConsumerGroup.classic_join`).
* **Downgrade.** When the last member of the consumer protocol leaves and classic members are
  left, the group turns back into a classic one (:func:`downgraded`): Stable at the members'
  epoch as its generation, each member holding its target assignment, and a rebalance
  follows.

An empty group converts either way whatever the policy. Committed offsets are kept by group id
and are untouched by either conversion. The rules and messages are Kafka's
(GroupMetadataManager's validateOnlineUpgrade, convertToConsumerGroup, convertToClassicGroup).
"""

from __future__ import annotations

from collections.abc import Callable

from automq_py.coordinator.classic_group import (
    CONSUMER_PROTOCOL_TYPE,
    ClassicGroup,
    ClassicMember,
    ClassicState,
)
from automq_py.coordinator.consumer_group import (
    ConsumerGroup,
    ConsumerMember,
    MemberState,
    TopicId,
    TopicMetadata,
)
from automq_py.coordinator.consumer_protocol import (
    ConsumerProtocolError,
    parse_assignment,
    parse_subscription,
    serialize_assignment,
)
from automq_py.coordinator.records import ClassicMemberMetadata


class MigrationRefused(Exception):
    """The group cannot convert; the message is Kafka's (answered as GROUP_ID_NOT_FOUND)."""


def upgrade_refusal(group: ClassicGroup, enabled: bool, consumer_max_size: int) -> str | None:
    """Why the non-empty classic ``group`` may not become a consumer-protocol group, or None
    (Kafka's validateOnlineUpgrade)."""
    start = f"Cannot upgrade classic group {group.group_id} to consumer group because"
    if not enabled:
        return f"{start} online upgrade is disabled."
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return f"{start} the group does not use the consumer embedded protocol."
    if len(group.members) > consumer_max_size:
        return f"{start} the group size exceeds the consumer group maximum size."
    return None


def upgraded(
    group: ClassicGroup, resolve: Callable[[set[str]], TopicMetadata], now: float
) -> ConsumerGroup:
    """The consumer-protocol group the classic ``group`` becomes (Kafka's
    ConsumerGroup.fromClassicGroup); MigrationRefused when a member's embedded protocol does
    not parse or a custom assignor's user data is in its assignment."""
    start = f"Cannot upgrade classic group {group.group_id} to consumer group because"
    protocol = group.protocol_name
    parsed = []
    for m in group.members.values():
        # a group still in its first rebalance has no protocol chosen: each member's first
        embedded = m.metadata(protocol) if protocol else (m.protocols[0][1] if m.protocols else b"")
        try:
            subscription = parse_subscription(embedded)
            assignment = parse_assignment(m.assignment).partitions if m.assignment else {}
            if m.assignment and parse_assignment(m.assignment).user_data:
                raise MigrationRefused(
                    f"{start} an unsupported custom assignor is in use. Please refer to the "
                    "documentation or switch to a default assignor before re-attempting the "
                    "upgrade."
                )
        except ConsumerProtocolError:
            raise MigrationRefused(
                f"{start} the embedded consumer protocol is malformed."
            ) from None
        parsed.append((m, subscription, assignment))
    everything = resolve(
        {t for _, s, _ in parsed for t in s.topics} | {t for _, _, a in parsed for t in a}
    )
    epoch = group.generation_id
    members = []
    for m, subscription, assignment in parsed:
        members.append(
            ConsumerMember(
                m.member_id,
                m.group_instance_id,
                subscription.rack_id,
                m.client_id,
                m.client_host,
                epoch=epoch,
                previous_epoch=epoch,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                subscribed_names=frozenset(subscription.topics),
                state=MemberState.STABLE,
                assigned={
                    everything[t][0]: parts
                    for t, parts in assignment.items()
                    if t in everything and parts
                },
                deadline=now + m.session_timeout_ms / 1000,
                classic=ClassicMemberMetadata(m.session_timeout_ms, tuple(m.protocols)),
            )
        )
    subscribed = {t for m in members for t in m.subscribed_names}
    metadata = {t: v for t, v in everything.items() if t in subscribed}
    return ConsumerGroup.converted(group.group_id, epoch, members, metadata)


def downgrade_allowed(group: ConsumerGroup, enabled: bool, classic_max_size: int) -> bool:
    """Whether ``group``, all of whose members now speak the classic protocol, turns back into
    a classic group (Kafka's validateOnlineDowngradeWithFencedMembers)."""
    return group.all_classic() and enabled and len(group.members) <= classic_max_size


def downgraded(
    group: ConsumerGroup, name_of: Callable[[TopicId], str | None], now: float, now_ms: int
) -> ClassicGroup:
    """The classic group the consumer-protocol ``group`` becomes (Kafka's
    ClassicGroup.fromConsumerGroup): Stable at the members' epoch as its generation, each
    member with its target assignment, the protocol the members vote for."""
    classic = ClassicGroup(group.group_id, now_ms)
    # the epoch the members were at before the leave that moved the group on (Kafka converts
    # without that bump): a member there heartbeats into the rebalance and rejoins as usual,
    # one behind it is told ILLEGAL_GENERATION, and rejoins too
    classic.generation_id = max((m.epoch for m in group.members.values()), default=0)
    for m in group.members.values():
        assert m.classic is not None
        classic.add(
            ClassicMember(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.classic.session_timeout_ms,
                CONSUMER_PROTOCOL_TYPE,
                list(m.classic.protocols),
                deadline=now + m.classic.session_timeout_ms / 1000,
            )
        )
    classic.protocol_name = classic.select_protocol()
    for member_id, member in classic.members.items():
        try:
            version = parse_subscription(member.metadata(classic.protocol_name)).version
        except ConsumerProtocolError:
            version = 0
        named = [(name_of(t), parts) for t, parts in group.target.get(member_id, {}).items()]
        member.assignment = serialize_assignment(
            ((name, parts) for name, parts in named if name is not None), version
        )
    classic.transition(ClassicState.STABLE)
    return classic
