"""KIP-848 consumer groups: heartbeats, target assignment and reconciliation (pure logic)."""

from __future__ import annotations

import dataclasses
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from automq_py.coordinator import records
from automq_py.coordinator.consumer_group import (
    ConsumerGroup,
    HeartbeatRequest,
    HeartbeatResult,
    Partitions,
    regex_problem,
)
from protocol.errors import ErrorCode

TOPIC_ID = uuid.UUID(int=1)
OTHER_ID = uuid.UUID(int=2)
TOPICS = {"t": (TOPIC_ID, 6), "u": (OTHER_ID, 2)}
ASSIGNORS = ("uniform", "range")
SESSION_MS = 45_000


def resolve(names: set[str]) -> dict[str, tuple[uuid.UUID, int]]:
    return {n: TOPICS[n] for n in names if n in TOPICS}


def beat(
    group: ConsumerGroup,
    member_id: str,
    epoch: int,
    *,
    topics: list[str] | None = None,
    regex: str | None = None,
    owned: Partitions | None = None,
    instance: str | None = None,
    assignor: str | None = None,
    now: float = 0.0,
    visible: list[str] | None = None,
    every_member_sees: bool = True,
) -> HeartbeatResult:
    return group.heartbeat(
        HeartbeatRequest(
            group_id=group.group_id,
            member_id=member_id,
            member_epoch=epoch,
            instance_id=instance,
            rack_id=None,
            rebalance_timeout_ms=60_000 if epoch == 0 else -1,
            subscribed_topic_names=topics,
            subscribed_topic_regex=regex,
            server_assignor=assignor,
            # a member joining owns nothing (Kafka requires the empty list)
            owned={} if owned is None and epoch == 0 else owned,
        ),
        now,
        resolve,
        sorted(TOPICS) if visible is None else visible,
        ASSIGNORS,
        SESSION_MS,
        1000,
        every_member_sees=every_member_sees,
    )


def parts(result: HeartbeatResult) -> set[int]:
    assert result.assignment is not None
    return set(result.assignment.get(TOPIC_ID, frozenset()))


def test_single_member_gets_everything_at_once() -> None:
    group = ConsumerGroup("g")
    r = beat(group, "a", 0, topics=["t"])
    assert r.error == ErrorCode.NONE and r.member_epoch == 1
    assert parts(r) == set(range(6))
    assert group.state == "Stable"


def test_second_member_waits_for_revocation_then_gets_its_share() -> None:
    group = ConsumerGroup("g")
    a = beat(group, "a", 0, topics=["t"])
    b = beat(group, "b", 0, topics=["t"])
    # b is at the new epoch but its partitions are still a's: it gets none yet
    assert b.member_epoch == 2 and parts(b) == set()
    assert group.state == "Reconciling"
    # a is told to keep only its share; its epoch stays until it lets go
    a2 = beat(group, "a", a.member_epoch)
    kept = parts(a2)
    assert len(kept) == 3 and a2.member_epoch == 1
    # still owning everything: nothing changes
    a3 = beat(group, "a", 1, owned={TOPIC_ID: frozenset(range(6))})
    assert a3.member_epoch == 1
    # a acknowledges the revocation
    a4 = beat(group, "a", 1, owned={TOPIC_ID: frozenset(kept)})
    assert a4.member_epoch == 2
    b2 = beat(group, "b", 2)
    assert parts(b2) == set(range(6)) - kept
    assert group.state == "Stable"


def test_a_regex_matches_whole_names_internal_topics_too() -> None:
    group = ConsumerGroup("g")
    offsets = uuid.UUID(int=3)
    TOPICS["__consumer_offsets"] = (offsets, 1)
    try:
        r = beat(group, "a", 0, regex="t|__consumer_.*", visible=[*sorted(TOPICS), "tt"])
        # as Kafka's broker resolves it: every topic it knows, whole names only (not "tt")
        assert group.subscribed_topic_names() == {"t", "__consumer_offsets"}
        assert r.assignment is not None and set(r.assignment) == {TOPIC_ID, offsets}
    finally:
        del TOPICS["__consumer_offsets"]


