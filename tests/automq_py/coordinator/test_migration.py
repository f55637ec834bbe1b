"""KIP-848's online migration, pure logic: classic members in a consumer-protocol group
(JoinGroup, SyncGroup, Heartbeat, LeaveGroup), a classic group of consumers turning into a
consumer-protocol group and back, and the embedded consumer protocol they exchange."""

from __future__ import annotations

import contextlib
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.coordinator import migration, records
from automq_py.coordinator.classic_group import ClassicGroup, ClassicMember, ClassicState
from automq_py.coordinator.consumer_group import (
    ClassicJoin,
    ConsumerGroup,
    MemberState,
)
from automq_py.coordinator.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    parse_assignment,
    parse_subscription,
    serialize_assignment,
)
from protocol.errors import ErrorCode
from tests.automq_py.coordinator.test_consumer_group import ASSIGNORS, TOPIC_ID, beat, resolve

SESSION_MS = 10_000
REBALANCE_MS = 60_000


def subscription(topics: list[str], owned: dict[str, list[int]] | None = None) -> bytes:
    """A ConsumerProtocolSubscription v1 (topics, no user data, owned partitions)."""
    out = struct.pack(">hi", 1, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1)
    owned = owned or {}
    out += struct.pack(">i", len(owned))
    for t, parts in owned.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(parts))
        out += b"".join(struct.pack(">i", p) for p in parts)
    return out


def join(
    group: ConsumerGroup,
    member_id: str,
    owned: dict[str, list[int]] | None = None,
    *,
    now: float = 0.0,
    protocols: tuple[str, ...] = ("range", "cooperative-sticky"),
    instance: str | None = None,
) -> tuple[ErrorCode, str, int]:
    meta = subscription(["t"], owned)
    answer = group.classic_join(
        ClassicJoin(
            member_id,
            instance,
            "client",
            "/127.0.0.1",
            SESSION_MS,
            REBALANCE_MS,
            "consumer",
            tuple((name, meta) for name in protocols),
            require_known_member_id=False,
        ),
        now,
        resolve,
        ASSIGNORS,
        max_size=10,
    )
    return answer.error, answer.member_id, answer.generation_id


def synced(group: ConsumerGroup, member_id: str, generation: int) -> set[int] | ErrorCode:
    answer = group.classic_sync(member_id, None, generation, "consumer", "range", 0.0)
    if answer.error != ErrorCode.NONE:
        return answer.error
    assert answer.assignment is not None
    return set(answer.assignment.get(TOPIC_ID, ()))


def classic_group(assignments: dict[str, list[int]], generation: int = 4) -> ClassicGroup:
    """A Stable classic group of consumers at ``generation``, each member assigned."""
    group = ClassicGroup("g", 0)
    for member_id, partitions in assignments.items():
        member = ClassicMember(
            member_id,
            None,
            "client",
            "/127.0.0.1",
            REBALANCE_MS,
            SESSION_MS,
            "consumer",
            [("range", subscription(["t"]))],
            serialize_assignment([("t", partitions)], 1),
        )
        group.add(member)
    group.generation_id = generation
    group.protocol_name = "range"
    group.transition(ClassicState.STABLE)
    return group


# --- the embedded consumer protocol -------------------------------------------------------------


def test_a_subscription_of_each_version_is_read() -> None:
    v0 = struct.pack(">hih", 0, 1, 1) + b"t" + struct.pack(">i", -1)
    assert parse_subscription(v0).topics == ("t",) and parse_subscription(v0).owned is None
    v1 = subscription(["t", "u"], {"t": [0, 2]})
    assert parse_subscription(v1).owned == {"t": frozenset({0, 2})}
    v3 = v1[:1] + b"\x03" + v1[2:] + struct.pack(">ih", 7, 2) + b"r1"
    found = parse_subscription(v3)
    assert (found.version, found.generation_id, found.rack_id) == (3, 7, "r1")
    with pytest.raises(ConsumerProtocolError):
        parse_subscription(struct.pack(">hi", 0, 5))


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10), st.frozensets(st.integers(0, 1000), min_size=1)
    ),
    st.integers(0, 3),
)
def test_an_assignment_round_trips(partitions: dict[str, frozenset[int]], version: int) -> None:
    data = serialize_assignment(partitions.items(), version)
    assert parse_assignment(data) == Assignment(version, partitions, None)


@given(st.binary(max_size=64))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    for parse in (parse_subscription, parse_assignment):
        with contextlib.suppress(ConsumerProtocolError):
            parse(data)


