"""Which broker leads each partition: pure planners over the brokers and the current leaders.

Data lives in object storage, so a leader is only the broker that serves a partition: moving
one copies nothing, and the planners may move leaders freely, weighing balance alone. Nothing
here does I/O or reads a clock; the same inputs always give the same plan (ties are broken by
node id, topic name and partition index, never by dict order or Python's ``hash``). The
controller records a plan as ``TopicLeaders.moved`` / ``grown`` / ``new`` changes.

**Live brokers.** Only a live broker (:attr:`BrokerRegistration.live`: neither fenced nor
shutting down) is ever given a partition. A broker's *count* is the partitions it leads; its
*load* is that count or, given per-partition weights (``(topic, index) -> weight``, e.g. the
bytes-in rate), the sum of its partitions' weights. A partition missing from the weights
weighs the mean of the weights given (an unmeasured partition counts as an average one); an
empty mapping makes every partition weigh 1, i.e. plain counts.

**New partitions** (:func:`place_new_partitions`, CreateTopics and CreatePartitions): each goes
to the live broker that leads the fewest partitions of this topic, then, when brokers have
racks, one in the rack this topic has the fewest partitions in and not the previous
partition's rack (Kafka's rack-alternated order, applied to leaders), then the broker leading
the fewest partitions overall, counting those placed earlier in the same call. A topic of N
partitions on B brokers thus gives each floor or ceil of N/B, and overall counts that were
within 1 stay within 1 (racks permitting). Remaining ties go round the brokers from an offset
given by the CRC-32 of the topic name, so 1-partition topics planned from the same image do
not all land on the lowest node id.

**Failover** (:func:`plan_failover`): every partition led by a broker that is gone (fenced or
shut down) goes to the least-loaded live broker, heaviest partition first; a tie goes to a
broker in the gone broker's rack (its clients are likely in that zone). Offline partitions
(``NO_LEADER``) are placed the same way, so they come back. With no live broker left, the gone
broker's partitions go offline rather than stay on a broker that cannot serve them.

**Rebalance** (:func:`plan_rebalance`, a broker joined or the load drifted): greedy, one move
at a time: from the most-loaded live broker, the partition whose move best closes its gap to
the least-loaded one (for counts, one of a topic it leads more of than the other does), until
every broker is within ``tolerance`` (a fraction of the mean load) of the mean, no move narrows
the gap, or ``max_moves`` partitions have moved. With the default tolerance of 0, counts end
within 1 of each other. Partitions on brokers that are not live are left to failover.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from automq_py.controller.cluster_records import NO_LEADER, BrokerRegistration, TopicLeaders

Partition = tuple[str, int]
PartitionWeights = Mapping[Partition, float]
LeaderChanges = dict[str, dict[int, int]]
"""topic -> {partition index: new leader}: the shape ``TopicLeaders.moved`` takes per topic."""

_NO_RACK = object()  # the rack of "no previous partition": equal to no broker's rack


class NoLiveBrokersError(Exception):
    """No live broker may lead the new partitions: every broker is fenced or shutting down."""


def live_brokers(brokers: Sequence[BrokerRegistration]) -> list[BrokerRegistration]:
    """The brokers that may lead partitions, by node id."""
    return sorted((b for b in brokers if b.live), key=lambda b: b.node_id)


def leader_counts(
    brokers: Sequence[BrokerRegistration], current: Mapping[str, TopicLeaders]
) -> dict[int, int]:
    """Partitions each live broker leads (0 for one leading none); other leaders are not counted."""
    counts = {b.node_id: 0 for b in live_brokers(brokers)}
    for topic_leaders in current.values():
        for leader in topic_leaders.leaders:
            if leader in counts:
                counts[leader] += 1
    return counts


def leader_loads(
    brokers: Sequence[BrokerRegistration],
    current: Mapping[str, TopicLeaders],
    weights: PartitionWeights | None = None,
) -> dict[int, float]:
    """Each live broker's load: its count, or the sum of its partitions' weights."""
    weigh = _weigher(weights)
    loads = {b.node_id: 0.0 for b in live_brokers(brokers)}
    for topic, topic_leaders in current.items():
        for index, leader in enumerate(topic_leaders.leaders):
            if leader in loads:
                loads[leader] += weigh((topic, index))
    return loads


def place_new_partitions(
    brokers: Sequence[BrokerRegistration],
    current: Mapping[str, TopicLeaders],
    topic: str,
    count: int,
    first_index: int = 0,
) -> list[int]:
    """Leaders for partitions ``first_index .. first_index + count - 1`` of ``topic``.

    ``current`` may hold the topic's existing partitions (CreatePartitions): they count toward
    its spread, and the rack alternation carries on from partition ``first_index - 1``.
    """
    if count < 0 or first_index < 0:
        raise ValueError(f"cannot place {count} partitions from index {first_index}")
    live = live_brokers(brokers)
    if not live:
        raise NoLiveBrokersError(
            f"no live broker to lead {count} new partition(s) of topic {topic!r}: "
            f"all {len(brokers)} registered broker(s) are fenced or shutting down"
        )
    overall = leader_counts(live, current)
    existing = current.get(topic)
    mine: Counter[int] = Counter()
    rack_use: Counter[str | None] = Counter()
    rack_of = {b.node_id: b.rack for b in live}
    previous: int = NO_LEADER
    if existing is not None:
        mine.update(n for n in existing.leaders if n in rack_of)
        rack_use.update(rack_of[n] for n in existing.leaders if n in rack_of)
        previous = existing.leader(first_index - 1)
    offset = zlib.crc32(topic.encode()) % len(live)
    turn = {b.node_id: (position - offset) % len(live) for position, b in enumerate(live)}

    placed: list[int] = []
    for _ in range(count):
        after_rack = rack_of.get(previous, _NO_RACK)
        leader = min(
            (mine[n], rack_use[b.rack], b.rack == after_rack, overall[n], turn[n], n)
            for b in live
            for n in (b.node_id,)
        )[-1]
        placed.append(leader)
        mine[leader] += 1
        rack_use[rack_of[leader]] += 1
        overall[leader] += 1
        previous = leader
    return placed


def plan_failover(
    brokers: Sequence[BrokerRegistration],
    current: Mapping[str, TopicLeaders],
    gone: int,
    weights: PartitionWeights | None = None,
) -> LeaderChanges:
    """New leaders for the partitions led by ``gone`` and for offline ones (see the module)."""
    targets = [b for b in live_brokers(brokers) if b.node_id != gone]
    orphans = [
        (topic, index)
        for topic, topic_leaders in current.items()
        for index, leader in enumerate(topic_leaders.leaders)
        if leader == gone or (leader == NO_LEADER and targets)
    ]
    changes: LeaderChanges = {}
    if not targets:
        for topic, index in sorted(orphans):
            changes.setdefault(topic, {})[index] = NO_LEADER
        return changes

    weigh = _weigher(weights)
    loads = leader_loads(targets, current, weights)
    counts = leader_counts(targets, current)
    gone_rack = next((b.rack for b in brokers if b.node_id == gone), None)
    for topic, index in sorted(orphans, key=lambda p: (-weigh(p), p)):
        leader = min(
            (loads[n], counts[n], gone_rack is None or b.rack != gone_rack, n)
            for b in targets
            for n in (b.node_id,)
        )[-1]
        changes.setdefault(topic, {})[index] = leader
        loads[leader] += weigh((topic, index))
        counts[leader] += 1
    return changes


def plan_rebalance(
    brokers: Sequence[BrokerRegistration],
    current: Mapping[str, TopicLeaders],
    weights: PartitionWeights | None = None,
    max_moves: int | None = None,
    tolerance: float = 0.0,
) -> LeaderChanges:
    """Leader moves that even out the live brokers' loads (see the module); {} if balanced."""
    if tolerance < 0 or (max_moves is not None and max_moves < 0):
        raise ValueError(f"tolerance {tolerance} and max_moves {max_moves} must not be negative")
    live = [b.node_id for b in live_brokers(brokers)]
    if len(live) < 2:
        return {}
    weigh = _weigher(weights)
    loads = leader_loads(brokers, current, weights)
    led: dict[int, set[Partition]] = {node: set() for node in live}
    by_topic: dict[int, Counter[str]] = {node: Counter() for node in live}
    for topic, topic_leaders in current.items():
        for index, leader in enumerate(topic_leaders.leaders):
            if leader in led:
                led[leader].add((topic, index))
                by_topic[leader][topic] += 1
    mean = math.fsum(loads.values()) / len(live)
    band = tolerance * mean

    moved: dict[Partition, int] = {}
    original = {p: node for node, partitions in led.items() for p in partitions}
    # counts: every partition weighs 1, so the best move is the lowest partition of the topic
    # ``high`` leads most more of than ``low``: found topic by topic, not partition by partition
    # (10,000 partitions moving to joining brokers took seconds of the controller's loop)
    lowest = None if weights else _LowestIndex(led)
    while max_moves is None or len(moved) < max_moves:
        high = min(live, key=lambda n: (-loads[n], n))
        low = min(live, key=lambda n: (loads[n], n))
        if loads[high] - mean <= band and mean - loads[low] <= band:
            break
        gap = loads[high] - loads[low]

        if lowest is not None:
            if not led[high] or abs(gap - 2) - gap >= 0:
                break
            _, topic = min((by_topic[low][t] - n, t) for t, n in by_topic[high].items() if n > 0)
            best = (topic, lowest.pop(high, topic))
            lowest.add(low, best)
        else:
            # Best gain first; among equals, a topic ``high`` leads more of than ``low`` does.
            ranked = (
                (abs(gap - 2 * weigh(p)) - gap, by_topic[low][p[0]] - by_topic[high][p[0]], p)
                for p in led[high]
            )
            loss, _, best = min(ranked, default=(0.0, 0, ("", 0)))
            if loss >= 0:
                break
        led[high].remove(best)
        led[low].add(best)
        by_topic[high][best[0]] -= 1
        by_topic[low][best[0]] += 1
        loads[high] -= weigh(best)
        loads[low] += weigh(best)
        if original[best] == low:
            del moved[best]
        else:
            moved[best] = low

    changes: LeaderChanges = {}
    for (topic, index), leader in sorted(moved.items()):
        changes.setdefault(topic, {})[index] = leader
    return changes


class _LowestIndex:
    """Per broker and topic, the partitions it leads, lowest index first (heaps)."""

    def __init__(self, led: Mapping[int, set[Partition]]) -> None:
        self._heaps: dict[tuple[int, str], list[int]] = {}
        for node, partitions in led.items():
            for topic, index in partitions:
                self._heaps.setdefault((node, topic), []).append(index)
        for heap in self._heaps.values():
            heapq.heapify(heap)

    def pop(self, node: int, topic: str) -> int:
        return heapq.heappop(self._heaps[(node, topic)])

    def add(self, node: int, partition: Partition) -> None:
        heapq.heappush(self._heaps.setdefault((node, partition[0]), []), partition[1])


def _weigher(weights: PartitionWeights | None) -> Callable[[Partition], float]:
    """A partition's weight: as given, the mean of those given if missing, 1 without weights."""
    if not weights:
        return lambda _: 1.0
    if any(w < 0 or math.isnan(w) for w in weights.values()):
        raise ValueError("partition weights must be non-negative numbers")
    default = math.fsum(weights.values()) / len(weights)
    return lambda p: weights.get(p, default)
