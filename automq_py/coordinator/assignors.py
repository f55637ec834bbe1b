"""Server-side partition assignors of Kafka's consumer group protocol (KIP-848).

In the new protocol the coordinator, not a group leader, computes each member's target
assignment; ``ConsumerGroupHeartbeat`` names the assignor (``group.consumer.assignors``, the first
being the default). These are pure functions: members and partition counts in, an assignment out.

``uniform`` (Kafka's ``UniformAssignor``)
    Balanced and sticky, so a rebalance moves as few partitions as it can: every moved partition
    is revoked from one consumer and must wait for it before the next one may fetch it.

    * Homogeneous subscriptions (every member subscribes to the same topics): each member gets
      ``floor(N/M)`` or ``ceil(N/M)`` partitions. A member keeps its current partitions up to its
      quota; the rest, and the partitions nobody owns, go round-robin to members under quota.
    * Heterogeneous subscriptions: current owners keep their partitions, unowned ones go to the
      least-loaded subscriber (most constrained topics first), then partitions move from their
      owner to the least-loaded subscriber while the owner has more than that member + 1.

``range`` (Kafka's server-side ``RangeAssignor``)
    Per topic, each subscriber gets ``floor(N/M)`` partitions and ``N % M`` of them one more,
    as the classic range assignor; sticky as Kafka's: in member id order, each keeps the lowest
    of its current partitions up to its share (one more while extra shares are left), and the
    rest go in ascending runs to the others in member id order, each up to its share, the
    first ones one more while extra shares are left. From nothing, the
    subscribers sorted by member id each get one contiguous range, the first ``N % M`` one
    partition more, and members subscribed to co-partitioned topics get the same partition
    numbers of each, which joins keyed on the partition rely on.

Members' racks are accepted but not used yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]
Assignment = dict[str, dict[str, frozenset[int]]]


class UnsupportedAssignorError(ValueError):
    """The group asked for an assignor this coordinator does not have."""


@dataclass(slots=True, frozen=True)
class MemberSpec:
    """What an assignor knows of one member."""

    member_id: str
    topics: frozenset[str]  # subscribed topic names that exist
    rack: str | None = None
    # its current target assignment: topic -> partitions
    current: Mapping[str, frozenset[int]] = field(default_factory=dict)


def assign(
    assignor: str, members: Sequence[MemberSpec], partitions: Mapping[str, int]
) -> Assignment:
    """The target assignment of ``members`` by the assignor named ``assignor``.

    ``partitions`` maps each existing topic to its partition count; subscribed topics missing from
    it are ignored. Every member appears in the result, possibly with no partitions.
    """
    try:
        run = _ASSIGNORS[assignor]
    except KeyError:
        raise UnsupportedAssignorError(
            f"unsupported assignor {assignor!r}; supported: {', '.join(ASSIGNORS)}"
        ) from None
    subscriptions = {
        m.member_id: frozenset(t for t in m.topics if t in partitions) for m in members
    }
    return run(members, subscriptions, partitions)


def _uniform(
    members: Sequence[MemberSpec],
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
) -> Assignment:
    if len(set(subscriptions.values())) <= 1:
        owners = _uniform_homogeneous(members, subscriptions, partitions)
    else:
        owners = _uniform_heterogeneous(members, subscriptions, partitions)
    return _to_assignment(subscriptions, owners.items())


def _uniform_homogeneous(
    members: Sequence[MemberSpec],
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
) -> dict[TopicPartition, str]:
    topics = next(iter(subscriptions.values()), frozenset())
    all_partitions = [(t, p) for t in sorted(topics) for p in range(partitions[t])]
    if not all_partitions:
        return {}
    min_quota, extra_slots = divmod(len(all_partitions), len(subscriptions))
    order = sorted(subscriptions)
    current = {m.member_id: _current_partitions(m, subscriptions, partitions) for m in members}

    owners: dict[TopicPartition, str] = {}
    counts = dict.fromkeys(order, 0)
    for member_id in order:
        kept = [tp for tp in current[member_id] if tp not in owners]
        quota = min_quota + (1 if extra_slots > 0 and len(kept) > min_quota else 0)
        extra_slots -= quota - min_quota
        for tp in kept[:quota]:
            owners[tp] = member_id
        counts[member_id] = min(len(kept), quota)

    pending = iter([tp for tp in all_partitions if tp not in owners])
    # round-robin, so a topic's unowned partitions spread over the members
    under_quota = [m for m in order if counts[m] < min_quota]
    while under_quota:
        for member_id in under_quota:
            owners[next(pending)] = member_id
            counts[member_id] += 1
        under_quota = [m for m in under_quota if counts[m] < min_quota]
    for member_id in order:
        if extra_slots == 0:
            break
        if counts[member_id] == min_quota:
            owners[next(pending)] = member_id
            extra_slots -= 1
    return owners


def _uniform_heterogeneous(
    members: Sequence[MemberSpec],
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
) -> dict[TopicPartition, str]:
    subscribers = _subscribers(subscriptions)
    load = dict.fromkeys(sorted(subscriptions), 0)

    def least_loaded(topic: str) -> str:
        return min(subscribers[topic], key=lambda m: (load[m], m))

    owners: dict[TopicPartition, str] = {}
    for member in sorted(members, key=lambda m: m.member_id):
        for tp in _current_partitions(member, subscriptions, partitions):
            if tp not in owners:
                owners[tp] = member.member_id
                load[member.member_id] += 1

    # topics with the fewest subscribers first: they have the fewest places to go
    for topic in sorted(subscribers, key=lambda t: (len(subscribers[t]), t)):
        for p in range(partitions[topic]):
            if (topic, p) not in owners:
                owner = owners[topic, p] = least_loaded(topic)
                load[owner] += 1

    # each move lowers the sum of squared loads, so this ends
    order = sorted(owners)
    moved = True
    while moved:
        moved = False
        for tp in order:
            owner, target = owners[tp], least_loaded(tp[0])
            if load[owner] > load[target] + 1:
                owners[tp] = target
                load[owner] -= 1
                load[target] += 1
                moved = True
    return owners


def _range(
    members: Sequence[MemberSpec],
    subscriptions: Mapping[str, frozenset[str]],
    partitions: Mapping[str, int],
) -> Assignment:
    current = {m.member_id: m.current for m in members}
    owners: list[tuple[TopicPartition, str]] = []
    for topic, member_ids in _subscribers(subscriptions).items():
        count = partitions[topic]
        quota, extra = divmod(count, len(member_ids))
        taken: set[int] = set()
        given: dict[str, list[int]] = {}
        # members that may take more: (member, partitions short of the share), in order
        unfilled: list[tuple[str, int]] = []
        for member_id in member_ids:
            had = sorted(
                p for p in current[member_id].get(topic, ()) if 0 <= p < count and p not in taken
            )
            keep = had[:quota]
            if len(had) > quota and extra > 0:
                keep = had[: quota + 1]
                extra -= 1
            else:
                unfilled.append((member_id, quota - len(keep)))
            given[member_id] = keep
            taken.update(keep)
        free = iter([p for p in range(count) if p not in taken])
        for member_id, missing in unfilled:
            if extra > 0:
                missing += 1
                extra -= 1
            given[member_id] += [next(free) for _ in range(missing)]
        owners.extend(((topic, p), m) for m in member_ids for p in given[m])
    return _to_assignment(subscriptions, owners)


def _subscribers(subscriptions: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
    """Topic -> its subscribers' member ids, sorted, for every topic someone subscribes to."""
    subscribers: dict[str, list[str]] = {}
    for member_id in sorted(subscriptions):
        for topic in subscriptions[member_id]:
            subscribers.setdefault(topic, []).append(member_id)
    return subscribers


def _current_partitions(
    member: MemberSpec, subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int]
) -> list[TopicPartition]:
    """The member's current partitions that it may still own, sorted."""
    topics = subscriptions[member.member_id]
    return sorted(
        (t, p)
        for t, ps in member.current.items()
        if t in topics
        for p in ps
        if 0 <= p < partitions[t]
    )


def _to_assignment(
    subscriptions: Mapping[str, frozenset[str]], owners: Iterable[tuple[TopicPartition, str]]
) -> Assignment:
    grouped: dict[str, dict[str, set[int]]] = {m: {} for m in subscriptions}
    for (topic, p), member_id in owners:
        grouped[member_id].setdefault(topic, set()).add(p)
    return {
        m: {t: frozenset(ps) for t, ps in sorted(topics.items())} for m, topics in grouped.items()
    }


_ASSIGNORS: dict[
    str,
    Callable[[Sequence[MemberSpec], Mapping[str, frozenset[str]], Mapping[str, int]], Assignment],
] = {"uniform": _uniform, "range": _range}

# the first is the default, as in Kafka's group.consumer.assignors
ASSIGNORS: tuple[str, ...] = tuple(_ASSIGNORS)