# --- classic members in a consumer-protocol group -----------------------------------------------


def test_a_classic_member_is_assigned_by_the_broker_beside_a_consumer_member() -> None:
    group = ConsumerGroup("g")
    first = beat(group, "c", 0, topics=["t"])
    assert len(first.assignment or {}) == 1
    error, member_id, generation = join(group, "")
    assert error == ErrorCode.NONE and member_id
    # its share is still held by the consumer member: it gets nothing yet, at the new epoch
    assert generation == group.group_epoch
    assert synced(group, member_id, generation) == set()
    assert group.members[member_id].state == MemberState.UNRELEASED_PARTITIONS
    # the consumer member gives up half and the classic one is told to rejoin for it
    kept = beat(group, "c", first.member_epoch, owned=first.assignment)
    assert kept.assignment is not None
    beat(group, "c", first.member_epoch, owned=kept.assignment)
    answer = group.classic_heartbeat(member_id, None, generation, 0.0)
    assert answer.error == ErrorCode.REBALANCE_IN_PROGRESS
    error, _, generation = join(group, member_id)
    got = synced(group, member_id, generation)
    assert isinstance(got, set) and len(got) == 3
    assert group.classic_heartbeat(member_id, None, generation, 0.0).error == ErrorCode.NONE
    assert group.state == "Stable"


def test_a_cooperative_classic_member_gives_up_what_it_lists_as_owned() -> None:
    group = ConsumerGroup("g")
    _, member_id, generation = join(group, "")
    assert synced(group, member_id, generation) == set(range(6))
    beat(group, "c", 0, topics=["t"])
    assert group.classic_heartbeat(member_id, None, generation, 0.0).error == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    # it still owns all six: it keeps three, and must give the others up first
    _, _, kept_generation = join(group, member_id, {"t": list(range(6))})
    assert kept_generation == generation
    assert group.members[member_id].state == MemberState.UNREVOKED_PARTITIONS
    kept = synced(group, member_id, kept_generation)
    assert isinstance(kept, set) and len(kept) == 3
    assert group.classic_heartbeat(member_id, None, generation, 0.0).error == (
        ErrorCode.REBALANCE_IN_PROGRESS
    )
    _, _, new_generation = join(group, member_id, {"t": sorted(kept)})
    assert new_generation == group.group_epoch
    assert group.members[member_id].state == MemberState.STABLE


def test_an_eager_classic_member_that_let_go_of_everything_goes_straight_on() -> None:
    group = ConsumerGroup("g")
    _, member_id, generation = join(group, "")
    beat(group, "c", 0, topics=["t"])
    # an eager client revokes everything before it rejoins: nothing to wait for
    _, _, new_generation = join(group, member_id, {})
    assert new_generation == group.group_epoch > generation
    assert group.members[member_id].state == MemberState.STABLE


def test_classic_requests_are_checked_as_kafka_checks_them() -> None:
    group = ConsumerGroup("g")
    beat(group, "c", 0, topics=["t"])
    _, member_id, generation = join(group, "")
    assert group.classic_heartbeat("nobody", None, 1, 0.0).error == ErrorCode.UNKNOWN_MEMBER_ID
    # a consumer-protocol member may not use the classic protocol's requests
    assert group.classic_heartbeat("c", None, 1, 0.0).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert group.classic_heartbeat(member_id, None, generation + 1, 0.0).error == (
        ErrorCode.ILLEGAL_GENERATION
    )
    answer = group.classic_sync(member_id, None, generation, "consumer", "roundrobin", 0.0)
    assert answer.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # a protocol no classic member has, or another protocol type
    error, _, _ = join(group, "", protocols=("roundrobin",))
    assert error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # commits: a classic member's generation is its epoch
    assert group.validate_member_epoch(member_id, generation + 1, 8) == ErrorCode.ILLEGAL_GENERATION
    assert group.validate_member_epoch(member_id, generation, 8) == ErrorCode.NONE
    assert group.validate_member_epoch("c", 1, 8) == ErrorCode.UNSUPPORTED_VERSION


def _alive(group: ConsumerGroup, member_id: str, generation: int, start: int, end: int) -> None:
    """Heartbeats of every member every 5 s from ``start`` to ``end``: sessions kept, and the
    consumer-protocol members let go of what they are to revoke."""
    for now in range(start, end, 5):
        group.classic_heartbeat(member_id, None, generation, float(now))
        for other in [m for m in group.members.values() if m.classic is None]:
            beat(group, other.member_id, other.epoch, owned=dict(other.assigned), now=float(now))