def test_a_regex_takes_in_a_topic_that_appears() -> None:
    group = ConsumerGroup("g")
    a = beat(group, "a", 0, regex="t", visible=["u"])
    assert a.member_epoch == 1 and a.assignment == {}
    # the topic appears: the group's subscriptions change, and the member gets it
    a2 = beat(group, "a", 1, visible=["t", "u"])
    assert a2.member_epoch == 2 and parts(a2) == set(range(6))
    assert group.subscribed_topic_names() == {"t"}  # OffsetDelete and expiry see it
    # it goes again (deleted, or the member may no longer DESCRIBE it)
    a3 = beat(group, "a", 2, visible=["u"])
    assert parts(a3) == set() and group.group_epoch == 3  # revoked: it lets go first
    assert beat(group, "a", 2, owned={}, visible=["u"]).member_epoch == 3


def test_with_an_authorizer_a_heartbeat_resolves_only_its_own_regex() -> None:
    group = ConsumerGroup("g")
    beat(group, "a", 0, regex="t|u", visible=["t", "u"], every_member_sees=False)
    # b may DESCRIBE only u: a's resolution is not redone with b's view
    beat(group, "b", 0, regex="t|u", visible=["u"], every_member_sees=False)
    assert group.members["a"].regex_topics == {"t", "u"}
    assert group.members["b"].regex_topics == {"u"}
    epoch = group.group_epoch
    beat(group, "a", group.members["a"].epoch, visible=["t", "u"], every_member_sees=False)
    beat(group, "b", group.members["b"].epoch, visible=["u"], every_member_sees=False)
    assert group.group_epoch == epoch  # no flapping between the members' views


def test_a_regex_kafka_would_refuse_is_invalid_regular_expression() -> None:
    """Kafka compiles a SubscribedTopicRegex with RE2/J and answers one it cannot compile
    INVALID_REGULAR_EXPRESSION, before the member joins; Python's ``re`` takes more (lookaround,
    backreferences, possessive quantifiers), which are refused as RE2/J refuses them."""
    refused = ("orders(", "(?=orders)x", "a(?<!b)", r"(a)\1", r"[a\1]", "(?>a)", "a++", "(?P=n)")
    for regex in refused:
        group = ConsumerGroup("g")
        r = beat(group, "a", 0, regex=regex)
        assert r.error == ErrorCode.INVALID_REGULAR_EXPRESSION, regex
        assert r.message is not None and r.message.startswith(f"SubscribedTopicRegex `{regex}`")
        assert not group.members
    for regex in (r"orders-.*", r"a\\1", r"[\]+]", "(?:a|b)+?", "(?i)T", "x{2}"):
        assert regex_problem(regex) is None, regex


