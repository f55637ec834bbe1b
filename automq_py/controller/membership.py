"""Changes to the cluster's state, as pure functions (image, arguments) -> records.

In the style of ``storage.metadata.control``: each function checks its request against the
metadata image and returns the records that make the change; the metadata manager persists them
and checks them again against a caught-up image when another broker committed first. So a
change is always judged against the latest state, whoever wrote it.

Changes the controller makes name the controller (:class:`ControllerRecord`) and are refused
unless the image says it still is the controller: a former controller, frozen while another took
over, can never undo what its successor decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from automq_py.controller.cluster_records import (
    BROKER_PREFIX,
    CONTROLLER_KEY,
    LEADERS_PREFIX,
    NO_LEADER,
    BrokerRegistration,
    ControllerRecord,
    TopicLeaders,
    broker_key,
    leaders_key,
)
from storage.metadata import records as rec
from storage.metadata.image import MetadataImage

Records = list[rec.Record]


class NotControllerError(Exception):
    """The broker asking is not (or no longer) the controller."""


class UnknownBrokerError(Exception):
    """A change names a broker that never registered."""


# -- reads -----------------------------------------------------------------------------------------


def brokers(image: MetadataImage) -> dict[int, BrokerRegistration]:
    """Every registered broker, by node id."""
    out = {}
    for key, value in image.kv.items():
        if key.startswith(BROKER_PREFIX):
            node_id = int(key[len(BROKER_PREFIX) :])
            out[node_id] = BrokerRegistration.decode(node_id, value)
    return dict(sorted(out.items()))


def broker(image: MetadataImage, node_id: int) -> BrokerRegistration | None:
    raw = image.kv.get(broker_key(node_id))
    return None if raw is None else BrokerRegistration.decode(node_id, raw)


def topic_leaders(image: MetadataImage, topic: str) -> TopicLeaders | None:
    raw = image.kv.get(leaders_key(topic))
    return None if raw is None else TopicLeaders.decode(raw)


def all_leaders(image: MetadataImage) -> dict[str, TopicLeaders]:
    """Every topic's leaders, by topic name."""
    return {
        key[len(LEADERS_PREFIX) :]: TopicLeaders.decode(value)
        for key, value in sorted(image.kv.items())
        if key.startswith(LEADERS_PREFIX)
    }


def controller(image: MetadataImage) -> ControllerRecord | None:
    raw = image.kv.get(CONTROLLER_KEY)
    return None if raw is None else ControllerRecord.decode(raw)


# -- brokers ---------------------------------------------------------------------------------------


def register_broker(image: MetadataImage, registration: BrokerRegistration) -> Records:
    """A (re)started broker: live, at its new incarnation (its node epoch)."""
    old = broker(image, registration.node_id)
    if old is not None and old.incarnation > registration.incarnation:
        raise NotControllerError(
            f"broker {registration.node_id}: incarnation {registration.incarnation} is older "
            f"than the registered {old.incarnation}"
        )
    fresh = replace(registration, fenced=False, shutting_down=False)
    return [rec.KVRecord(broker_key(registration.node_id), fresh.encode())]


def begin_shutdown(image: MetadataImage, node_id: int, incarnation: int) -> Records:
    """A broker stopping on SIGTERM: no new partitions for it; the controller moves its own."""
    old = _registered(image, node_id)
    if old.incarnation != incarnation or old.shutting_down:
        return []
    return [rec.KVRecord(broker_key(node_id), replace(old, shutting_down=True).encode())]


def fence_broker(
    image: MetadataImage, me: ControllerRecord, node_id: int, incarnation: int
) -> Records:
    """The controller fences a silent broker: it leads nothing more, and its node epoch moves on
    so that its stream metadata commits are refused (``NODE_FENCED``). A broker that registered a
    newer incarnation meanwhile is left alone."""
    check_controller(image, me)
    old = _registered(image, node_id)
    if old.incarnation != incarnation or old.fenced:
        return []
    records: Records = [rec.KVRecord(broker_key(node_id), replace(old, fenced=True).encode())]
    node = image.nodes.get(node_id)
    if node is not None and node.epoch == incarnation:
        records.append(rec.NodeRecord(node_id, node.epoch + 1, True))
    return records


# -- the controller --------------------------------------------------------------------------------


def claim_controller(image: MetadataImage, me: ControllerRecord) -> Records:
    """A broker that took the lease: from now on only its changes are accepted."""
    current = controller(image)
    if current is not None and current.epoch > me.epoch:
        raise NotControllerError(
            f"broker {me.node_id}: lease epoch {me.epoch} is older than broker "
            f"{current.node_id}'s {current.epoch}"
        )
    if current == me:
        return []
    return [rec.KVRecord(CONTROLLER_KEY, me.encode())]