def test_a_classic_member_that_does_not_rejoin_or_sync_in_time_is_removed() -> None:
    group = ConsumerGroup("g")
    beat(group, "c", 0, topics=["t"], now=0.0)
    _, member_id, generation = join(group, "", now=0.0)
    # joined but never synced: its heartbeats keep its session, not its place
    _alive(group, member_id, generation, 5, 60)
    assert group.expire_members(REBALANCE_MS / 1000 - 1) == []
    assert group.expire_members(REBALANCE_MS / 1000) == [member_id]
    # synced, then told to rejoin, and never did
    _, member_id, generation = join(group, "", now=100.0)
    assert isinstance(synced(group, member_id, generation), set)
    beat(group, "d", 0, topics=["t"], now=100.0)
    answer = group.classic_heartbeat(member_id, None, generation, 100.0)
    assert answer.error == ErrorCode.REBALANCE_IN_PROGRESS
    _alive(group, member_id, generation, 105, 160)
    assert group.expire_members(100 + REBALANCE_MS / 1000 - 1) == []
    assert group.expire_members(100 + REBALANCE_MS / 1000) == [member_id]


def test_a_static_classic_member_is_known_by_its_instance() -> None:
    group = ConsumerGroup("g")
    beat(group, "c", 0, topics=["t"], instance="consumer-instance")
    _, first, generation = join(group, "", instance="a")
    assert first in group.members
    # a zombie with an id the instance no longer has is fenced; an unknown instance is unknown
    error, _, _ = join(group, "old-id", instance="a")
    assert error == ErrorCode.FENCED_INSTANCE_ID
    error, _, _ = join(group, "some-id", instance="b")
    assert error == ErrorCode.UNKNOWN_MEMBER_ID
    # the instance restarted (no member id): it takes the old member's place at epoch 0
    error, second, _ = join(group, "", instance="a")
    assert error == ErrorCode.NONE and second != first and first not in group.members
    assert group.static_members["a"] == second
    # a classic member takes the instance a consumer-protocol member holds, left or not: a
    # rolling downgrade (Kafka checks for a release only between two consumer-protocol members)
    holder = group.static_members["consumer-instance"]
    error, third, _ = join(group, "", instance="consumer-instance")
    assert error == ErrorCode.NONE and holder not in group.members
    assert group.static_members["consumer-instance"] == third
    assert group.members[third].classic is not None
    assert generation > 0


def test_a_classic_static_member_upgraded_to_the_consumer_protocol_takes_its_place() -> None:
    """A rolling upgrade of static members: the instance restarts with group.protocol=consumer
    while its classic member is still in the group (static members send no LeaveGroup). It
    takes the member's place and partitions at epoch 0, as Kafka's
    getOrMaybeSubscribeStaticConsumerGroupMember copies it; two consumer-protocol members
    still need the first to have left."""
    group = ConsumerGroup("g")
    beat(group, "c", 0, topics=["t"])
    _, classic_id, generation = join(group, "", instance="a")
    assert isinstance(synced(group, classic_id, generation), set)
    answer = beat(group, "upgraded", 0, topics=["t"], instance="a")
    assert answer.error == ErrorCode.NONE, answer
    assert classic_id not in group.members and group.static_members["a"] == "upgraded"
    member = group.members["upgraded"]
    assert member.classic is None and member.join_deadline is None
    answer = beat(group, "zombie", 0, topics=["t"], instance="a")
    assert answer.error == ErrorCode.UNRELEASED_INSTANCE_ID


def test_a_classic_leave_removes_the_member() -> None:
    group = ConsumerGroup("g")
    beat(group, "c", 0, topics=["t"])
    _, member_id, _ = join(group, "")
    epoch = group.group_epoch
    assert group.classic_leave("nobody", None).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert group.classic_leave(member_id, None).error == ErrorCode.NONE
    assert member_id not in group.members and group.group_epoch == epoch + 1


def test_a_classic_member_is_kept_in_the_log_with_its_protocols() -> None:
    group = ConsumerGroup("g")
    beat(group, "c", 0, topics=["t"])
    _, member_id, generation = join(group, "")
    written = group.changed_records()
    group.stored(written)
    loaded = ConsumerGroup("g")
    for key, value in written:
        assert isinstance(key, records.ConsumerMemberKey | records.TargetEpochKey)
        loaded.replay(key, value, records.decode_value(key, value), 0.0, 45_000)
    member = loaded.members[member_id]
    assert member.classic == group.members[member_id].classic
    assert member.classic is not None and member.classic.session_timeout_ms == SESSION_MS
    # its own session timeout, not the group's
    assert member.deadline == SESSION_MS / 1000
    assert loaded.classic_heartbeat(member_id, None, generation, 0.0).error == ErrorCode.NONE


