"""The KIP-848 server-side assignors: every subscribed partition assigned once, to a subscriber;
uniform's balance and stickiness; range's contiguous layout."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automq_py.coordinator.assignors import (
    ASSIGNORS,
    Assignment,
    MemberSpec,
    UnsupportedAssignorError,
    assign,
)

TOPICS = ("a", "b", "c", "d")
MEMBER_IDS = ("m0", "m1", "m2", "m3", "m4", "m5", "m6")

partition_counts = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 12), max_size=4)
# "gone" is subscribed to but missing from the partition counts; currents may name partitions
# out of range and claim one partition for several members
member_specs = st.lists(
    st.builds(
        MemberSpec,
        member_id=st.sampled_from(MEMBER_IDS),
        topics=st.frozensets(st.sampled_from((*TOPICS, "gone"))),
        current=st.dictionaries(
            st.sampled_from((*TOPICS, "gone")), st.frozensets(st.integers(0, 14)), max_size=3
        ),
    ),
    max_size=7,
    unique_by=lambda m: m.member_id,
)


def owners(assignment: Assignment) -> dict[tuple[str, int], list[str]]:
    """Each assigned partition -> the members it is assigned to."""
    result: dict[tuple[str, int], list[str]] = {}
    for member_id, topics in assignment.items():
        for topic, ps in topics.items():
            for p in ps:
                result.setdefault((topic, p), []).append(member_id)
    return result


def counts(assignment: Assignment) -> dict[str, int]:
    return {m: sum(len(ps) for ps in topics.values()) for m, topics in assignment.items()}


def as_current(assignment: Assignment, member_id: str) -> Mapping[str, frozenset[int]]:
    return assignment.get(member_id, {})


@pytest.mark.parametrize("assignor", ASSIGNORS)
@given(members=member_specs, partitions=partition_counts)
def test_every_subscribed_partition_is_assigned_once_to_a_subscriber(
    assignor: str, members: list[MemberSpec], partitions: dict[str, int]
) -> None:
    result = assign(assignor, members, partitions)

    assert set(result) == {m.member_id for m in members}
    subscribed = {t for m in members for t in m.topics if t in partitions}
    expected = {(t, p) for t in subscribed for p in range(partitions[t])}
    assigned = owners(result)
    assert set(assigned) == expected
    topics_of = {m.member_id: m.topics for m in members}
    for (topic, _), member_ids in assigned.items():
        assert len(member_ids) == 1
        assert topic in topics_of[member_ids[0]]
    for topics in result.values():
        assert all(topics.values()), "empty topics are omitted"
    assert assign(assignor, members, partitions) == result


@given(
    member_ids=st.lists(st.sampled_from(MEMBER_IDS), min_size=1, unique=True),
    topics=st.frozensets(st.sampled_from(TOPICS)),
    partitions=partition_counts,
)
def test_uniform_is_balanced_for_homogeneous_subscriptions(
    member_ids: list[str], topics: frozenset[str], partitions: dict[str, int]
) -> None:
    result = assign("uniform", [MemberSpec(m, topics) for m in member_ids], partitions)

    loads = counts(result).values()
    assert max(loads) - min(loads) <= 1


@given(
    member_ids=st.lists(st.sampled_from(MEMBER_IDS), min_size=1, unique=True),
    before_ids=st.lists(st.sampled_from(MEMBER_IDS), min_size=1, unique=True),
    partitions=partition_counts,
)
def test_uniform_members_keep_their_partitions_up_to_quota(
    member_ids: list[str], before_ids: list[str], partitions: dict[str, int]
) -> None:
    topics = frozenset(partitions)
    before = assign("uniform", [MemberSpec(m, topics) for m in before_ids], partitions)
    members = [MemberSpec(m, topics, current=as_current(before, m)) for m in member_ids]

    after = assign("uniform", members, partitions)

    quota = sum(partitions.values()) // len(member_ids)
    for m in member_ids:
        kept = owners({m: before.get(m, {})}).keys() & owners({m: after[m]}).keys()
        assert len(kept) >= min(counts(before).get(m, 0), quota)


@given(members=member_specs, partitions=partition_counts)
def test_uniform_owners_have_at_most_one_more_than_any_other_subscriber(
    members: list[MemberSpec], partitions: dict[str, int]
) -> None:
    result = assign("uniform", members, partitions)

    load = counts(result)
    topics_of = {m.member_id: m.topics for m in members}
    for (topic, _), [owner] in owners(result).items():
        subscribers = [m for m, topics in topics_of.items() if topic in topics]
        assert load[owner] <= min(load[m] for m in subscribers) + 1


@given(members=member_specs, partitions=partition_counts)
def test_uniform_keeps_its_own_result(
    members: list[MemberSpec], partitions: dict[str, int]
) -> None:
    first = assign("uniform", members, partitions)
    again = [MemberSpec(m.member_id, m.topics, current=first[m.member_id]) for m in members]

    assert assign("uniform", again, partitions) == first


def test_uniform_join_moves_partitions_only_to_the_new_member() -> None:
    partitions = {"t": 6}
    old = [MemberSpec(m, frozenset({"t"})) for m in ("m1", "m2", "m3")]
    before = assign("uniform", old, partitions)
    assert sorted(counts(before).values()) == [2, 2, 2]

    joined = [MemberSpec(m.member_id, m.topics, current=before[m.member_id]) for m in old]
    joined.append(MemberSpec("m0", frozenset({"t"})))
    after = assign("uniform", joined, partitions)

    assert sorted(counts(after).values()) == [1, 1, 2, 2]
    for m in ("m1", "m2", "m3"):
        assert after[m]["t"] <= before[m]["t"]
    assert len(after["m0"]["t"]) == 1


def test_uniform_leave_moves_only_the_leavers_partitions() -> None:
    partitions = {"t": 6}
    members = [MemberSpec(m, frozenset({"t"})) for m in ("m1", "m2", "m3")]
    before = assign("uniform", members, partitions)

    stayed = [MemberSpec(m, frozenset({"t"}), current=before[m]) for m in ("m1", "m3")]
    after = assign("uniform", stayed, partitions)

    assert sorted(counts(after).values()) == [3, 3]
    for m in ("m1", "m3"):
        assert before[m]["t"] <= after[m]["t"]
        assert after[m]["t"] - before[m]["t"] <= before["m2"]["t"]


def test_uniform_spreads_a_topic_over_heterogeneous_subscribers() -> None:
    members = [
        MemberSpec("m1", frozenset({"a", "b"})),
        MemberSpec("m2", frozenset({"a"})),
        MemberSpec("m3", frozenset({"b"})),
    ]

    result = assign("uniform", members, {"a": 4, "b": 2})

    assert sorted(counts(result).values()) == [2, 2, 2]


def test_range_gives_contiguous_ranges_first_members_one_more() -> None:
    members = [MemberSpec(m, frozenset({"t"})) for m in ("m2", "m0", "m1")]

    result = assign("range", members, {"t": 7})

    assert result == {
        "m0": {"t": frozenset({0, 1, 2})},
        "m1": {"t": frozenset({3, 4})},
        "m2": {"t": frozenset({5, 6})},
    }


def test_range_gives_co_partitioned_topics_the_same_partitions() -> None:
    members = [MemberSpec(m, frozenset({"a", "b"})) for m in ("m0", "m1")]

    result = assign("range", members, {"a": 3, "b": 3})

    assert result["m0"] == {"a": frozenset({0, 1}), "b": frozenset({0, 1})}
    assert result["m1"] == {"a": frozenset({2}), "b": frozenset({2})}


def test_range_keeps_what_members_have_when_one_joins_or_leaves() -> None:
    first = [MemberSpec(m, frozenset({"t"})) for m in ("m0", "m1", "m2")]
    before = assign("range", first, {"t": 7})
    members = [MemberSpec(m, frozenset({"t"}), current=before[m]) for m in ("m0", "m1", "m2")]

    joined = assign("range", [*members, MemberSpec("m3", frozenset({"t"}))], {"t": 7})

    # one partition moves, where the classic range assignor moved four
    assert joined == {
        "m0": {"t": frozenset({0, 1})},
        "m1": {"t": frozenset({3, 4})},
        "m2": {"t": frozenset({5, 6})},
        "m3": {"t": frozenset({2})},
    }
    stayed = [MemberSpec(m, frozenset({"t"}), current=joined[m]) for m in ("m0", "m2", "m3")]
    left = assign("range", stayed, {"t": 7})
    # the leaver's partitions go in order: the extra share to the first member that may take
    # it (Kafka's step 4), the rest to the one short of its share
    assert left == {
        "m0": {"t": frozenset({0, 1, 3})},
        "m2": {"t": frozenset({5, 6})},
        "m3": {"t": frozenset({2, 4})},
    }


@given(
    member_ids=st.lists(st.sampled_from(MEMBER_IDS), min_size=1, unique=True),
    count=st.integers(0, 20),
    joiner=st.sampled_from(MEMBER_IDS),
)
def test_range_stays_balanced_and_keeps_each_member_s_share(
    member_ids: list[str], count: int, joiner: str
) -> None:
    before = assign("range", [MemberSpec(m, frozenset({"t"})) for m in member_ids], {"t": count})
    ids = sorted({*member_ids, joiner})
    members = [MemberSpec(m, frozenset({"t"}), current=before.get(m, {})) for m in ids]

    after = assign("range", members, {"t": count})

    sizes = sorted(counts(after).values())
    assert sizes[-1] - sizes[0] <= 1
    quota = count // len(ids)
    for m in member_ids:
        kept = after[m].get("t", frozenset()) & before[m].get("t", frozenset())
        assert len(kept) >= min(quota, len(before[m].get("t", ())))


def test_members_with_nothing_to_consume_get_an_empty_assignment() -> None:
    members = [MemberSpec("m0", frozenset({"gone"})), MemberSpec("m1", frozenset())]

    for assignor in ASSIGNORS:
        assert assign(assignor, members, {"t": 3}) == {"m0": {}, "m1": {}}


def test_uniform_is_the_default() -> None:
    assert ASSIGNORS == ("uniform", "range")


def test_unknown_assignor_is_refused() -> None:
    with pytest.raises(UnsupportedAssignorError, match="sticky"):
        assign("sticky", [MemberSpec("m0", frozenset({"t"}))], {"t": 1})