def check_controller(image: MetadataImage, me: ControllerRecord) -> None:
    current = controller(image)
    if current != me:
        holder = "none" if current is None else f"broker {current.node_id} ({current.epoch})"
        raise NotControllerError(
            f"broker {me.node_id} (lease epoch {me.epoch}) is not the controller: {holder} is"
        )


# -- leaders ---------------------------------------------------------------------------------------


def set_new_topic_leaders(topic: str, leaders: Sequence[int]) -> Records:
    """Leaders of a topic being created, at leader epoch 0."""
    return [rec.KVRecord(leaders_key(topic), TopicLeaders.new(leaders).encode())]


def add_partition_leaders(image: MetadataImage, topic: str, leaders: Sequence[int]) -> Records:
    """Leaders of partitions added to ``topic`` (CreatePartitions)."""
    current = topic_leaders(image, topic) or TopicLeaders((), ())
    return [rec.KVRecord(leaders_key(topic), current.grown(leaders).encode())]


def drop_topic_leaders(image: MetadataImage, topic: str) -> Records:
    return [rec.RemoveKV(leaders_key(topic))] if leaders_key(topic) in image.kv else []


def move_leaders(
    image: MetadataImage,
    me: ControllerRecord | None,
    moves: Mapping[str, Mapping[int, int]],
) -> Records:
    """Lead these partitions (topic -> index -> node, ``NO_LEADER`` for offline) from their new
    brokers, each at a bumped leader epoch. ``me`` None: an administrator's move (reassignment,
    leader election) through any broker; otherwise the controller's, checked."""
    if me is not None:
        check_controller(image, me)
    live = {b.node_id for b in brokers(image).values() if b.live}
    records: Records = []
    for topic, changes in sorted(moves.items()):
        current = topic_leaders(image, topic)
        if current is None:
            continue  # deleted meanwhile
        valid = {
            index: node
            for index, node in changes.items()
            if 0 <= index < len(current.leaders) and (node == NO_LEADER or node in live)
        }
        if len(valid) != len(changes):
            unknown = sorted(set(changes.values()) - live - {NO_LEADER})
            if unknown:
                raise UnknownBrokerError(f"brokers {unknown} are not live")
        moved = current.moved(valid)
        if moved != current:
            records.append(rec.KVRecord(leaders_key(topic), moved.encode()))
    return records


def request_moves(
    image: MetadataImage,
    moves: Mapping[str, Mapping[int, int]],
    me: ControllerRecord | None = None,
) -> Records:
    """Record reassignments (topic -> index -> target broker, NO_LEADER to cancel one): each
    partition's leader hands it over once it has made most of its tail durable while still
    serving (:func:`complete_moves`), so the partition is unwritable only for what arrived
    meanwhile. A target that already leads the partition changes nothing. ``me`` None: an
    administrator's reassignment; otherwise the controller's (a rebalance), checked."""
    if me is not None:
        check_controller(image, me)
    live = {b.node_id for b in brokers(image).values() if b.live}
    unknown = sorted({n for c in moves.values() for n in c.values()} - live - {NO_LEADER})
    if unknown:
        raise UnknownBrokerError(f"brokers {unknown} are not live")
    records: Records = []
    for topic, changes in sorted(moves.items()):
        current = topic_leaders(image, topic)
        if current is None:
            continue
        valid = {i: n for i, n in changes.items() if 0 <= i < len(current.leaders)}
        updated = current.retargeted(valid)
        if updated != current:
            records.append(rec.KVRecord(leaders_key(topic), updated.encode()))
    return records


def complete_moves(
    image: MetadataImage, node_id: int, topic: str, moves: Mapping[int, int]
) -> Records:
    """The leader ``node_id`` hands these partitions of ``topic`` (index -> target) over, as
    the reassignments pending asked, in one record: a partition it no longer leads, or whose
    reassignment changed meanwhile, is left as it is; a target no longer live ends the
    reassignment where it is."""
    current = topic_leaders(image, topic)
    if current is None:
        return []
    moved: dict[int, int] = {}
    ended: dict[int, int] = {}
    for index, target in moves.items():
        if current.leader(index) != node_id or current.target(index) != target:
            continue
        registration = broker(image, target)
        if registration is None or not registration.live:
            ended[index] = NO_LEADER
        else:
            moved[index] = target
    if not moved and not ended:
        return []
    updated = current.retargeted(ended).moved(moved)
    return [rec.KVRecord(leaders_key(topic), updated.encode())]


def _registered(image: MetadataImage, node_id: int) -> BrokerRegistration:
    found = broker(image, node_id)
    if found is None:
        raise UnknownBrokerError(f"broker {node_id} is not registered")
    return found