# --- conversions --------------------------------------------------------------------------------


def test_a_classic_group_becomes_a_consumer_group_with_its_members_and_partitions() -> None:
    classic = classic_group({"a": [0, 1, 2], "b": [3, 4, 5]}, generation=4)
    group = migration.upgraded(classic, resolve, 0.0)
    assert group.group_epoch == group.assignment_epoch == 4
    for member_id, partitions in (("a", {0, 1, 2}), ("b", {3, 4, 5})):
        member = group.members[member_id]
        assert (member.epoch, member.previous_epoch) == (4, 4)
        assert member.assigned == {TOPIC_ID: frozenset(partitions)}
        assert group.target[member_id] == member.assigned
        assert member.classic is not None and member.classic.session_timeout_ms == SESSION_MS
    assert group.state == "Stable"
    # its first store deletes the classic group's record and writes the whole group
    written = [key for key, _ in group.changed_records()]
    assert records.TargetEpochKey("g") in written
    assert group.replaces_classic
    # the members keep heartbeating at their generation until the group moves on
    assert group.classic_heartbeat("a", None, 4, 0.0).error == ErrorCode.NONE
    beat(group, "c", 0, topics=["t"])
    assert group.classic_heartbeat("a", None, 4, 0.0).error == ErrorCode.REBALANCE_IN_PROGRESS


def test_an_upgrade_is_refused_as_kafka_refuses_it() -> None:
    classic = classic_group({"a": [0]})
    assert migration.upgrade_refusal(classic, enabled=False, consumer_max_size=10) == (
        "Cannot upgrade classic group g to consumer group because online upgrade is disabled."
    )
    assert "exceeds" in (migration.upgrade_refusal(classic, True, 0) or "")
    assert migration.upgrade_refusal(classic, True, 10) is None
    classic.protocol_type = "connect"
    assert "embedded protocol" in (migration.upgrade_refusal(classic, True, 10) or "")
    custom = classic_group({"a": [0]})
    custom.members["a"].assignment = serialize_assignment([("t", [0])])[:-4] + struct.pack(
        ">i2s", 2, b"ud"
    )
    with pytest.raises(migration.MigrationRefused, match="custom assignor"):
        migration.upgraded(custom, resolve, 0.0)


def test_a_consumer_group_of_classic_members_becomes_a_classic_group() -> None:
    classic = classic_group({"a": [0, 1, 2], "b": [3, 4, 5]}, generation=4)
    group = migration.upgraded(classic, resolve, 0.0)
    joined = beat(group, "c", 0, topics=["t"])
    assert not migration.downgrade_allowed(group, True, 10)
    group.remove("c")  # it leaves (its partitions were never released to it)
    assert joined.member_epoch == 5 and group.group_epoch == 6
    assert migration.downgrade_allowed(group, True, 10)
    assert not migration.downgrade_allowed(group, False, 10)
    assert not migration.downgrade_allowed(group, True, 1)
    back = migration.downgraded(group, group.topic_names().get, 0.0, 0)
    # the members' generation, before the leave's epoch bump: they heartbeat into a rebalance
    assert back.generation_id == 4 and back.is_(ClassicState.STABLE)
    assert back.protocol_type == "consumer" and back.protocol_name == "range"
    assert set(back.members) == {"a", "b"}
    for member_id in ("a", "b"):
        got = parse_assignment(back.members[member_id].assignment).partitions
        names = group.topic_names()
        assert got == {names[t]: p for t, p in group.target[member_id].items()}
        assert back.members[member_id].session_timeout_ms == SESSION_MS
    gone = {key for key, value in group.tombstones() if value is None}
    assert records.ConsumerGroupKey("g") in gone and records.TargetEpochKey("g") in gone
    assert records.ConsumerMemberKey(records.MEMBER_METADATA_KEY_VERSION, "g", "c") in gone


def test_an_unknown_topic_in_a_classic_assignment_is_dropped() -> None:
    classic = classic_group({"a": [0]})
    classic.members["a"].assignment = serialize_assignment([("t", [0]), ("gone", [1])])
    group = migration.upgraded(classic, resolve, 0.0)
    assert group.members["a"].assigned == {TOPIC_ID: frozenset({0})}
    assert uuid.UUID(int=2) not in group.members["a"].assigned