@given(st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_any_regex_text_is_judged_without_an_error(regex: str) -> None:
    problem = regex_problem(regex)
    assert problem is None or isinstance(problem, str)


def test_a_member_one_epoch_behind_is_taken_back_only_saying_what_it_owns() -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid, in its words: an epoch ahead is
    fenced; the epoch before is taken (the answer that moved the member on was lost) only
    when the heartbeat lists owned partitions the member has, not when it lists none."""
    group = ConsumerGroup("g")
    beat(group, "a", 0, topics=["t"])
    a = group.members["a"]
    beat(group, "a", a.epoch, owned=dict(a.assigned))
    beat(group, "b", 0, topics=["t"])  # a new epoch: a gives half up, then moves to it
    for _ in range(3):
        for m in list(group.members.values()):
            beat(group, m.member_id, m.epoch, owned=dict(m.assigned))
    a = group.members["a"]
    assert a.epoch == a.previous_epoch + 1
    behind = a.previous_epoch
    assert beat(group, "a", behind, owned=dict(a.assigned)).error == ErrorCode.NONE
    fenced = beat(group, "a", behind)  # (owned: unchanged, so not listed)
    assert (fenced.error, fenced.message) == (
        ErrorCode.FENCED_MEMBER_EPOCH,
        f"The consumer group member has a smaller member epoch ({behind}) than the one known "
        f"by the group coordinator ({a.epoch}). The member must abandon all its partitions and "
        "rejoin.",
    )
    ahead = beat(group, "b", group.members["b"].epoch + 1)
    assert ahead.error == ErrorCode.FENCED_MEMBER_EPOCH
    assert ahead.message is not None and ahead.message.startswith(
        "The consumer group member has a greater member epoch"
    )
    unknown = beat(group, "nobody", 1)
    assert unknown.message == "Member nobody is not a member of group g."


def test_fencing_and_unknown_members() -> None:
    group = ConsumerGroup("g")
    beat(group, "a", 0, topics=["t"])
    assert beat(group, "a", 7).error == ErrorCode.FENCED_MEMBER_EPOCH
    assert beat(group, "nobody", 1).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert beat(group, "x", 0, topics=["t"], assignor="sticky").error == (
        ErrorCode.UNSUPPORTED_ASSIGNOR
    )
    assert beat(group, "x", 0).error == ErrorCode.INVALID_REQUEST  # no subscription
    assert group.validate_member_epoch("a", 1) == ErrorCode.NONE
    assert group.validate_member_epoch("a", 2) == ErrorCode.STALE_MEMBER_EPOCH
    assert group.validate_member_epoch("b", 1) == ErrorCode.UNKNOWN_MEMBER_ID


def test_leave_frees_partitions_and_bumps_the_epoch() -> None:
    group = ConsumerGroup("g")
    beat(group, "a", 0, topics=["t"])
    b = beat(group, "b", 0, topics=["t"])
    left = beat(group, "a", -1)
    assert left.error == ErrorCode.NONE and left.member_epoch == -1
    b2 = beat(group, "b", b.member_epoch)
    assert parts(b2) == set(range(6)) and b2.member_epoch == 3


def test_static_member_comes_back_with_its_assignment() -> None:
    group = ConsumerGroup("g")
    a = beat(group, "a1", 0, topics=["t"], instance="i")
    epoch = group.group_epoch
    assert beat(group, "a1", -2, instance="i").member_epoch == -2
    # someone else with the same instance id while it is away takes over, with no new epoch
    back = beat(group, "a2", 0, topics=["t"], instance="i")
    assert back.member_epoch == a.member_epoch and parts(back) == set(range(6))
    assert group.group_epoch == epoch
    # while the instance is active, another member cannot claim it
    assert beat(group, "a3", 0, topics=["t"], instance="i").error == (
        ErrorCode.UNRELEASED_INSTANCE_ID
    )


def test_session_expiry_and_revocation_timeout() -> None:
    group = ConsumerGroup("g")
    beat(group, "a", 0, topics=["t"], now=0)
    beat(group, "b", 0, topics=["t"], now=0)
    beat(group, "a", 1, now=1)  # a must revoke half within its rebalance timeout (60 s)
    assert group.expire_members(30) == []
    assert group.expire_members(45.5) == ["b"]  # b never heartbeated again
    assert group.expire_members(62) == ["a"]  # a never acknowledged the revocation


def test_new_partitions_make_a_new_target() -> None:
    group = ConsumerGroup("g")
    r = beat(group, "a", 0, topics=["t", "u"])
    assert r.assignment is not None and set(r.assignment[OTHER_ID]) == {0, 1}
    TOPICS["u"] = (OTHER_ID, 3)
    try:
        r2 = beat(group, "a", r.member_epoch)
        assert r2.member_epoch == r.member_epoch + 1
        assert r2.assignment is not None and set(r2.assignment[OTHER_ID]) == {0, 1, 2}
    finally:
        TOPICS["u"] = (OTHER_ID, 2)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["join", "leave", "beat"]))))
def test_no_partition_is_ever_owned_twice_and_the_group_converges(
    steps: list[tuple[str, str]],
) -> None:
    group = ConsumerGroup("g")
    epochs: dict[str, int] = {}
    owned: dict[str, Partitions] = {}

    def heartbeat(member: str) -> None:
        r = beat(group, member, epochs[member], owned=owned.get(member, {}))
        assert r.error == ErrorCode.NONE, r
        epochs[member] = r.member_epoch
        if r.assignment is not None:
            owned[member] = r.assignment  # the client lets go of what is gone at once

    for member, action in steps:
        if action == "join" and member not in epochs:
            r = beat(group, member, 0, topics=["t"])
            epochs[member], owned[member] = r.member_epoch, r.assignment or {}
        elif action == "leave" and member in epochs:
            beat(group, member, -1)
            del epochs[member], owned[member]
        elif member in epochs:
            heartbeat(member)
        # what members hold (or still revoke) never overlaps
        held: list[tuple[uuid.UUID, int]] = []
        for m in group.members.values():
            for source in (m.assigned, m.pending_revocation):
                held += [(t, p) for t, ps in source.items() for p in ps]
        assert len(held) == len(set(held))
    for _ in range(4):
        for member in sorted(epochs):
            heartbeat(member)
    if epochs:
        assert group.state == "Stable"
        everything = [p for o in owned.values() for p in o.get(TOPIC_ID, ())]
        assert sorted(everything) == list(range(6))


def _written(group: ConsumerGroup) -> list[tuple[str, int, bool]]:
    """What the next store writes, as (member, key version, tombstone); then stored."""
    entries = group.changed_records()
    group.stored(entries)
    return sorted(
        (key.member, key.version, value is None)
        for key, value in entries
        if isinstance(key, records.ConsumerMemberKey)
    )


def test_a_heartbeat_writes_only_what_changed_and_a_replay_rebuilds_the_group() -> None:
    group = ConsumerGroup("g")
    for member in ("a", "b", "c"):
        beat(group, member, 0, topics=["t"])
    first = _written(group)
    # every member's metadata (5) and current assignment (8), and each target (7)
    assert first == [(m, v, False) for m in "abc" for v in (5, 7, 8)]
    # once the members hold their targets, a heartbeat that changes nothing writes nothing;
    # one member's new subscription makes a new target: its metadata, and the targets that moved
    for _ in range(3):
        for m in list(group.members.values()):
            beat(group, m.member_id, m.epoch, owned=dict(m.assigned))
    assert group.state == "Stable"
    _written(group)
    epoch = group.members["c"].epoch
    beat(group, "c", epoch, owned=dict(group.members["c"].assigned))
    assert _written(group) == []
    beat(group, "c", epoch, topics=["t", "u"])
    written = _written(group)
    assert ("c", 5, False) in written and all(v == 7 or m == "c" for m, v, _ in written)
    # a member gone: its three records are tombstoned
    beat(group, "b", -1)
    assert [(m, v, t) for m, v, t in _written(group) if m == "b"] == [
        ("b", 5, True),
        ("b", 7, True),
        ("b", 8, True),
    ]

    # what was written, replayed in order, is the same group
    log: list[tuple[records.ConsumerMemberKey | records.TargetEpochKey, bytes | None]] = []
    fresh = ConsumerGroup("g")
    for member in ("a", "b", "c"):
        beat(fresh, member, 0, topics=["t"])
    beat(fresh, "b", -1)
    for key, value in fresh.changed_records():
        assert isinstance(key, (records.ConsumerMemberKey, records.TargetEpochKey))
        log.append((key, value))
    loaded = ConsumerGroup("g")
    for key, value in log:
        loaded.replay(key, value, records.decode_value(key, value), 100.0, SESSION_MS)
    assert set(loaded.members) == set(fresh.members) == {"a", "c"}
    for member_id, m in fresh.members.items():
        back = loaded.members[member_id]
        assert (back.epoch, back.previous_epoch, back.state) == (m.epoch, m.previous_epoch, m.state)
        assert (back.assigned, back.pending_revocation) == (m.assigned, m.pending_revocation)
        assert back.subscribed_names == m.subscribed_names
        assert back.deadline == 100.0 + SESSION_MS / 1000
    assert loaded.target == fresh.target
    assert loaded.assignment_epoch == fresh.assignment_epoch
    assert loaded.changed_records() == []


def loaded_from(group: ConsumerGroup, log: list[tuple[records.Key, bytes | None]]) -> ConsumerGroup:
    """The group a coordinator loads from ``group``'s records ``log``, at its epoch."""
    loaded = ConsumerGroup("g")
    loaded.group_epoch = group.group_epoch  # from the group's epoch record
    for key, value in log:
        assert isinstance(
            key, (records.ConsumerMemberKey, records.TargetEpochKey, records.RegexKey)
        )
        loaded.replay(key, value, records.decode_value(key, value), 0.0, SESSION_MS)
    return loaded


def test_partitions_added_while_the_group_was_elsewhere_are_assigned_once_loaded() -> None:
    """The log keeps the target, not the topics' partition counts: a group loaded by a new
    coordinator after its topic grew checks its target against the topics as they are now
    and assigns the new partitions (Kafka compares its stored metadata hash), while a load
    with nothing changed starts no rebalance."""
    group = ConsumerGroup("g")
    beat(group, "a", 0, topics=["t"])
    for _ in range(2):
        a = group.members["a"]
        beat(group, "a", a.epoch, owned=dict(a.assigned))
    log = group.changed_records()
    group.stored(log)

    unchanged = loaded_from(group, log)
    epoch = unchanged.group_epoch
    a = unchanged.members["a"]
    beat(unchanged, "a", a.epoch, owned=dict(a.assigned))
    assert unchanged.group_epoch == epoch

    grown = loaded_from(group, log)
    a = grown.members["a"]
    result = grown.heartbeat(
        HeartbeatRequest("g", "a", a.epoch, None, None, -1, None, None, None, dict(a.assigned)),
        0.0,
        lambda names: {"t": (TOPIC_ID, 9)} if "t" in names else {},
        sorted(TOPICS),
        ASSIGNORS,
        SESSION_MS,
        1000,
    )
    assert result.error == ErrorCode.NONE
    assert grown.group_epoch == epoch + 1
    assert grown.target["a"] == {TOPIC_ID: frozenset(range(9))}


def test_what_a_regex_matched_is_kept_so_a_loaded_group_does_not_rebalance() -> None:
    group = ConsumerGroup("g")
    beat(group, "a", 0, regex="t|u")
    beat(group, "b", 0, topics=["t"])
    for _ in range(3):
        for m in list(group.members.values()):
            beat(group, m.member_id, m.epoch, owned=dict(m.assigned))
    assert group.state == "Stable"
    log = group.changed_records()
    group.stored(log)
    regexes = [(k, v) for k, v in log if isinstance(k, records.RegexKey)]
    assert [k.regex for k, _ in regexes] == ["t|u"]
    assert records.decode_value(regexes[0][0], regexes[0][1]) == records.RegexValue(
        ("t", "u"), 0, 0
    )

    loaded = loaded_from(group, log)
    assert loaded.members["a"].regex_topics == frozenset({"t", "u"})
    epoch = loaded.group_epoch
    a = loaded.members["a"]
    r = beat(loaded, "a", a.epoch, owned=dict(a.assigned))
    # the same matches and topics: no new epoch, nothing to write
    assert r.error == ErrorCode.NONE and r.member_epoch == a.epoch
    assert loaded.group_epoch == epoch
    assert loaded.changed_records() == []
    # a member that leaves takes its regex's record with it
    beat(group, "a", -1)
    gone = [(k, v) for k, v in group.changed_records() if isinstance(k, records.RegexKey)]
    assert gone == [(records.RegexKey("g", "t|u"), None)]


def test_a_static_member_that_left_is_at_epoch_minus_2_in_the_log_too() -> None:
    """Kafka's consumerGroupStaticMemberGroupLeave keeps the member at epoch -2, a record of
    it written: a coordinator that loads the group afterwards still lets the instance back."""
    group = ConsumerGroup("g")
    beat(group, "a1", 0, topics=["t"], instance="i")
    group.changed_records()
    assert beat(group, "a1", -2, instance="i").error == ErrorCode.NONE
    assert group.members["a1"].epoch == -2 and group.state == "Reconciling"
    loaded = ConsumerGroup("g")
    for key, value in group.changed_records():
        if isinstance(key, records.ConsumerMemberKey):
            decoded = None if value is None else records.decode_value(key, value)
            loaded.replay(key, value, decoded, 0.0, SESSION_MS)
    assert loaded.members["a1"].epoch == -2 and loaded.members["a1"].left_temporarily
    back = beat(loaded, "a2", 0, topics=["t"], instance="i")
    assert back.error == ErrorCode.NONE and "a1" not in loaded.members


def test_a_static_member_s_heartbeat_is_checked_by_its_instance_id() -> None:
    """As Kafka's throwIfStaticMemberIsUnknown and throwIfInstanceIdIsFenced: an instance id
    nobody holds is UNKNOWN_MEMBER_ID, one another member now holds FENCED_INSTANCE_ID (the
    client stops, where it would join again as a new member)."""
    group = ConsumerGroup("g")
    first = beat(group, "a1", 0, topics=["t"], instance="i")
    assert beat(group, "a1", -2, instance="i").error == ErrorCode.NONE
    assert beat(group, "a2", 0, topics=["t"], instance="i").error == ErrorCode.NONE
    fenced = beat(group, "a1", first.member_epoch, instance="i")
    assert fenced.error == ErrorCode.FENCED_INSTANCE_ID
    assert fenced.message == "Static member a1 with instance id i was fenced by member a2."
    assert beat(group, "a1", -1, instance="i").error == ErrorCode.FENCED_INSTANCE_ID
    unknown = beat(group, "a1", 1, instance="nobody")
    assert unknown.error == ErrorCode.UNKNOWN_MEMBER_ID
    assert unknown.message == "Instance id nobody is unknown."


def test_a_member_joining_again_under_its_id_keeps_what_it_was_given() -> None:
    group = ConsumerGroup("g")
    joined = beat(group, "a", 0, topics=["t"])
    again = beat(group, "a", 0, topics=["t"])
    assert again.member_epoch == joined.member_epoch and parts(again) == set(range(6))
    assert set(group.members["a"].assigned[TOPIC_ID]) == set(range(6))


def test_a_heartbeat_is_checked_as_kafka_checks_it() -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid: INVALID_REQUEST with its
    messages, and UNSUPPORTED_ASSIGNOR naming the assignors there are."""
    join = HeartbeatRequest("g", "m", 0, None, None, 5000, ["t"], None, None, {})

    def answer(**changes: object) -> tuple[ErrorCode, str | None]:
        request = dataclasses.replace(join, **changes)  # type: ignore[arg-type]
        r = ConsumerGroup("g").heartbeat(request, 0.0, resolve, [], ASSIGNORS, SESSION_MS, 10)
        return r.error, r.message

    invalid = ErrorCode.INVALID_REQUEST
    assert answer(member_epoch=1, member_id=" ") == (invalid, "MemberId can't be empty.")
    assert answer(group_id="  ") == (invalid, "GroupId can't be empty.")
    assert answer(instance_id="") == (invalid, "InstanceId can't be empty.")
    assert answer(rack_id=" ") == (invalid, "RackId can't be empty.")
    first = "RebalanceTimeoutMs must be provided in first request."
    assert answer(rebalance_timeout_ms=-1) == (invalid, first)
    empty = "TopicPartitions must be empty when (re-)joining."
    assert answer(owned=None) == (invalid, empty)
    assert answer(owned={TOPIC_ID: frozenset({0})}) == (invalid, empty)
    assert answer(subscribed_topic_names=None) == (
        invalid,
        "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.",
    )
    assert answer(member_epoch=-2) == (invalid, "InstanceId can't be null.")
    assert answer(member_epoch=-3) == (invalid, "MemberEpoch is invalid.")
    assert answer(server_assignor="sticky") == (
        ErrorCode.UNSUPPORTED_ASSIGNOR,
        "ServerAssignor sticky is not supported. Supported assignors: uniform, range.",
    )
    # an empty subscription joins, with nothing to consume
    assert answer(subscribed_topic_names=[])[0] == ErrorCode.NONE


def test_the_group_uses_the_assignor_most_members_ask_for() -> None:
    """Kafka's computePreferredServerAssignor: the most asked for, the default (the first
    configured) when nobody asks."""
    group = ConsumerGroup("g")
    assert group.preferred_assignor(ASSIGNORS) == "uniform"
    beat(group, "a", 0, topics=["t"], assignor="range")
    assert group.preferred_assignor(ASSIGNORS) == "range"
    beat(group, "b", 0, topics=["t"], assignor="uniform")
    beat(group, "c", 0, topics=["t"], assignor="uniform")
    assert group.preferred_assignor(ASSIGNORS) == "uniform"
