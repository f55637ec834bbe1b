"""Leader placement, failover and rebalance: pure planners, tested on plain data."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automq_py.controller.cluster_records import NO_LEADER, BrokerRegistration, TopicLeaders
from automq_py.controller.placement import (
    NoLiveBrokersError,
    leader_counts,
    leader_loads,
    place_new_partitions,
    plan_failover,
    plan_rebalance,
)

Leaders = dict[str, TopicLeaders]


def cluster(
    *node_ids: int, racks: Mapping[int, str] | None = None, fenced: Sequence[int] = ()
) -> list[BrokerRegistration]:
    racks = racks or {}
    return [
        BrokerRegistration(n, 1, f"b{n}", 9092, racks.get(n), fenced=n in fenced) for n in node_ids
    ]


def create(brokers: Sequence[BrokerRegistration], current: Leaders, topic: str, count: int) -> None:
    current[topic] = TopicLeaders.new(place_new_partitions(brokers, current, topic, count))


def applied(current: Leaders, changes: Mapping[str, Mapping[int, int]]) -> Leaders:
    return {t: tl.moved(changes.get(t, {})) for t, tl in current.items()}


def topic_counts(current: Leaders, topic: str) -> Counter[int]:
    return Counter(current[topic].leaders)


def spread(counts: Mapping[int, float]) -> float:
    return max(counts.values()) - min(counts.values())


# -- new partitions -------------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, 3, 6, 7, 50])
def test_a_new_topic_is_spread_evenly_over_the_brokers(partitions: int) -> None:
    brokers = cluster(1, 2, 3)
    leaders = place_new_partitions(brokers, {}, "orders", partitions)
    assert len(leaders) == partitions
    per_broker = Counter({n: 0 for n in (1, 2, 3)}) + Counter(leaders)
    assert set(per_broker) <= {1, 2, 3}
    assert spread({n: per_broker[n] for n in (1, 2, 3)}) <= 1


def test_topics_created_one_after_another_keep_overall_counts_within_one() -> None:
    brokers = cluster(1, 2, 3)
    current: Leaders = {}
    for topic, partitions in [("a", 1), ("b", 3), ("c", 6), ("d", 7), ("e", 50), ("f", 1)]:
        create(brokers, current, topic, partitions)
        assert spread(leader_counts(brokers, current)) <= 1
        per_broker = topic_counts(current, topic)
        assert max(per_broker.values()) - min(per_broker.get(n, 0) for n in (1, 2, 3)) <= 1


def test_single_partition_topics_from_the_same_image_land_on_every_broker() -> None:
    brokers = cluster(1, 2, 3)
    firsts = Counter(place_new_partitions(brokers, {}, f"topic-{i}", 1)[0] for i in range(30))
    assert set(firsts) == {1, 2, 3}
    assert min(firsts.values()) >= 5


def test_single_partition_topics_created_in_turn_are_counted_evenly() -> None:
    brokers = cluster(1, 2, 3)
    current: Leaders = {}
    for i in range(30):
        create(brokers, current, f"topic-{i}", 1)
    assert leader_counts(brokers, current) == {1: 10, 2: 10, 3: 10}


def test_consecutive_partitions_alternate_racks() -> None:
    brokers = cluster(1, 2, 3, 4, racks={1: "az1", 2: "az1", 3: "az2", 4: "az2"})
    rack = {b.node_id: b.rack for b in brokers}
    leaders = place_new_partitions(brokers, {}, "orders", 8)
    assert all(rack[a] != rack[b] for a, b in itertools.pairwise(leaders))
    assert Counter(leaders) == {1: 2, 2: 2, 3: 2, 4: 2}


def test_three_racks_are_taken_in_turn() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    brokers = cluster(*racks, racks=racks)
    leaders = place_new_partitions(brokers, {}, "orders", 12)
    for start in range(0, 12, 3):
        assert len({racks[n] for n in leaders[start : start + 3]}) == 3
    assert set(Counter(leaders).values()) == {2}


def test_unequal_racks_still_give_each_broker_its_share() -> None:
    racks = {1: "a", 2: "a", 3: "a", 4: "b"}
    leaders = place_new_partitions(cluster(1, 2, 3, 4, racks=racks), {}, "orders", 8)
    assert Counter(leaders) == {1: 2, 2: 2, 3: 2, 4: 2}


def test_create_partitions_extends_the_topic_evenly_and_keeps_racks_alternating() -> None:
    brokers = cluster(1, 2, 3, 4, racks={1: "az1", 2: "az1", 3: "az2", 4: "az2"})
    rack = {b.node_id: b.rack for b in brokers}
    current: Leaders = {}
    create(brokers, current, "orders", 3)
    more = place_new_partitions(brokers, current, "orders", 5, first_index=3)
    current["orders"] = current["orders"].grown(more)
    leaders = current["orders"].leaders
    assert Counter(leaders) == {1: 2, 2: 2, 3: 2, 4: 2}
    assert all(rack[a] != rack[b] for a, b in itertools.pairwise(leaders))


def test_fenced_and_shutting_down_brokers_lead_no_new_partition() -> None:
    brokers = [
        *cluster(1, 2, 3, fenced=[2]),
        BrokerRegistration(4, 1, "b4", 9092, None, False, True),
    ]
    leaders = place_new_partitions(brokers, {}, "orders", 10)
    assert set(leaders) == {1, 3}


def test_no_live_broker_is_an_error() -> None:
    with pytest.raises(NoLiveBrokersError, match="no live broker"):
        place_new_partitions(cluster(1, 2, fenced=[1, 2]), {}, "orders", 3)
    with pytest.raises(NoLiveBrokersError):
        place_new_partitions([], {}, "orders", 1)


def test_leader_counts_cover_live_brokers_only() -> None:
    brokers = cluster(1, 2, 3, fenced=[3])
    current = {"a": TopicLeaders.new([1, 1, 3, NO_LEADER, 7])}
    assert leader_counts(brokers, current) == {1: 2, 2: 0}
    assert leader_loads(brokers, current, {("a", 0): 5.0, ("a", 1): 1.0}) == {1: 6.0, 2: 0.0}


# -- failover -------------------------------------------------------------------------------------


def test_a_dead_brokers_partitions_are_shared_evenly_by_the_survivors() -> None:
    live = cluster(1, 2, 3)
    current: Leaders = {}
    for topic in ("a", "b", "c"):
        create(live, current, topic, 18)
    led_by_1 = {(t, i) for t, tl in current.items() for i, n in enumerate(tl.leaders) if n == 1}
    assert len(led_by_1) == 18

    brokers = cluster(1, 2, 3, fenced=[1])
    changes = plan_failover(brokers, current, gone=1)
    assert {(t, i) for t, moves in changes.items() for i in moves} == led_by_1
    assert Counter(n for moves in changes.values() for n in moves.values()) == {2: 9, 3: 9}
    assert leader_counts(brokers, applied(current, changes)) == {2: 27, 3: 27}


def test_failover_prefers_the_gone_brokers_rack_among_equally_loaded_survivors() -> None:
    racks = {1: "az1", 2: "az2", 3: "az1"}
    brokers = cluster(1, 2, 3, racks=racks, fenced=[1])
    current = {"a": TopicLeaders.new([1, 2, 3])}
    assert plan_failover(brokers, current, gone=1) == {"a": {0: 3}}


def test_failover_balance_comes_before_the_rack() -> None:
    racks = {1: "az1", 2: "az2", 3: "az1"}
    brokers = cluster(1, 2, 3, racks=racks, fenced=[1])
    current = {"a": TopicLeaders.new([1, 1, 3, 3, 3])}
    assert plan_failover(brokers, current, gone=1) == {"a": {0: 2, 1: 2}}


def test_offline_partitions_are_given_a_leader() -> None:
    brokers = cluster(1, 2)
    current = {"a": TopicLeaders.new([NO_LEADER, 1, NO_LEADER]), "b": TopicLeaders.new([2])}
    changes = plan_failover(brokers, current, gone=3)
    assert changes == {"a": {0: 1, 2: 2}}


def test_without_survivors_the_gone_brokers_partitions_go_offline() -> None:
    brokers = cluster(1, 2, fenced=[1, 2])
    current = {"a": TopicLeaders.new([1, 2, NO_LEADER])}
    assert plan_failover(brokers, current, gone=1) == {"a": {0: NO_LEADER}}


def test_weighted_failover_spreads_the_heavy_partitions() -> None:
    brokers = cluster(1, 2, 3, fenced=[1])
    current = {"a": TopicLeaders.new([1, 1, 1, 1])}
    weights = {("a", 0): 10.0, ("a", 1): 1.0, ("a", 2): 1.0, ("a", 3): 8.0}
    changes = plan_failover(brokers, current, gone=1, weights=weights)
    assert changes == {"a": {0: 2, 3: 3, 1: 3, 2: 3}}


# -- rebalance ------------------------------------------------------------------------------------


def test_a_joining_broker_gets_its_quarter_with_the_fewest_moves() -> None:
    current: Leaders = {}
    for topic in ("a", "b", "c"):
        create(cluster(1, 2, 3), current, topic, 18)
    brokers = cluster(1, 2, 3, 4)
    changes = plan_rebalance(brokers, current)
    moves = [n for m in changes.values() for n in m.values()]
    assert moves == [4] * 13
    after = leader_counts(brokers, applied(current, changes))
    assert after[4] == 13
    assert spread(after) <= 1
    # Each topic keeps close to a quarter on each broker.
    for topic in ("a", "b", "c"):
        assert spread(topic_counts(applied(current, changes), topic)) <= 2


def test_a_balanced_cluster_needs_no_move() -> None:
    brokers = cluster(1, 2, 3)
    current: Leaders = {}
    create(brokers, current, "a", 7)
    assert plan_rebalance(brokers, current) == {}


def test_rebalance_leaves_non_live_brokers_alone() -> None:
    brokers = cluster(1, 2, 3, fenced=[3])
    current = {"a": TopicLeaders.new([1, 1, 1, 1, 3, 3, 3, NO_LEADER])}
    assert plan_rebalance(brokers, current) == {"a": {0: 2, 1: 2}}


def test_weights_move_the_heavy_partition_not_the_many_light_ones() -> None:
    brokers = cluster(1, 2)
    current = {"a": TopicLeaders.new([1, 1, 1, 1, 1])}
    weights = {("a", 0): 4.0, ("a", 1): 1.0, ("a", 2): 1.0, ("a", 3): 1.0, ("a", 4): 1.0}
    assert plan_rebalance(brokers, current, weights) == {"a": {0: 2}}
    assert len(plan_rebalance(brokers, current)["a"]) == 2


def test_weights_can_make_an_uneven_count_balanced() -> None:
    brokers = cluster(1, 2)
    current = {"a": TopicLeaders.new([1, 2, 2, 2, 2])}
    weights = {("a", 0): 10.0, ("a", 1): 1.0, ("a", 2): 1.0, ("a", 3): 1.0, ("a", 4): 1.0}
    assert plan_rebalance(brokers, current, weights) == {}
    assert plan_rebalance(brokers, current) == {"a": {1: 1}}


def test_a_partition_without_a_weight_weighs_the_mean() -> None:
    brokers = cluster(1, 2)
    current = {"a": TopicLeaders.new([1, 1, 2])}
    weights = {("a", 0): 3.0, ("a", 2): 1.0}
    assert leader_loads(brokers, current, weights) == {1: 5.0, 2: 1.0}


def test_tolerance_and_max_moves_bound_the_plan() -> None:
    brokers = cluster(1, 2)
    current = {"a": TopicLeaders.new([1] * 10)}
    assert len(plan_rebalance(brokers, current, max_moves=2)["a"]) == 2
    weights = {("a", i): 1.0 for i in range(10)}
    current = {"a": TopicLeaders.new([1] * 6 + [2] * 4)}
    assert plan_rebalance(brokers, current, weights, tolerance=0.25) == {}
    assert plan_rebalance(brokers, current, weights) == {"a": {0: 2}}


def test_plans_do_not_depend_on_input_order() -> None:
    racks = {1: "x", 2: "y", 3: "x", 4: "y", 5: "x"}
    brokers = cluster(1, 2, 3, 4, 5, racks=racks, fenced=[5])
    current: Leaders = {}
    for i, n in enumerate([5, 9, 2, 14]):
        create(cluster(1, 2, 3, 5), current, f"t{i}", n)
    weights = {("t1", i): float(i) for i in range(9)}
    shuffled_brokers = list(reversed(brokers))
    shuffled = dict(reversed(list(current.items())))
    assert place_new_partitions(brokers, current, "new", 11) == place_new_partitions(
        shuffled_brokers, shuffled, "new", 11
    )
    assert plan_failover(brokers, current, 5, weights) == plan_failover(
        shuffled_brokers, shuffled, 5, dict(reversed(list(weights.items())))
    )
    assert plan_rebalance(brokers, current, weights) == plan_rebalance(
        shuffled_brokers, shuffled, weights
    )


# -- properties -----------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[BrokerRegistration], Leaders]:
    node_ids = draw(st.lists(st.integers(0, 20), min_size=1, max_size=6, unique=True))
    brokers = [
        BrokerRegistration(
            n,
            1,
            f"b{n}",
            9092,
            draw(st.sampled_from([None, "az1", "az2", "az3"])),
            fenced=draw(st.booleans()),
            shutting_down=draw(st.integers(0, 9)) == 0,
        )
        for n in node_ids
    ]
    leader = st.sampled_from([*node_ids, NO_LEADER])
    sizes = draw(st.lists(st.integers(1, 12), max_size=6))
    current = {
        f"t{i}": TopicLeaders.new(draw(st.lists(leader, min_size=n, max_size=n)))
        for i, n in enumerate(sizes)
    }
    return brokers, current


def partitions_led_by(current: Leaders, nodes: set[int]) -> set[tuple[str, int]]:
    return {(t, i) for t, tl in current.items() for i, n in enumerate(tl.leaders) if n in nodes}


def moved(changes: Mapping[str, Mapping[int, int]]) -> dict[tuple[str, int], int]:
    return {(t, i): n for t, m in changes.items() for i, n in m.items()}


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.integers(1, 40),
    st.randoms(use_true_random=False),
    st.lists(st.floats(0, 1e6), min_size=60, max_size=60),
)
def test_plans_name_live_brokers_and_cover_exactly_their_partitions(
    drawn: tuple[list[BrokerRegistration], Leaders],
    new_partitions: int,
    rnd: random.Random,
    rates: list[float],
) -> None:
    brokers, current = drawn
    live = {b.node_id for b in brokers if b.live}
    if not live:
        with pytest.raises(NoLiveBrokersError):
            place_new_partitions(brokers, current, "new", new_partitions)
        return

    placed = place_new_partitions(brokers, current, "new", new_partitions)
    assert len(placed) == new_partitions
    assert set(placed) <= live
    assert spread(Counter({n: 0 for n in live}) | Counter(placed)) <= 1
    current = {**current, "new": TopicLeaders.new(placed)}

    gone = rnd.choice(sorted(live))
    brokers = [replace(b, fenced=True) if b.node_id == gone else b for b in brokers]
    live.discard(gone)
    failover = plan_failover(brokers, current, gone)
    assert set(moved(failover)) == partitions_led_by(current, {gone, NO_LEADER} if live else {gone})
    assert set(moved(failover).values()) <= (live or {NO_LEADER})
    current = applied(current, failover)

    weights = dict(zip(sorted(partitions_led_by(current, live)), rates, strict=False))
    for plan in (plan_rebalance(brokers, current), plan_rebalance(brokers, current, weights)):
        assert set(moved(plan)) <= partitions_led_by(current, live)
        assert set(moved(plan).values()) <= live
        assert all(current[t].leader(i) != n for (t, i), n in moved(plan).items())

    rebalance = plan_rebalance(brokers, current)
    before = leader_counts(brokers, current)
    after = leader_counts(brokers, applied(current, rebalance))
    assert spread(after) <= 1 if live else after == {}
    # No wasted move: only partitions above the floor share leave a broker.
    floor = sum(after.values()) // max(len(live), 1)
    assert len(moved(rebalance)) <= sum(max(0, c - floor) for c in before.values())


def _greedy_by_partition(
    brokers: Sequence[BrokerRegistration],
    current: Leaders,
    max_moves: int | None,
    tolerance: float,
) -> dict[str, dict[int, int]]:
    """plan_rebalance for counts as it was, ranking every partition of the busiest broker for
    each move: the reference its topic-by-topic search must match move for move."""
    live = [b.node_id for b in brokers if b.live]
    if len(live) < 2:
        return {}
    led: dict[int, set[tuple[str, int]]] = {n: set() for n in live}
    by_topic: dict[int, Counter[str]] = {n: Counter() for n in live}
    for topic, leaders in current.items():
        for index, leader in enumerate(leaders.leaders):
            if leader in led:
                led[leader].add((topic, index))
                by_topic[leader][topic] += 1
    loads = {n: float(len(led[n])) for n in live}
    mean = sum(loads.values()) / len(live)
    band = tolerance * mean
    moved: dict[tuple[str, int], int] = {}
    original = {p: n for n, ps in led.items() for p in ps}
    while max_moves is None or len(moved) < max_moves:
        high = min(live, key=lambda n: (-loads[n], n))
        low = min(live, key=lambda n: (loads[n], n))
        if loads[high] - mean <= band and mean - loads[low] <= band:
            break
        gap = loads[high] - loads[low]
        ranked = (
            (abs(gap - 2) - gap, by_topic[low][p[0]] - by_topic[high][p[0]], p) for p in led[high]
        )
        loss, _, best = min(ranked, default=(0.0, 0, ("", 0)))
        if loss >= 0:
            break
        led[high].remove(best)
        led[low].add(best)
        by_topic[high][best[0]] -= 1
        by_topic[low][best[0]] += 1
        loads[high] -= 1
        loads[low] += 1
        if original[best] == low:
            del moved[best]
        else:
            moved[best] = low
    changes: dict[str, dict[int, int]] = {}
    for (topic, index), leader in sorted(moved.items()):
        changes.setdefault(topic, {})[index] = leader
    return changes


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.integers(2, 5),
    fenced=st.sets(st.integers(1, 5), max_size=2),
    topics=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=25), min_size=1, max_size=6),
    max_moves=st.none() | st.integers(0, 30),
    tolerance=st.sampled_from([0.0, 0.1, 0.25]),
)
def test_counts_are_rebalanced_move_for_move_as_by_ranking_every_partition(
    nodes: int,
    fenced: set[int],
    topics: list[list[int]],
    max_moves: int | None,
    tolerance: float,
) -> None:
    brokers = cluster(*range(1, nodes + 1), fenced=sorted(f for f in fenced if f <= nodes))
    current: Leaders = {
        f"t{n}": TopicLeaders.new([NO_LEADER if leader == 0 else leader for leader in leaders])
        for n, leaders in enumerate(topics)
    }
    assert plan_rebalance(brokers, current, max_moves=max_moves, tolerance=tolerance) == (
        _greedy_by_partition(brokers, current, max_moves, tolerance)
    )


def test_ten_thousand_partitions_of_one_broker_are_spread_over_three() -> None:
    """The case of two brokers joining one that leads everything (bench/cluster_many.py
    --join-rebalance): ~6,700 moves, each taking the lowest partition of the topic the busiest
    broker leads most more of."""
    brokers = cluster(0, 1, 2)
    current: Leaders = {f"many-{n:03d}": TopicLeaders.new([0] * 1000) for n in range(10)}
    changes = plan_rebalance(brokers, current)
    after = applied(current, changes)
    assert leader_counts(brokers, after) == {0: 3334, 1: 3333, 2: 3333}
    for topic in current:
        assert spread(topic_counts(after, topic)) <= 1
